//! Raft entries as Kafka record batches: the only form in which entries exist on disk.
//!
//! - A normal entry is one producer batch, stored byte for byte; its `partitionLeaderEpoch`
//!   is the Raft term of the entry and its `baseOffset` the Kafka offset the leader gave it.
//! - Raft's own entries (blank, membership) are control batches (attribute bit 5) holding one
//!   control record whose key is `(version 0, type)` with ferrolog's types
//!   [`CONTROL_TYPE_BLANK`] and [`CONTROL_TYPE_MEMBERSHIP`]. A broker's own normal entry, the
//!   log start every replica is to move to ([`CONTROL_TYPE_LOG_START`], [`log_start_batch`]),
//!   is a control batch of the same form. Kafka consumers skip control
//!   batches, as they skip transaction markers, so replicas' logs stay readable by clients.
//!   The types are outside Kafka's range (0-6) so no Kafka tool mistakes them for its own.
//!
//! Decoding reads bytes from disk and must never trust a length: every length is checked
//! against the bytes at hand.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::CommittedLeaderId;
use bytes::{BufMut, Bytes, BytesMut};
use ferrolog_io::batch::{self, BatchHeader};
use openraft::{BasicNode, EntryPayload, LogId, Membership, RaftTypeConfig};

use crate::PartitionRaft;

/// Control record type of a Raft blank entry (a new leader's first entry).
pub const CONTROL_TYPE_BLANK: i16 = 100;
/// Control record type of a Raft membership entry.
pub const CONTROL_TYPE_MEMBERSHIP: i16 = 101;
/// Control record type of a log start for every replica (a normal entry, see `log_start_of`).
pub const CONTROL_TYPE_LOG_START: i16 = 102;
/// Membership encoding version written in the control record's value.
const MEMBERSHIP_VERSION: u8 = 0;

/// One Kafka record batch as Raft application data: the bytes the producer sent.
#[derive(Clone, PartialEq, Eq)]
pub struct Batch(pub Bytes);

impl fmt::Debug for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Batch({} bytes)", self.0.len())
    }
}

impl fmt::Display for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A Raft log entry of a partition group.
pub type Entry = <PartitionRaft as RaftTypeConfig>::Entry;
/// Raft's id of an entry: (term, index).
pub type EntryLogId = LogId<CommittedLeaderId>;

/// Why stored bytes are not an entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The batch header does not parse.
    #[error("bad batch: {0}")]
    Batch(#[from] batch::BatchError),
    /// The batch's leader epoch is negative, so it was never written by Raft.
    #[error("batch at offset {0} has no leader epoch")]
    NoEpoch(i64),
    /// A ferrolog control record is cut short or malformed.
    #[error("bad Raft control record: {0}")]
    Control(&'static str),
}

/// The Raft term stored in a batch's `partitionLeaderEpoch`.
pub fn term_of(header: &BatchHeader) -> Result<u64, DecodeError> {
    u64::try_from(header.partition_leader_epoch)
        .map_err(|_| DecodeError::NoEpoch(header.base_offset))
}

/// The Kafka leader epoch for a Raft term. Terms beyond `i32::MAX` would take ~68 years of one
/// election per second; reaching one is a bug.
pub fn epoch_of(term: u64) -> i32 {
    i32::try_from(term).expect("Raft term fits Kafka's leader epoch")
}

/// The bytes to store for `entry`; `timestamp_ms` stamps control batches.
pub fn encode(entry: &Entry, timestamp_ms: i64) -> BytesMut {
    match &entry.payload {
        EntryPayload::Normal(batch) => BytesMut::from(&batch.0[..]),
        EntryPayload::Blank => control_batch(CONTROL_TYPE_BLANK, &[], timestamp_ms),
        EntryPayload::Membership(m) => {
            control_batch(CONTROL_TYPE_MEMBERSHIP, &encode_membership(m), timestamp_ms)
        }
    }
}

/// The entry at `index` stored as `bytes`, which hold exactly one batch.
pub fn decode(index: u64, bytes: Bytes) -> Result<Entry, DecodeError> {
    let header = BatchHeader::parse(&bytes)?;
    let log_id = LogId::new(CommittedLeaderId::new(term_of(&header)?), index);
    let payload = match control_record(&header, &bytes)? {
        Some((CONTROL_TYPE_BLANK, _)) => EntryPayload::Blank,
        Some((CONTROL_TYPE_MEMBERSHIP, value)) => {
            EntryPayload::Membership(decode_membership(value)?)
        }
        _ => EntryPayload::Normal(Batch(bytes)),
    };
    Ok(Entry { log_id, payload })
}

/// The batch of a log-start entry: every replica that applies it is to start its log at
/// `offset` (a batch boundary). Offset and epoch are set by the log on append.
pub fn log_start_batch(offset: i64, timestamp_ms: i64) -> Bytes {
    control_batch(CONTROL_TYPE_LOG_START, &offset.to_be_bytes(), timestamp_ms).freeze()
}

/// The offset a log-start entry's batch names, or `None` for any other batch.
pub fn log_start_of(bytes: &[u8]) -> Option<i64> {
    let header = BatchHeader::parse(bytes).ok()?;
    match control_record(&header, bytes) {
        Ok(Some((CONTROL_TYPE_LOG_START, value))) => {
            Some(i64::from_be_bytes(value.try_into().ok()?)).filter(|o| *o >= 0)
        }
        _ => None,
    }
}

/// A ferrolog control batch (no producer); offset and epoch are set by the log on append.
fn control_batch(control_type: i16, value: &[u8], timestamp_ms: i64) -> BytesMut {
    BytesMut::from(&batch::control_batch(control_type, value, timestamp_ms, None)[..])
}

/// `(type, value)` of a ferrolog Raft control record, or `None` for any other batch.
fn control_record<'a>(
    header: &BatchHeader,
    bytes: &'a [u8],
) -> Result<Option<(i16, &'a [u8])>, DecodeError> {
    match batch::control_record(header, bytes).map_err(DecodeError::Control)? {
        Some((t, value))
            if matches!(
                t,
                CONTROL_TYPE_BLANK | CONTROL_TYPE_MEMBERSHIP | CONTROL_TYPE_LOG_START
            ) =>
        {
            Ok(Some((t, value)))
        }
        _ => Ok(None),
    }
}

