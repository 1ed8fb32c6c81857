//! The records the group coordinator keeps in `__consumer_offsets`, in Apache Kafka's layouts,
//! and the uncompressed v2 batches that carry them.
//!
//! A coordinator record's key starts with an int16 record type and its value with an int16
//! value version (Kafka's `group-coordinator/.../common/message/*.json`):
//! - type 0/1 `OffsetCommitKey` (group, topic, partition) -> `OffsetCommitValue` (written v3:
//!   offset, leader epoch, metadata, commit time; v0-v4 are read);
//! - type 2 `GroupMetadataKey` (group) -> `GroupMetadataValue` (written v3: a classic group's
//!   generation, protocol, leader and members with their subscriptions and assignments);
//! - type 3 `ConsumerGroupMetadataKey` (group) -> `ConsumerGroupMetadataValue` v0 (the epoch of
//!   a KIP-848 group);
//! - type 5 `ConsumerGroupMemberMetadataKey` (group, member) -> `ConsumerGroupMemberMetadataValue`
//!   v0 (a KIP-848 member's subscription and client);
//! - type 8 `ConsumerGroupCurrentMemberAssignmentKey` (group, member) ->
//!   `ConsumerGroupCurrentMemberAssignmentValue` v0 (its epochs, state and partitions).
//!
//! A null value is a tombstone: the offset, group or member is gone. Other record types
//! (Kafka's KIP-848 target-assignment records, share groups) are skipped when reading.
//!
//! Everything read here comes from disk, so every length is checked against the bytes at
//! hand before it is used; a malformed record is an error, never a panic (fuzz target
//! `coordinator_records`).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use ferrolog_io::batch::{self, BatchHeader, HEADER_BYTES, LOG_OVERHEAD};

/// Why bytes from `__consumer_offsets` do not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// A field runs past the end of its record.
    #[error("coordinator record truncated")]
    Truncated,
    /// A length or count that cannot be right.
    #[error("coordinator record has an invalid length {0}")]
    InvalidLength(i64),
    /// Not UTF-8 where Kafka writes a string.
    #[error("coordinator record has a string that is not UTF-8")]
    NotUtf8,
    /// A value version this broker does not know for its key type.
    #[error("unknown value version {version} for record type {record_type}")]
    UnknownVersion { record_type: i16, version: i16 },
    /// A compressed batch: the coordinator only writes uncompressed ones.
    #[error("compressed coordinator batch (codec {0})")]
    Compressed(i16),
}

/// A committed offset (`OffsetCommitValue`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetValue {
    pub offset: i64,
    /// -1: unknown.
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp_ms: i64,
}

/// One member of a classic group as persisted (`GroupMetadataValue.MemberMetadata`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberValue {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub session_timeout_ms: i32,
    pub subscription: Bytes,
    pub assignment: Bytes,
}

/// A classic group as persisted after each completed rebalance (`GroupMetadataValue`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupValue {
    pub protocol_type: String,
    pub generation: i32,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    /// When the group entered its current state; -1 if unknown.
    pub state_timestamp_ms: i64,
    pub members: Vec<MemberValue>,
}

/// A KIP-848 member as persisted (`ConsumerGroupMemberMetadataValue`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerMemberValue {
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topics: Vec<String>,
    pub subscribed_regex: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub server_assignor: Option<String>,
}

/// Partitions by topic id, as the assignment records list them.
pub type TopicPartitionsValue = Vec<(uuid::Uuid, Vec<i32>)>;

/// A KIP-848 member's reconciliation state (`ConsumerGroupCurrentMemberAssignmentValue`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerAssignmentValue {
    pub epoch: i32,
    pub previous_epoch: i32,
    /// Kafka's MemberState: 0 stable, 1 unrevoked partitions, 2 unreleased partitions.
    pub state: i8,
    pub assigned: TopicPartitionsValue,
    pub pending_revocation: TopicPartitionsValue,
}

