//! Any bytes as the transaction records ferrolog reads back: a `__transaction_state` key and
//! value (`ferrolog::txn::codec`, read at a coordinator's load), a segment's `.txnindex`
//! (`ferrolog_io::txn_index::decode`, read at open) and a batch taken for a transaction
//! marker (`ferrolog::producer_state::marker_of`, applied on every replica): errors or
//! "not one", never panics.
#![no_main]

use ferrolog::producer_state::marker_of;
use ferrolog::txn::codec;
use ferrolog_io::{batch, txn_index};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = codec::decode_key(data);
    let _ = codec::decode_value(data);
    // The index against a segment's offsets taken from the input itself.
    if data.len() >= 16 {
        let base = i64::from_be_bytes(data[..8].try_into().unwrap());
        let next = i64::from_be_bytes(data[8..16].try_into().unwrap());
        let _ = txn_index::decode(&data[16..], base, next);
    }
    let _ = txn_index::decode(data, 0, i64::MAX);
    // Skip the CRC so the fuzzer reaches the control record; appends check it first.
    if let Ok(header) = batch::BatchHeader::parse(data) {
        if header.total_bytes() <= data.len() {
            let _ = marker_of(&header, data);
        }
    }
});