pub(crate) fn encode_membership(m: &Membership<u64, BasicNode>) -> Vec<u8> {
    let mut out = Vec::new();
    out.put_u8(MEMBERSHIP_VERSION);
    let configs = m.get_joint_config();
    out.put_u16(u16::try_from(configs.len()).expect("few joint configs"));
    for config in configs {
        out.put_u16(u16::try_from(config.len()).expect("voters fit u16"));
        for id in config {
            out.put_u64(*id);
        }
    }
    let nodes: Vec<_> = m.nodes().collect();
    out.put_u16(u16::try_from(nodes.len()).expect("nodes fit u16"));
    for (id, node) in nodes {
        out.put_u64(*id);
        out.put_u16(u16::try_from(node.addr.len()).expect("short node address"));
        out.put_slice(node.addr.as_bytes());
    }
    out
}

pub(crate) fn decode_membership(value: &[u8]) -> Result<Membership<u64, BasicNode>, DecodeError> {
    let mut r = Reader(value);
    if r.take(1)?[0] != MEMBERSHIP_VERSION {
        return Err(DecodeError::Control("unknown membership version"));
    }
    let config_count = r.u16()?;
    let mut configs = Vec::new();
    for _ in 0..config_count {
        let n = r.u16()?;
        let mut voters = BTreeSet::new();
        for _ in 0..n {
            voters.insert(r.u64()?);
        }
        configs.push(voters);
    }
    let node_count = r.u16()?;
    let mut nodes = BTreeMap::new();
    for _ in 0..node_count {
        let id = r.u64()?;
        let len = usize::from(r.u16()?);
        let addr = std::str::from_utf8(r.take(len)?)
            .map_err(|_| DecodeError::Control("node address is not UTF-8"))?;
        nodes.insert(id, BasicNode::new(addr));
    }
    if !r.0.is_empty() {
        return Err(DecodeError::Control("trailing bytes after membership"));
    }
    Membership::new(configs, nodes)
        .map_err(|_| DecodeError::Control("membership names voters without nodes"))
}

/// Zig-zag varint, as Kafka's record fields use.
#[cfg(test)]
pub(crate) fn put_varint(out: &mut BytesMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.put_u8((z as u8) | 0x80);
        z >>= 7;
    }
    out.put_u8(z as u8);
}

/// A bounds-checked cursor over untrusted bytes.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Control("record cut short"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.take(8)?;
        Ok(u64::from_be_bytes(b.try_into().expect("8 bytes")))
    }
}