/// One decoded coordinator record; `None` values are tombstones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoordinatorRecord {
    Offset {
        group: String,
        topic: String,
        partition: i32,
        value: Option<OffsetValue>,
    },
    Group {
        group: String,
        value: Option<GroupValue>,
    },
    ConsumerGroup {
        group: String,
        /// The group epoch.
        value: Option<i32>,
    },
    ConsumerMember {
        group: String,
        member: String,
        value: Option<ConsumerMemberValue>,
    },
    ConsumerAssignment {
        group: String,
        member: String,
        value: Option<ConsumerAssignmentValue>,
    },
    /// A record type ferrolog does not keep (Kafka's KIP-848 member records, share groups).
    Other { record_type: i16 },
}

const TYPE_OFFSET_COMMIT: i16 = 1;
const TYPE_GROUP_METADATA: i16 = 2;
const TYPE_CONSUMER_GROUP_METADATA: i16 = 3;
const TYPE_CONSUMER_MEMBER_METADATA: i16 = 5;
const TYPE_CONSUMER_MEMBER_ASSIGNMENT: i16 = 8;

impl CoordinatorRecord {
    /// The record's key and value bytes (value `None`: tombstone).
    pub fn encode(&self) -> (Bytes, Option<Bytes>) {
        let mut key = BytesMut::new();
        match self {
            CoordinatorRecord::Offset {
                group,
                topic,
                partition,
                value,
            } => {
                key.put_i16(TYPE_OFFSET_COMMIT);
                put_string(&mut key, group);
                put_string(&mut key, topic);
                key.put_i32(*partition);
                let value = value.as_ref().map(|v| {
                    let mut b = BytesMut::new();
                    b.put_i16(3);
                    b.put_i64(v.offset);
                    b.put_i32(v.leader_epoch);
                    put_string(&mut b, &v.metadata);
                    b.put_i64(v.commit_timestamp_ms);
                    b.freeze()
                });
                (key.freeze(), value)
            }
            CoordinatorRecord::Group { group, value } => {
                key.put_i16(TYPE_GROUP_METADATA);
                put_string(&mut key, group);
                let value = value.as_ref().map(|g| {
                    let mut b = BytesMut::new();
                    b.put_i16(3);
                    put_string(&mut b, &g.protocol_type);
                    b.put_i32(g.generation);
                    put_nullable_string(&mut b, g.protocol.as_deref());
                    put_nullable_string(&mut b, g.leader.as_deref());
                    b.put_i64(g.state_timestamp_ms);
                    b.put_i32(g.members.len() as i32);
                    for m in &g.members {
                        put_string(&mut b, &m.member_id);
                        put_nullable_string(&mut b, m.instance_id.as_deref());
                        put_string(&mut b, &m.client_id);
                        put_string(&mut b, &m.client_host);
                        b.put_i32(m.rebalance_timeout_ms);
                        b.put_i32(m.session_timeout_ms);
                        b.put_i32(m.subscription.len() as i32);
                        b.put_slice(&m.subscription);
                        b.put_i32(m.assignment.len() as i32);
                        b.put_slice(&m.assignment);
                    }
                    b.freeze()
                });
                (key.freeze(), value)
            }
            CoordinatorRecord::ConsumerGroup { group, value } => {
                key.put_i16(TYPE_CONSUMER_GROUP_METADATA);
                put_string(&mut key, group);
                let value = value.map(|epoch| {
                    let mut b = BytesMut::new();
                    b.put_i16(0);
                    b.put_i32(epoch);
                    b.put_u8(0); // no tagged fields
                    b.freeze()
                });
                (key.freeze(), value)
            }
            CoordinatorRecord::ConsumerMember {
                group,
                member,
                value,
            } => {
                key.put_i16(TYPE_CONSUMER_MEMBER_METADATA);
                put_string(&mut key, group);
                put_string(&mut key, member);
                let value = value.as_ref().map(|m| {
                    let mut b = BytesMut::new();
                    b.put_i16(0);
                    put_compact_nullable_string(&mut b, m.instance_id.as_deref());
                    put_compact_nullable_string(&mut b, m.rack_id.as_deref());
                    put_compact_nullable_string(&mut b, Some(&m.client_id));
                    put_compact_nullable_string(&mut b, Some(&m.client_host));
                    put_uvarint(&mut b, m.subscribed_topics.len() as u64 + 1);
                    for t in &m.subscribed_topics {
                        put_compact_nullable_string(&mut b, Some(t));
                    }
                    put_compact_nullable_string(&mut b, m.subscribed_regex.as_deref());
                    b.put_i32(m.rebalance_timeout_ms);
                    put_compact_nullable_string(&mut b, m.server_assignor.as_deref());
                    b.put_u8(0); // no tagged fields
                    b.freeze()
                });
                (key.freeze(), value)
            }
            CoordinatorRecord::ConsumerAssignment {
                group,
                member,
                value,
            } => {
                key.put_i16(TYPE_CONSUMER_MEMBER_ASSIGNMENT);
                put_string(&mut key, group);
                put_string(&mut key, member);
                let value = value.as_ref().map(|a| {
                    let mut b = BytesMut::new();
                    b.put_i16(0);
                    b.put_i32(a.epoch);
                    b.put_i32(a.previous_epoch);
                    b.put_i8(a.state);
                    put_topic_partitions(&mut b, &a.assigned);
                    put_topic_partitions(&mut b, &a.pending_revocation);
                    b.put_u8(0);
                    b.freeze()
                });
                (key.freeze(), value)
            }
            CoordinatorRecord::Other { .. } => unreachable!("ferrolog never writes other records"),
        }
    }

