//! Any bytes as a produced record batch (and as a batch read back from disk): header parsing,
//! CRC verification and the record walk, including decompression of all four codecs.
#![no_main]

use ferrolog::records::{validate, TimestampPolicy};
use ferrolog_io::batch;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = batch::BatchHeader::parse(data);
    // Skip the CRC so the fuzzer reaches the records; the broker checks it first.
    if let Ok(header) = batch::BatchHeader::parse(data) {
        if header.total_bytes() <= data.len() {
            let policy = TimestampPolicy {
                compacted: false,
                log_append_time: false,
                before_max_ms: i64::MAX,
                after_max_ms: i64::MAX,
                now_ms: 0,
            };
            let _ = validate(&header, &data[..header.total_bytes()], &policy);
        }
    }
    let _ = batch::verify(data);
});
