//! Any bytes a client can send as one request frame: header and body decoding must return a
//! request or an error (the connection closes), never panic or allocate without bound.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ferrolog::kafka::dispatch::decode(bytes::Bytes::copy_from_slice(data));
});