    /// Decodes one record's key and value.
    pub fn decode(key: &[u8], value: Option<&[u8]>) -> Result<CoordinatorRecord, CodecError> {
        let mut k = key;
        let record_type = get_i16(&mut k)?;
        match record_type {
            0 | TYPE_OFFSET_COMMIT => {
                let group = get_string(&mut k)?;
                let topic = get_string(&mut k)?;
                let partition = get_i32(&mut k)?;
                let value = value.map(decode_offset_value).transpose()?;
                Ok(CoordinatorRecord::Offset {
                    group,
                    topic,
                    partition,
                    value,
                })
            }
            TYPE_GROUP_METADATA => {
                let group = get_string(&mut k)?;
                let value = value.map(decode_group_value).transpose()?;
                Ok(CoordinatorRecord::Group { group, value })
            }
            TYPE_CONSUMER_GROUP_METADATA => {
                let group = get_string(&mut k)?;
                let value = value
                    .map(|mut v| {
                        let version = get_i16(&mut v)?;
                        if version != 0 {
                            return Err(CodecError::UnknownVersion {
                                record_type,
                                version,
                            });
                        }
                        let epoch = get_i32(&mut v)?;
                        skip_tagged_fields(&mut v)?;
                        Ok(epoch)
                    })
                    .transpose()?;
                Ok(CoordinatorRecord::ConsumerGroup { group, value })
            }
            TYPE_CONSUMER_MEMBER_METADATA => {
                let group = get_string(&mut k)?;
                let member = get_string(&mut k)?;
                let value = value
                    .map(|v| decode_member_value(record_type, v))
                    .transpose()?;
                Ok(CoordinatorRecord::ConsumerMember {
                    group,
                    member,
                    value,
                })
            }
            TYPE_CONSUMER_MEMBER_ASSIGNMENT => {
                let group = get_string(&mut k)?;
                let member = get_string(&mut k)?;
                let value = value
                    .map(|v| decode_assignment_value(record_type, v))
                    .transpose()?;
                Ok(CoordinatorRecord::ConsumerAssignment {
                    group,
                    member,
                    value,
                })
            }
            other => Ok(CoordinatorRecord::Other { record_type: other }),
        }
    }
}

