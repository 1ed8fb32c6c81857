//! Kafka v2 record batch headers: the unit of storage.
//!
//! A batch is stored byte for byte as the producer sent it, except for two fields that the
//! broker owns and that the CRC does not cover: `baseOffset` (bytes 0..8) and
//! `partitionLeaderEpoch` (bytes 12..16). The CRC32C covers everything from `attributes`
//! (byte 21) to the end of the batch.
//!
//! Parsing never trusts a length from the input before checking it against the bytes at hand
//! and against `BATCH_BYTES_MAX`.

use bytes::{Buf, BufMut};

/// Size of the fixed v2 batch header, from `baseOffset` through `recordCount`.
pub const HEADER_BYTES: usize = 61;
/// Bytes before `batchLength` counts: `baseOffset` (8) + `batchLength` (4).
pub const LOG_OVERHEAD: usize = 12;
/// No batch may be larger than this, whatever the configs say (guards allocation on recovery).
pub const BATCH_BYTES_MAX: usize = 1 << 30;

const MAGIC_OFFSET: usize = 16;
const CRC_OFFSET: usize = 17;
const ATTRIBUTES_OFFSET: usize = 21;
const PARTITION_LEADER_EPOCH_OFFSET: usize = 12;

/// Attribute bits (KIP-98 and the v2 format).
pub const ATTR_COMPRESSION_MASK: i16 = 0x07;
pub const ATTR_TIMESTAMP_LOG_APPEND: i16 = 0x08;
pub const ATTR_TRANSACTIONAL: i16 = 0x10;
pub const ATTR_CONTROL: i16 = 0x20;

/// Why bytes are not a valid batch header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// Fewer bytes than a header, or than the header's own length says.
    #[error("batch truncated: need {needed} bytes, have {available}")]
    Truncated { needed: usize, available: usize },
    /// The length field is below the header size or above `BATCH_BYTES_MAX`.
    #[error("invalid batch length {0}")]
    InvalidLength(i32),
    /// Only magic 2 (Kafka 0.11+) batches are stored.
    #[error("unsupported record batch magic {0}")]
    UnsupportedMagic(i8),
    /// The stored CRC32C does not match the batch contents.
    #[error("CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
    /// `lastOffsetDelta` and `recordCount` disagree or are negative.
    #[error("invalid record count {record_count} with last offset delta {last_offset_delta}")]
    InvalidCount {
        record_count: i32,
        last_offset_delta: i32,
    },
}

/// The decoded fixed header of a v2 record batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    /// Length of the batch counted from `partitionLeaderEpoch` (so total = this + 12).
    pub batch_length: i32,
    pub partition_leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
}

impl BatchHeader {
    /// Parses the header at the start of `bytes`. Checks magic and length bounds, not the CRC.
    pub fn parse(bytes: &[u8]) -> Result<BatchHeader, BatchError> {
        if bytes.len() < HEADER_BYTES {
            return Err(BatchError::Truncated {
                needed: HEADER_BYTES,
                available: bytes.len(),
            });
        }
        let mut b = bytes;
        let base_offset = b.get_i64();
        let batch_length = b.get_i32();
        let partition_leader_epoch = b.get_i32();
        let magic = b.get_i8();
        if magic != 2 {
            return Err(BatchError::UnsupportedMagic(magic));
        }
        if batch_length < (HEADER_BYTES - LOG_OVERHEAD) as i32
            || batch_length as usize > BATCH_BYTES_MAX - LOG_OVERHEAD
        {
            return Err(BatchError::InvalidLength(batch_length));
        }
        let header = BatchHeader {
            base_offset,
            batch_length,
            partition_leader_epoch,
            magic,
            crc: b.get_u32(),
            attributes: b.get_i16(),
            last_offset_delta: b.get_i32(),
            base_timestamp: b.get_i64(),
            max_timestamp: b.get_i64(),
            producer_id: b.get_i64(),
            producer_epoch: b.get_i16(),
            base_sequence: b.get_i32(),
            record_count: b.get_i32(),
        };
        if header.record_count < 0
            || header.last_offset_delta < 0
            || header.last_offset_delta < header.record_count - 1
        {
            return Err(BatchError::InvalidCount {
                record_count: header.record_count,
                last_offset_delta: header.last_offset_delta,
            });
        }
        Ok(header)
    }

    /// Total bytes of the batch on disk and on the wire.
    pub fn total_bytes(&self) -> usize {
        self.batch_length as usize + LOG_OVERHEAD
    }

    pub fn last_offset(&self) -> i64 {
        self.base_offset + i64::from(self.last_offset_delta)
    }

    pub fn next_offset(&self) -> i64 {
        self.last_offset() + 1
    }

    pub fn compression(&self) -> i16 {
        self.attributes & ATTR_COMPRESSION_MASK
    }

    pub fn is_transactional(&self) -> bool {
        self.attributes & ATTR_TRANSACTIONAL != 0
    }

    pub fn is_control(&self) -> bool {
        self.attributes & ATTR_CONTROL != 0
    }

