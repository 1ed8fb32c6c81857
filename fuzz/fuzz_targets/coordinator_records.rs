//! Any bytes as a batch of `__consumer_offsets` read back at load time: the coordinator's
//! record decoding (keys, values of every version, tombstones) must never panic.
#![no_main]

use ferrolog::group::codec::{decode_batch, CoordinatorRecord};
use ferrolog_io::batch;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Skip the CRC so the fuzzer reaches the records; load checks it first.
    if let Ok(header) = batch::BatchHeader::parse(data) {
        if header.total_bytes() <= data.len() {
            let _ = decode_batch(&header, data, |_| {});
        }
    }
    // And the key/value split at every point, as single records.
    if data.len() > 1 {
        let cut = usize::from(data[0]) % data.len();
        let (key, value) = data[1..].split_at(cut.min(data.len() - 1));
        let _ = CoordinatorRecord::decode(key, Some(value));
        let _ = CoordinatorRecord::decode(key, None);
    }
});