fn decode_member_value(record_type: i16, mut v: &[u8]) -> Result<ConsumerMemberValue, CodecError> {
    let version = get_i16(&mut v)?;
    if version != 0 {
        return Err(CodecError::UnknownVersion {
            record_type,
            version,
        });
    }
    let instance_id = get_compact_nullable_string(&mut v)?;
    let rack_id = get_compact_nullable_string(&mut v)?;
    let client_id = get_compact_string(&mut v)?;
    let client_host = get_compact_string(&mut v)?;
    let count = get_compact_len(&mut v)?;
    let mut subscribed_topics = Vec::with_capacity(count.min(v.len()));
    for _ in 0..count {
        subscribed_topics.push(get_compact_string(&mut v)?);
    }
    let subscribed_regex = get_compact_nullable_string(&mut v)?;
    let rebalance_timeout_ms = get_i32(&mut v)?;
    let server_assignor = get_compact_nullable_string(&mut v)?;
    skip_tagged_fields(&mut v)?;
    Ok(ConsumerMemberValue {
        instance_id,
        rack_id,
        client_id,
        client_host,
        subscribed_topics,
        subscribed_regex,
        rebalance_timeout_ms,
        server_assignor,
    })
}

fn decode_assignment_value(
    record_type: i16,
    mut v: &[u8],
) -> Result<ConsumerAssignmentValue, CodecError> {
    let version = get_i16(&mut v)?;
    if version != 0 {
        return Err(CodecError::UnknownVersion {
            record_type,
            version,
        });
    }
    let epoch = get_i32(&mut v)?;
    let previous_epoch = get_i32(&mut v)?;
    let state = get_u8(&mut v)? as i8;
    let assigned = get_topic_partitions(&mut v)?;
    let pending_revocation = get_topic_partitions(&mut v)?;
    skip_tagged_fields(&mut v)?;
    Ok(ConsumerAssignmentValue {
        epoch,
        previous_epoch,
        state,
        assigned,
        pending_revocation,
    })
}

fn put_topic_partitions(b: &mut BytesMut, tps: &TopicPartitionsValue) {
    put_uvarint(b, tps.len() as u64 + 1);
    for (id, ps) in tps {
        b.put_slice(id.as_bytes());
        put_uvarint(b, ps.len() as u64 + 1);
        for p in ps {
            b.put_i32(*p);
        }
        b.put_u8(0);
    }
}

fn get_topic_partitions(v: &mut &[u8]) -> Result<TopicPartitionsValue, CodecError> {
    let count = get_compact_len(v)?;
    let mut out = Vec::with_capacity(count.min(v.len() / 18));
    for _ in 0..count {
        let id = uuid::Uuid::from_slice(take(v, 16)?).expect("16 bytes");
        let n = get_compact_len(v)?;
        let mut ps = Vec::with_capacity(n.min(v.len() / 4));
        for _ in 0..n {
            ps.push(get_i32(v)?);
        }
        skip_tagged_fields(v)?;
        out.push((id, ps));
    }
    Ok(out)
}

fn decode_offset_value(mut v: &[u8]) -> Result<OffsetValue, CodecError> {
    let version = get_i16(&mut v)?;
    let offset = get_i64(&mut v)?;
    let (leader_epoch, metadata, commit_timestamp_ms) = match version {
        0 => (-1, get_string(&mut v)?, get_i64(&mut v)?),
        1 => {
            let metadata = get_string(&mut v)?;
            let commit = get_i64(&mut v)?;
            let _expire = get_i64(&mut v)?;
            (-1, metadata, commit)
        }
        2 => (-1, get_string(&mut v)?, get_i64(&mut v)?),
        3 => {
            let epoch = get_i32(&mut v)?;
            (epoch, get_string(&mut v)?, get_i64(&mut v)?)
        }
        4 => {
            let epoch = get_i32(&mut v)?;
            (epoch, get_compact_string(&mut v)?, get_i64(&mut v)?)
        }
        version => {
            return Err(CodecError::UnknownVersion {
                record_type: TYPE_OFFSET_COMMIT,
                version,
            })
        }
    };
    Ok(OffsetValue {
        offset,
        leader_epoch,
        metadata,
        commit_timestamp_ms,
    })
}