    pub fn has_producer_id(&self) -> bool {
        self.producer_id >= 0
    }

    /// The last sequence number in the batch, wrapping at `i32::MAX` as Kafka does.
    pub fn last_sequence(&self) -> i32 {
        let last = i64::from(self.base_sequence) + i64::from(self.last_offset_delta);
        if last > i64::from(i32::MAX) {
            (last - i64::from(i32::MAX) - 1) as i32
        } else {
            last as i32
        }
    }
}

/// Computes the CRC32C of a whole batch (from `attributes` to the end).
pub fn compute_crc(batch: &[u8]) -> u32 {
    crc32c::crc32c(&batch[ATTRIBUTES_OFFSET..])
}

/// Parses the header of a complete batch and verifies its length and CRC.
pub fn verify(batch: &[u8]) -> Result<BatchHeader, BatchError> {
    let header = BatchHeader::parse(batch)?;
    if header.total_bytes() > batch.len() {
        return Err(BatchError::Truncated {
            needed: header.total_bytes(),
            available: batch.len(),
        });
    }
    let computed = compute_crc(&batch[..header.total_bytes()]);
    if computed != header.crc {
        return Err(BatchError::CrcMismatch {
            stored: header.crc,
            computed,
        });
    }
    Ok(header)
}

/// Sets the two broker-owned header fields. Neither is covered by the CRC.
pub fn set_offset_and_epoch(batch: &mut [u8], base_offset: i64, leader_epoch: i32) {
    assert!(batch.len() >= HEADER_BYTES, "batch shorter than its header");
    batch[0..8].copy_from_slice(&base_offset.to_be_bytes());
    batch[PARTITION_LEADER_EPOCH_OFFSET..PARTITION_LEADER_EPOCH_OFFSET + 4]
        .copy_from_slice(&leader_epoch.to_be_bytes());
    debug_assert_eq!(batch[MAGIC_OFFSET], 2);
}

/// Builds a valid uncompressed batch with `count` records of `value_bytes` each, all with
/// `timestamp`, as a producer would send it (tests and the simulator use it).
pub fn make_batch(base_offset: i64, count: i32, timestamp: i64, value_bytes: usize) -> Vec<u8> {
    let mut records = Vec::new();
    for i in 0..count {
        let mut body = Vec::new();
        body.push(0u8); // attributes
        put_varint(&mut body, 0); // timestamp delta
        put_varint(&mut body, i64::from(i)); // offset delta
        put_varint(&mut body, -1); // key: null
        put_varint(&mut body, value_bytes as i64);
        body.extend(std::iter::repeat_n(b'v', value_bytes));
        put_varint(&mut body, 0); // headers
        put_varint(&mut records, body.len() as i64);
        records.extend(body);
    }
    let mut b = Vec::new();
    b.put_i64(base_offset);
    b.put_i32((HEADER_BYTES - LOG_OVERHEAD + records.len()) as i32);
    b.put_i32(0);
    b.put_i8(2);
    b.put_u32(0);
    b.put_i16(0);
    b.put_i32(count - 1);
    b.put_i64(timestamp);
    b.put_i64(timestamp);
    b.put_i64(-1);
    b.put_i16(-1);
    b.put_i32(-1);
    b.put_i32(count);
    b.extend(records);
    let crc = compute_crc(&b);
    b[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
    b
}

/// A v2 control batch holding one control record, whose key is `(version 0, control_type)`
/// and whose value is `value`. Kafka's transaction markers name their producer
/// (`producer`: id and epoch) and are transactional; ferrolog's own control batches name
/// none. Offset and leader epoch are the log's to set.
pub fn control_batch(
    control_type: i16,
    value: &[u8],
    timestamp_ms: i64,
    producer: Option<(i64, i16)>,
) -> Vec<u8> {
    let mut record = Vec::new();
    record.push(0u8); // attributes
    put_varint(&mut record, 0); // timestamp delta
    put_varint(&mut record, 0); // offset delta
    put_varint(&mut record, 4);
    record.put_i16(0); // control key version
    record.put_i16(control_type);
    put_varint(&mut record, value.len() as i64);
    record.extend_from_slice(value);
    put_varint(&mut record, 0); // headers
    let (producer_id, producer_epoch, attributes) = match producer {
        Some((id, epoch)) => (id, epoch, ATTR_CONTROL | ATTR_TRANSACTIONAL),
        None => (-1, -1, ATTR_CONTROL),
    };
    let mut b = Vec::with_capacity(HEADER_BYTES + record.len() + 5);
    b.put_i64(0); // base offset
    b.put_i32(0); // batch length, set below
    b.put_i32(-1); // partition leader epoch
    b.put_i8(2); // magic
    b.put_u32(0); // crc, set below
    b.put_i16(attributes);
    b.put_i32(0); // last offset delta
    b.put_i64(timestamp_ms);
    b.put_i64(timestamp_ms);
    b.put_i64(producer_id);
    b.put_i16(producer_epoch);
    b.put_i32(-1); // base sequence
    b.put_i32(1); // record count
    put_varint(&mut b, record.len() as i64);
    b.extend_from_slice(&record);
    let length = i32::try_from(b.len() - LOG_OVERHEAD).expect("small control batch");
    b[8..12].copy_from_slice(&length.to_be_bytes());
    let crc = compute_crc(&b);
    b[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
    b
}

/// The `(type, value)` of the one control record of an uncompressed control batch with one
/// record (the form `control_batch` writes), `None` for any other batch, an error for one of
/// that form whose record does not decode. Never trusts a length before checking it.
pub fn control_record<'a>(
    header: &BatchHeader,
    bytes: &'a [u8],
) -> Result<Option<(i16, &'a [u8])>, &'static str> {
    if !header.is_control() || header.record_count != 1 || header.compression() != 0 {
        return Ok(None);
    }
    let mut r = bytes
        .get(HEADER_BYTES..header.total_bytes())
        .ok_or("control batch cut short")?;
    let _length = get_varint(&mut r)?;
    let _attributes = take(&mut r, 1)?;
    let _timestamp_delta = get_varint(&mut r)?;
    let _offset_delta = get_varint(&mut r)?;
    if get_varint(&mut r)? != 4 {
        return Ok(None);
    }
    let key = take(&mut r, 4)?;
    let control_type = i16::from_be_bytes([key[2], key[3]]);
    let value_len = usize::try_from(get_varint(&mut r)?).map_err(|_| "negative value length")?;
    Ok(Some((control_type, take(&mut r, value_len)?)))
}

fn take<'a>(r: &mut &'a [u8], n: usize) -> Result<&'a [u8], &'static str> {
    if r.len() < n {
        return Err("control record cut short");
    }
    let (head, rest) = r.split_at(n);
    *r = rest;
    Ok(head)
}

fn get_varint(r: &mut &[u8]) -> Result<i64, &'static str> {
    let mut z = 0u64;
    for shift in (0..70).step_by(7) {
        let byte = take(r, 1)?[0];
        z |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(((z >> 1) as i64) ^ -((z & 1) as i64));
        }
    }
    Err("varint longer than 10 bytes")
}