#[cfg(test)]
/// A producer batch of `records` empty records, as a client would send it.
pub(crate) fn test_batch(records: i32) -> Batch {
    use bytes::BytesMut;
    let mut body = BytesMut::new();
    for i in 0..records {
        let mut r = BytesMut::new();
        r.put_i8(0);
        put_varint(&mut r, 0); // timestamp delta
        put_varint(&mut r, i64::from(i)); // offset delta
        put_varint(&mut r, -1); // no key
        put_varint(&mut r, -1); // no value
        put_varint(&mut r, 0); // no headers
        put_varint(&mut body, r.len() as i64);
        body.put_slice(&r);
    }
    let mut b = BytesMut::new();
    b.put_i64(0);
    b.put_i32(0);
    b.put_i32(-1);
    b.put_i8(2);
    b.put_u32(0);
    b.put_i16(0);
    b.put_i32(records - 1);
    b.put_i64(1_700_000_000_000);
    b.put_i64(1_700_000_000_000);
    b.put_i64(-1);
    b.put_i16(-1);
    b.put_i32(-1);
    b.put_i32(records);
    b.put_slice(&body);
    let len = (b.len() - 12) as i32;
    b[8..12].copy_from_slice(&len.to_be_bytes());
    let crc = batch::compute_crc(&b);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    Batch(b.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(entry: &Entry, offset: i64) -> Bytes {
        let mut b = encode(entry, 1_700_000_000_000);
        batch::set_offset_and_epoch(&mut b, offset, epoch_of(entry.log_id.leader_id.term));
        b.freeze()
    }

    #[test]
    fn raft_entries_round_trip_as_valid_control_batches() {
        let members = Membership::new(
            vec![BTreeSet::from([1, 2, 3])],
            BTreeMap::from([
                (1, BasicNode::new("127.0.0.1:9093")),
                (2, BasicNode::new("127.0.0.1:9193")),
                (3, BasicNode::new("127.0.0.1:9293")),
                (4, BasicNode::new("127.0.0.1:9393")),
            ]),
        )
        .unwrap();
        for payload in [EntryPayload::Blank, EntryPayload::Membership(members)] {
            let entry = Entry {
                log_id: LogId::new(CommittedLeaderId::new(7), 42),
                payload,
            };
            let bytes = stored(&entry, 1000);
            let header = batch::verify(&bytes).expect("a valid Kafka batch");
            assert!(header.is_control());
            assert_eq!(header.partition_leader_epoch, 7);
            assert_eq!((header.base_offset, header.next_offset()), (1000, 1001));
            assert_eq!(decode(42, bytes).unwrap(), entry);
        }
    }

    #[test]
    fn producer_batches_and_foreign_control_batches_are_normal_entries() {
        let mut marker = control_batch(1, &[0, 0, 0, 0, 0, 0], 5); // a COMMIT marker's shape
        batch::set_offset_and_epoch(&mut marker, 9, 2);
        let marker = marker.freeze();
        let entry = decode(3, marker.clone()).unwrap();
        assert_eq!(entry.payload, EntryPayload::Normal(Batch(marker.clone())));
        assert_eq!(entry.log_id, LogId::new(CommittedLeaderId::new(2), 3));
        assert_eq!(log_start_of(&marker), None);
    }

    #[test]
    fn a_log_start_is_a_normal_entry_that_names_its_offset() {
        let mut stored = BytesMut::from(&log_start_batch(4096, 5)[..]);
        batch::set_offset_and_epoch(&mut stored, 9, 2); // as the log stores it
        let bytes = stored.freeze();
        batch::verify(&bytes).expect("a valid Kafka batch");
        assert_eq!(log_start_of(&bytes), Some(4096));
        let entry = decode(8, bytes.clone()).unwrap();
        assert_eq!(entry.payload, EntryPayload::Normal(Batch(bytes.clone())));
        for cut in [0, 20, bytes.len() - 1] {
            assert_eq!(log_start_of(&bytes[..cut]), None, "cut at {cut}");
        }
    }

    #[test]
    fn damaged_control_records_are_errors_not_panics() {
        let entry = Entry {
            log_id: LogId::new(CommittedLeaderId::new(1), 1),
            payload: EntryPayload::Membership(Membership::new_with_defaults(
                vec![BTreeSet::from([1])],
                [],
            )),
        };
        let bytes = stored(&entry, 0);
        for cut in batch::HEADER_BYTES..bytes.len() {
            let mut b = BytesMut::from(&bytes[..]);
            b.truncate(cut);
            let len = i32::try_from(cut - batch::LOG_OVERHEAD).unwrap();
            b[8..12].copy_from_slice(&len.to_be_bytes());
            // Either an error or (if the cut keeps a shorter valid prefix) some entry: never a panic.
            let _ = decode(1, b.freeze());
        }
        let EntryPayload::Membership(m) = &entry.payload else {
            unreachable!()
        };
        let value = encode_membership(m);
        for cut in 0..value.len() {
            assert!(decode_membership(&value[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = value.clone();
        long.push(0);
        assert!(decode_membership(&long).is_err());
    }
}