fn decode_group_value(mut v: &[u8]) -> Result<GroupValue, CodecError> {
    let version = get_i16(&mut v)?;
    if !(0..=3).contains(&version) {
        return Err(CodecError::UnknownVersion {
            record_type: TYPE_GROUP_METADATA,
            version,
        });
    }
    let protocol_type = get_string(&mut v)?;
    let generation = get_i32(&mut v)?;
    let protocol = get_nullable_string(&mut v)?;
    let leader = get_nullable_string(&mut v)?;
    let state_timestamp_ms = if version >= 2 { get_i64(&mut v)? } else { -1 };
    let count = get_i32(&mut v)?;
    // Every member takes at least 18 bytes, which bounds the allocation by the input.
    if count < 0 || count as usize > v.len() / 18 {
        return Err(CodecError::InvalidLength(i64::from(count)));
    }
    let mut members = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let member_id = get_string(&mut v)?;
        let instance_id = if version >= 3 {
            get_nullable_string(&mut v)?
        } else {
            None
        };
        let client_id = get_string(&mut v)?;
        let client_host = get_string(&mut v)?;
        let rebalance_timeout_ms = if version >= 1 { get_i32(&mut v)? } else { -1 };
        let session_timeout_ms = get_i32(&mut v)?;
        let subscription = get_bytes(&mut v)?;
        let assignment = get_bytes(&mut v)?;
        members.push(MemberValue {
            member_id,
            instance_id,
            client_id,
            client_host,
            rebalance_timeout_ms: if rebalance_timeout_ms < 0 {
                session_timeout_ms
            } else {
                rebalance_timeout_ms
            },
            session_timeout_ms,
            subscription,
            assignment,
        });
    }
    Ok(GroupValue {
        protocol_type,
        generation,
        protocol,
        leader,
        state_timestamp_ms,
        members,
    })
}

/// One uncompressed v2 batch of coordinator records (no producer id, CreateTime `now_ms`).
pub fn encode_batch(records: &[CoordinatorRecord], now_ms: i64) -> Bytes {
    let encoded: Vec<(Bytes, Option<Bytes>)> = records.iter().map(|r| r.encode()).collect();
    let pairs: Vec<(&[u8], Option<&[u8]>)> = encoded
        .iter()
        .map(|(k, v)| (&k[..], v.as_deref()))
        .collect();
    encode_key_value_batch(&pairs, now_ms)
}

/// One uncompressed v2 batch of plain key/value records (no producer id, CreateTime
/// `now_ms`): the form of every internal record ferrolog writes.
pub fn encode_key_value_batch(records: &[(&[u8], Option<&[u8]>)], now_ms: i64) -> Bytes {
    encode_key_value_batch_of(records, now_ms, None)
}

