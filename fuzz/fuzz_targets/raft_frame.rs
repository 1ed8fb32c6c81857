//! Any bytes as Raft traffic from a peer (`ferrolog_raft::wire`), as a Raft entry read
//! back from a partition's segments (`ferrolog_raft::entry::decode`) and as the partition
//! state a snapshot carries (`ferrolog::replication::raft::SnapshotState::decode`, which
//! reads the producer state too): errors, never panics.
#![no_main]

use bytes::Bytes;
use ferrolog_raft::{entry, wire};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = wire::frame_len(data);
    let _ = wire::decode(Bytes::copy_from_slice(data));
    let _ = entry::decode(7, Bytes::copy_from_slice(data));
    let _ = ferrolog::replication::raft::SnapshotState::decode(data);
});