fn put_varint(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        if z < 0x80 {
            out.push(z as u8);
            return;
        }
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn round_trip_and_crc() {
        let mut b = make_batch(0, 3, 1000, 10);
        let h = verify(&b).unwrap();
        assert_eq!(h.record_count, 3);
        assert_eq!(h.total_bytes(), b.len());
        set_offset_and_epoch(&mut b, 42, 7);
        let h = verify(&b).expect("offset and epoch are outside the CRC");
        assert_eq!(h.base_offset, 42);
        assert_eq!(h.partition_leader_epoch, 7);
        assert_eq!(h.last_offset(), 44);
        let last = b.len() - 1;
        b[last] ^= 1;
        assert!(matches!(verify(&b), Err(BatchError::CrcMismatch { .. })));
    }

    #[test]
    fn rejects_bad_lengths() {
        let mut b = make_batch(0, 1, 0, 1);
        b[8..12].copy_from_slice(&(-5i32).to_be_bytes());
        assert_eq!(BatchHeader::parse(&b), Err(BatchError::InvalidLength(-5)));
        assert!(matches!(
            BatchHeader::parse(&b[..10]),
            Err(BatchError::Truncated { .. })
        ));
    }

    #[test]
    fn sequence_wraps() {
        let mut b = make_batch(0, 3, 0, 1);
        b[53..57].copy_from_slice(&(i32::MAX - 1).to_be_bytes());
        let h = BatchHeader::parse(&b).unwrap();
        assert_eq!(h.last_sequence(), 0);
    }

    #[test]
    fn varints_round_trip() {
        for v in [
            0i64,
            1,
            -1,
            63,
            -64,
            64,
            300,
            -300,
            i64::from(i32::MAX),
            i64::MIN,
            i64::MAX,
        ] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            assert_eq!(get_varint(&mut &b[..]), Ok(v));
        }
    }

    #[test]
    fn control_batches_round_trip() {
        let b = control_batch(1, &[0, 0, 0, 0, 0, 7], 99, Some((42, 3)));
        let h = verify(&b).unwrap();
        assert!(h.is_control() && h.is_transactional());
        assert_eq!(
            (h.producer_id, h.producer_epoch, h.base_sequence),
            (42, 3, -1)
        );
        assert_eq!(
            control_record(&h, &b),
            Ok(Some((1, &[0u8, 0, 0, 0, 0, 7][..])))
        );
        let own = control_batch(100, b"x", 99, None);
        let h = verify(&own).unwrap();
        assert!(h.is_control() && !h.is_transactional() && !h.has_producer_id());
        let data = make_batch(0, 1, 0, 4);
        assert_eq!(control_record(&verify(&data).unwrap(), &data), Ok(None));
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(data in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            if let Ok(h) = verify(&data) {
                let _ = control_record(&h, &data);
            }
        }
    }
}