/// `encode_key_value_batch`, as a transactional batch of `producer` (id and epoch) with no
/// sequence when one is given: the offsets of a transaction (TxnOffsetCommit), as Kafka's
/// coordinator writes them.
pub fn encode_key_value_batch_of(
    records: &[(&[u8], Option<&[u8]>)],
    now_ms: i64,
    producer: Option<(i64, i16)>,
) -> Bytes {
    assert!(!records.is_empty(), "a batch holds at least one record");
    let mut body = BytesMut::new();
    for (i, (key, value)) in records.iter().enumerate() {
        let mut rec = BytesMut::new();
        rec.put_u8(0); // attributes
        put_varint(&mut rec, 0); // timestamp delta
        put_varint(&mut rec, i as i64); // offset delta
        put_varint(&mut rec, key.len() as i64);
        rec.put_slice(key);
        match value {
            Some(v) => {
                put_varint(&mut rec, v.len() as i64);
                rec.put_slice(v);
            }
            None => put_varint(&mut rec, -1),
        }
        put_varint(&mut rec, 0); // headers
        put_varint(&mut body, rec.len() as i64);
        body.put_slice(&rec);
    }
    let count = records.len() as i32;
    let mut b = BytesMut::with_capacity(HEADER_BYTES + body.len());
    b.put_i64(0); // base offset: set by the log
    b.put_i32((HEADER_BYTES - LOG_OVERHEAD + body.len()) as i32);
    b.put_i32(0); // partition leader epoch: set by the log
    b.put_i8(2);
    b.put_u32(0); // CRC, below
    let (producer_id, epoch, attributes) = match producer {
        Some((id, epoch)) => (id, epoch, batch::ATTR_TRANSACTIONAL),
        None => (-1, -1, 0),
    };
    b.put_i16(attributes); // uncompressed, CreateTime
    b.put_i32(count - 1);
    b.put_i64(now_ms);
    b.put_i64(now_ms);
    b.put_i64(producer_id);
    b.put_i16(epoch);
    b.put_i32(-1); // no sequence
    b.put_i32(count);
    b.put_slice(&body);
    let crc = batch::compute_crc(&b);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b.freeze()
}

/// Decodes the records of one whole, CRC-checked batch, calling `visit` for each.
pub fn decode_batch(
    header: &BatchHeader,
    bytes: &[u8],
    mut visit: impl FnMut(CoordinatorRecord),
) -> Result<(), CodecError> {
    let mut result = Ok(());
    decode_key_value_batch(header, bytes, |key, value| {
        if result.is_ok() {
            match CoordinatorRecord::decode(key, value) {
                Ok(r) => visit(r),
                Err(e) => result = Err(e),
            }
        }
    })?;
    result
}

/// Walks the key/value records of one whole, uncompressed batch; control batches hold none.
pub fn decode_key_value_batch(
    header: &BatchHeader,
    bytes: &[u8],
    mut visit: impl FnMut(&[u8], Option<&[u8]>),
) -> Result<(), CodecError> {
    if header.compression() != 0 {
        return Err(CodecError::Compressed(header.compression()));
    }
    if header.is_control() {
        return Ok(());
    }
    let mut body = bytes
        .get(HEADER_BYTES..header.total_bytes())
        .ok_or(CodecError::Truncated)?;
    for _ in 0..header.record_count {
        let len = get_varint(&mut body)?;
        if len < 0 || len as usize > body.len() {
            return Err(CodecError::InvalidLength(len));
        }
        let (mut rec, rest) = body.split_at(len as usize);
        body = rest;
        let _attributes = get_u8(&mut rec)?;
        let _timestamp_delta = get_varint(&mut rec)?;
        let _offset_delta = get_varint(&mut rec)?;
        let key = get_varint_bytes(&mut rec)?.ok_or(CodecError::InvalidLength(-1))?;
        let value = get_varint_bytes(&mut rec)?;
        visit(key, value);
    }
    Ok(())
}

fn put_string(b: &mut BytesMut, s: &str) {
    // Handlers refuse longer strings before they change any state (`group::check_string`).
    assert!(s.len() <= i16::MAX as usize, "coordinator string too long");
    b.put_i16(s.len() as i16);
    b.put_slice(s.as_bytes());
}

fn put_nullable_string(b: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => put_string(b, s),
        None => b.put_i16(-1),
    }
}

/// Kafka's unsigned varint (compact lengths).
pub fn put_uvarint(b: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        b.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    b.put_u8(v as u8);
}

fn put_compact_nullable_string(b: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => {
            put_uvarint(b, s.len() as u64 + 1);
            b.put_slice(s.as_bytes());
        }
        None => b.put_u8(0),
    }
}

fn put_varint(b: &mut BytesMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        b.put_u8((z as u8) | 0x80);
        z >>= 7;
    }
    b.put_u8(z as u8);
}

fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], CodecError> {
    if b.len() < n {
        return Err(CodecError::Truncated);
    }
    let (head, rest) = b.split_at(n);
    *b = rest;
    Ok(head)
}

fn get_u8(b: &mut &[u8]) -> Result<u8, CodecError> {
    Ok(take(b, 1)?[0])
}

fn get_i16(b: &mut &[u8]) -> Result<i16, CodecError> {
    Ok(take(b, 2)?.get_i16())
}

fn get_i32(b: &mut &[u8]) -> Result<i32, CodecError> {
    Ok(take(b, 4)?.get_i32())
}

fn get_i64(b: &mut &[u8]) -> Result<i64, CodecError> {
    Ok(take(b, 8)?.get_i64())
}

fn utf8(bytes: &[u8]) -> Result<String, CodecError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| CodecError::NotUtf8)
}

fn get_nullable_string(b: &mut &[u8]) -> Result<Option<String>, CodecError> {
    let len = get_i16(b)?;
    if len < 0 {
        return Ok(None);
    }
    Ok(Some(utf8(take(b, len as usize)?)?))
}

fn get_string(b: &mut &[u8]) -> Result<String, CodecError> {
    get_nullable_string(b)?.ok_or(CodecError::InvalidLength(-1))
}

fn get_compact_nullable_string(b: &mut &[u8]) -> Result<Option<String>, CodecError> {
    let len = get_uvarint(b)?;
    if len == 0 {
        return Ok(None);
    }
    let len = usize::try_from(len - 1).map_err(|_| CodecError::InvalidLength(-1))?;
    Ok(Some(utf8(take(b, len)?)?))
}

fn get_compact_string(b: &mut &[u8]) -> Result<String, CodecError> {
    get_compact_nullable_string(b)?.ok_or(CodecError::InvalidLength(-1))
}

/// A compact array's length (no null arrays in these records).
fn get_compact_len(b: &mut &[u8]) -> Result<usize, CodecError> {
    let n = get_uvarint(b)?;
    if n == 0 {
        return Err(CodecError::InvalidLength(-1));
    }
    usize::try_from(n - 1).map_err(|_| CodecError::InvalidLength(-1))
}

fn get_bytes(b: &mut &[u8]) -> Result<Bytes, CodecError> {
    let len = get_i32(b)?;
    if len < 0 {
        return Ok(Bytes::new());
    }
    Ok(Bytes::copy_from_slice(take(b, len as usize)?))
}

fn get_uvarint(b: &mut &[u8]) -> Result<u64, CodecError> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = get_u8(b)?;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(CodecError::InvalidLength(-1))
}

/// Skips a flexible version's tagged fields (KIP-482).
fn skip_tagged_fields(b: &mut &[u8]) -> Result<(), CodecError> {
    let count = get_uvarint(b)?;
    for _ in 0..count {
        let _tag = get_uvarint(b)?;
        let size = get_uvarint(b)?;
        take(
            b,
            usize::try_from(size).map_err(|_| CodecError::InvalidLength(-1))?,
        )?;
    }
    Ok(())
}

fn get_varint(b: &mut &[u8]) -> Result<i64, CodecError> {
    let z = get_uvarint(b)?;
    Ok(((z >> 1) as i64) ^ -((z & 1) as i64))
}

fn get_varint_bytes<'a>(b: &mut &'a [u8]) -> Result<Option<&'a [u8]>, CodecError> {
    let len = get_varint(b)?;
    if len < 0 {
        return Ok(None);
    }
    if len as usize > b.len() {
        return Err(CodecError::InvalidLength(len));
    }
    Ok(Some(take(b, len as usize)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<CoordinatorRecord> {
        vec![
            CoordinatorRecord::Offset {
                group: "g".into(),
                topic: "t".into(),
                partition: 3,
                value: Some(OffsetValue {
                    offset: 42,
                    leader_epoch: 0,
                    metadata: "meta é".into(),
                    commit_timestamp_ms: 1_700_000_000_000,
                }),
            },
            CoordinatorRecord::Offset {
                group: "g".into(),
                topic: "t".into(),
                partition: 4,
                value: None,
            },
            CoordinatorRecord::Group {
                group: "g".into(),
                value: Some(GroupValue {
                    protocol_type: "consumer".into(),
                    generation: 7,
                    protocol: Some("range".into()),
                    leader: Some("m1".into()),
                    state_timestamp_ms: 5,
                    members: vec![MemberValue {
                        member_id: "m1".into(),
                        instance_id: Some("i1".into()),
                        client_id: "c".into(),
                        client_host: "/127.0.0.1".into(),
                        rebalance_timeout_ms: 300_000,
                        session_timeout_ms: 45_000,
                        subscription: Bytes::from_static(b"sub"),
                        assignment: Bytes::from_static(b"asg"),
                    }],
                }),
            },
            CoordinatorRecord::ConsumerGroup {
                group: "g2".into(),
                value: Some(9),
            },
            CoordinatorRecord::Group {
                group: "g3".into(),
                value: None,
            },
            CoordinatorRecord::ConsumerMember {
                group: "g2".into(),
                member: "m".into(),
                value: Some(ConsumerMemberValue {
                    instance_id: None,
                    rack_id: Some("r1".into()),
                    client_id: "c".into(),
                    client_host: "/127.0.0.1".into(),
                    subscribed_topics: vec!["a".into(), "b".into()],
                    subscribed_regex: Some("x.*".into()),
                    rebalance_timeout_ms: 30_000,
                    server_assignor: None,
                }),
            },
            CoordinatorRecord::ConsumerAssignment {
                group: "g2".into(),
                member: "m".into(),
                value: Some(ConsumerAssignmentValue {
                    epoch: 4,
                    previous_epoch: 3,
                    state: 1,
                    assigned: vec![(uuid::Uuid::from_u128(9), vec![0, 2])],
                    pending_revocation: vec![(uuid::Uuid::from_u128(9), vec![1])],
                }),
            },
            CoordinatorRecord::ConsumerAssignment {
                group: "g2".into(),
                member: "gone".into(),
                value: None,
            },
        ]
    }

    #[test]
    fn batch_round_trip() {
        let records = sample();
        let bytes = encode_batch(&records, 1234);
        let header = batch::verify(&bytes).expect("valid batch");
        assert_eq!(header.record_count, records.len() as i32);
        let mut back = Vec::new();
        decode_batch(&header, &bytes, |r| back.push(r)).unwrap();
        assert_eq!(back, records);
    }

    #[test]
    fn kafka_offset_value_v1_decodes() {
        // OffsetCommitValue v1: offset, metadata, commit timestamp, expire timestamp.
        let mut v = BytesMut::new();
        v.put_i16(1);
        v.put_i64(10);
        put_string(&mut v, "m");
        v.put_i64(99);
        v.put_i64(-1);
        let mut k = BytesMut::new();
        k.put_i16(0);
        put_string(&mut k, "g");
        put_string(&mut k, "t");
        k.put_i32(0);
        let r = CoordinatorRecord::decode(&k, Some(&v)).unwrap();
        assert_eq!(
            r,
            CoordinatorRecord::Offset {
                group: "g".into(),
                topic: "t".into(),
                partition: 0,
                value: Some(OffsetValue {
                    offset: 10,
                    leader_epoch: -1,
                    metadata: "m".into(),
                    commit_timestamp_ms: 99
                })
            }
        );
    }

    #[test]
    fn truncated_input_is_an_error() {
        let records = sample();
        for r in &records {
            let (key, value) = r.encode();
            for cut in 0..key.len() {
                assert!(CoordinatorRecord::decode(&key[..cut], value.as_deref()).is_err());
            }
            if let Some(v) = value {
                for cut in 0..v.len() {
                    assert!(CoordinatorRecord::decode(&key, Some(&v[..cut])).is_err());
                }
            }
        }
    }
}
