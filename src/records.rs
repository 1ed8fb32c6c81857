//! Validation of produced record batches, record by record, without allocating per record.
//!
//! The batch header and CRC are checked by `ferrolog_io::batch`. Here the records inside are
//! walked (after decompression, streamed through a reader for compressed batches) to check that
//! each record is well formed, that there are as many as the header says, and that timestamps
//! are within `message.timestamp.{before,after}.max.ms`. Stored bytes are never re-encoded.

use std::io::{self, Read};

use ferrolog_io::batch::{BatchHeader, HEADER_BYTES};

/// Why a batch's records are rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Malformed record framing or count (Kafka: INVALID_RECORD / CORRUPT_MESSAGE).
    #[error("invalid record: {0}")]
    Invalid(String),
    /// Compression codec id not in 0..=4.
    #[error("unknown compression codec {0}")]
    UnknownCodec(i16),
    /// A record timestamp outside the allowed window (Kafka: INVALID_TIMESTAMP).
    #[error("Timestamp {timestamp} of message with offset {index} is out of range. The timestamp should be within [{low}, {high}]")]
    Timestamp {
        index: i32,
        timestamp: i64,
        low: i64,
        high: i64,
    },
    /// A record without a key on a compacted topic (Kafka: INVALID_RECORD with record_errors).
    #[error("Compacted topic cannot accept message without key")]
    MissingKey { index: i32 },
}

/// Largest single record accepted once decompressed. Records are streamed, never buffered
/// whole, so this bounds the work per record rather than memory.
const RECORD_BYTES_MAX: i64 = 64 << 20;

/// What `validate` needs from the topic configs.
pub struct TimestampPolicy {
    /// The topic is compacted: records need keys.
    pub compacted: bool,
    pub log_append_time: bool,
    pub before_max_ms: i64,
    pub after_max_ms: i64,
    pub now_ms: i64,
}

/// A record's fields the broker cares about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordMeta {
    pub offset_delta: i64,
    pub timestamp: i64,
    pub key_is_null: bool,
}

/// Walks every record of `batch` (a whole, CRC-checked batch) and calls `visit` for each.
pub fn for_each_record(
    header: &BatchHeader,
    batch: &[u8],
    mut visit: impl FnMut(RecordMeta) -> Result<(), RecordError>,
) -> Result<(), RecordError> {
    let body = &batch[HEADER_BYTES..header.total_bytes()];
    let invalid = |e: io::Error| RecordError::Invalid(format!("records do not decode: {e}"));
    match header.compression() {
        0 => walk(header, &mut &body[..], &mut visit),
        1 => walk(header, &mut flate2::read::GzDecoder::new(body), &mut visit),
        2 => {
            let raw = snappy_decompress(body).map_err(invalid)?;
            walk(header, &mut &raw[..], &mut visit)
        }
        3 => walk(
            header,
            &mut lz4_flex::frame::FrameDecoder::new(body),
            &mut visit,
        ),
        4 => {
            let mut d = zstd::stream::read::Decoder::with_buffer(body).map_err(invalid)?;
            walk(header, &mut d, &mut visit)
        }
        c => Err(RecordError::UnknownCodec(c)),
    }
}

/// Checks the records of a batch and, if all are fine, returns nothing.
/// Checks the records of a batch; returns the largest record timestamp (-1 when none has
/// one), which the broker trusts instead of the header's field, as Kafka does.
pub fn validate(
    header: &BatchHeader,
    batch: &[u8],
    policy: &TimestampPolicy,
) -> Result<i64, RecordError> {
    let mut index = 0i32;
    let mut max_timestamp = -1i64;
    for_each_record(header, batch, |r| {
        max_timestamp = max_timestamp.max(r.timestamp);
        if policy.compacted && r.key_is_null {
            return Err(RecordError::MissingKey { index });
        }
        if !policy.log_append_time && !header.is_control() {
            let too_old = policy.now_ms.saturating_sub(r.timestamp) > policy.before_max_ms;
            let too_new = r.timestamp.saturating_sub(policy.now_ms) > policy.after_max_ms;
            if r.timestamp >= 0 && (too_old || too_new) {
                return Err(RecordError::Timestamp {
                    index,
                    timestamp: r.timestamp,
                    low: policy.now_ms.saturating_sub(policy.before_max_ms),
                    high: policy.now_ms.saturating_add(policy.after_max_ms),
                });
            }
        }
        index += 1;
        Ok(())
    })?;
    Ok(max_timestamp)
}

fn walk(
    header: &BatchHeader,
    input: &mut dyn Read,
    visit: &mut dyn FnMut(RecordMeta) -> Result<(), RecordError>,
) -> Result<(), RecordError> {
    let bad = |what: &str| RecordError::Invalid(what.to_string());
    let io_bad = |e: io::Error| RecordError::Invalid(format!("records do not decode: {e}"));
    for i in 0..header.record_count {
        let length = read_varint(input).map_err(io_bad)?;
        if !(0..=RECORD_BYTES_MAX).contains(&length) {
            return Err(bad("record length out of range"));
        }
        let mut rec = input.take(length as u64);
        let mut attr = [0u8; 1];
        rec.read_exact(&mut attr).map_err(io_bad)?;
        let timestamp_delta = read_varint(&mut rec).map_err(io_bad)?;
        let offset_delta = read_varint(&mut rec).map_err(io_bad)?;
        if offset_delta != i64::from(i) && !header.is_control() {
            // Kafka rewrites inner offsets on the (rare) in-place path; clients always send
            // 0..n-1. A mismatch here means a broken producer.
            return Err(bad("record offset delta out of sequence"));
        }
        let key_is_null = skip_bytes_field(&mut rec).map_err(io_bad)?;
        skip_bytes_field(&mut rec).map_err(io_bad)?; // value
        let headers = read_varint(&mut rec).map_err(io_bad)?;
        if headers < 0 || headers > length {
            return Err(bad("header count out of range"));
        }
        for _ in 0..headers {
            let key_len = read_varint(&mut rec).map_err(io_bad)?;
            if key_len < 0 {
                return Err(bad("null header key"));
            }
            skip(&mut rec, key_len as u64).map_err(io_bad)?;
            skip_bytes_field(&mut rec).map_err(io_bad)?;
        }
        if rec.limit() != 0 {
            return Err(bad("record length does not match its fields"));
        }
        visit(RecordMeta {
            offset_delta,
            timestamp: header.base_timestamp.saturating_add(timestamp_delta),
            key_is_null,
        })?;
    }
    let mut extra = [0u8; 1];
    match input.read(&mut extra) {
        Ok(0) => Ok(()),
        Ok(_) => Err(bad("bytes after the last record")),
        Err(e) => Err(io_bad(e)),
    }
}

/// Skips a nullable bytes field; true when it was null.
fn skip_bytes_field(input: &mut dyn Read) -> io::Result<bool> {
    let len = read_varint(input)?;
    if len < -1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "negative length",
        ));
    }
    if len > 0 {
        skip(input, len as u64)?;
    }
    Ok(len == -1)
}

fn skip(input: &mut dyn Read, n: u64) -> io::Result<()> {
    let copied = io::copy(&mut input.take(n), &mut io::sink())?;
    if copied != n {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "record truncated",
        ));
    }
    Ok(())
}

/// Zigzag varint (Kafka's signed varlong), at most 10 bytes.
fn read_varint(input: &mut dyn Read) -> io::Result<i64> {
    let mut value: u64 = 0;
    for shift in (0..70).step_by(7) {
        let mut b = [0u8; 1];
        input.read_exact(&mut b)?;
        value |= u64::from(b[0] & 0x7f) << shift;
        if b[0] & 0x80 == 0 {
            return Ok(((value >> 1) as i64) ^ -((value & 1) as i64));
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "varint longer than 10 bytes",
    ))
}

/// Largest decompressed snappy batch accepted (bounds memory on a hostile length prefix).
const SNAPPY_BYTES_MAX: usize = 64 << 20;

/// Kafka's Java client writes snappy in xerial's framing (a magic header, then length-prefixed
/// blocks); librdkafka may write one raw snappy block. Both are accepted, as Kafka does.
fn snappy_decompress(body: &[u8]) -> io::Result<Vec<u8>> {
    const XERIAL_MAGIC: &[u8] = b"\x82SNAPPY\x00";
    let err = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
    let raw_block = |block: &[u8]| -> io::Result<Vec<u8>> {
        let len = snap::raw::decompress_len(block).map_err(|e| err(&e.to_string()))?;
        if len > SNAPPY_BYTES_MAX {
            return Err(err("snappy block too large"));
        }
        snap::raw::Decoder::new()
            .decompress_vec(block)
            .map_err(|e| err(&e.to_string()))
    };
    if !body.starts_with(XERIAL_MAGIC) {
        return raw_block(body);
    }
    let mut rest = body.get(16..).ok_or_else(|| err("short xerial header"))?;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let len_bytes: [u8; 4] = rest
            .get(..4)
            .ok_or_else(|| err("short block length"))?
            .try_into()
            .expect("4 bytes");
        let len = u32::from_be_bytes(len_bytes) as usize;
        let block = rest.get(4..4 + len).ok_or_else(|| err("truncated block"))?;
        out.extend(raw_block(block)?);
        if out.len() > SNAPPY_BYTES_MAX {
            return Err(err("snappy batch too large"));
        }
        rest = &rest[4 + len..];
    }
    Ok(out)
}

/// The leading whole batches of `records` (whole batches as a log read returns them) that
/// fit in `max_bytes`; with `first_whole`, the first batch even when it alone is larger
/// (KIP-74). Shares `records`' memory.
pub fn leading_batches(
    records: &bytes::Bytes,
    max_bytes: usize,
    first_whole: bool,
) -> bytes::Bytes {
    let mut keep = 0;
    while let Ok(header) = BatchHeader::parse(&records[keep..]) {
        let next = keep + header.total_bytes();
        if next > records.len() || (next > max_bytes && !(keep == 0 && first_whole)) {
            break;
        }
        keep = next;
    }
    records.slice(..keep)
}

/// The offset after the last whole batch of `records`, if it holds one.
pub fn next_offset(mut records: &[u8]) -> Option<i64> {
    let mut next = None;
    while let Ok(header) = BatchHeader::parse(records) {
        if header.total_bytes() > records.len() {
            break;
        }
        next = Some(header.next_offset());
        records = &records[header.total_bytes()..];
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(out: &mut Vec<u8>, v: i64) {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        while z >= 0x80 {
            out.push((z as u8 & 0x7f) | 0x80);
            z >>= 7;
        }
        out.push(z as u8);
    }

    fn records(n: i64) -> Vec<u8> {
        let mut out = Vec::new();
        for i in 0..n {
            let mut r = vec![0u8];
            varint(&mut r, i * 10);
            varint(&mut r, i);
            varint(&mut r, 1);
            r.push(b'k');
            varint(&mut r, 2);
            r.extend_from_slice(b"vv");
            varint(&mut r, 1);
            varint(&mut r, 1);
            r.push(b'h');
            varint(&mut r, -1);
            varint(&mut out, r.len() as i64);
            out.extend(r);
        }
        out
    }

    fn header(count: i32, codec: i16, body_len: usize) -> BatchHeader {
        BatchHeader {
            base_offset: 0,
            batch_length: (HEADER_BYTES - 12 + body_len) as i32,
            partition_leader_epoch: 0,
            magic: 2,
            crc: 0,
            attributes: codec,
            last_offset_delta: count - 1,
            base_timestamp: 1000,
            max_timestamp: 1000,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            record_count: count,
        }
    }

    fn with_header(body: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_BYTES];
        b.extend_from_slice(body);
        b
    }

    #[test]
    fn walks_plain_and_compressed() {
        let body = records(5);
        let mut seen = Vec::new();
        let h = header(5, 0, body.len());
        for_each_record(&h, &with_header(&body), |r| {
            seen.push(r);
            Ok(())
        })
        .unwrap();
        assert_eq!(seen.len(), 5);
        assert_eq!(seen[4].timestamp, 1040);
        let z = zstd::bulk::compress(&body, 3).unwrap();
        let h = header(5, 4, z.len());
        assert!(for_each_record(&h, &with_header(&z), |_| Ok(())).is_ok());
        let s = snap::raw::Encoder::new().compress_vec(&body).unwrap();
        let h = header(5, 2, s.len());
        assert!(for_each_record(&h, &with_header(&s), |_| Ok(())).is_ok());
    }

    #[test]
    fn rejects_count_mismatch_and_garbage() {
        let body = records(3);
        let h = header(4, 0, body.len());
        assert!(for_each_record(&h, &with_header(&body), |_| Ok(())).is_err());
        let h = header(2, 0, body.len());
        assert!(for_each_record(&h, &with_header(&body), |_| Ok(())).is_err());
        let junk = vec![0xffu8; 40];
        let h = header(1, 1, junk.len());
        assert!(for_each_record(&h, &with_header(&junk), |_| Ok(())).is_err());
    }

    #[test]
    fn timestamp_window() {
        let body = records(2);
        let h = header(2, 0, body.len());
        let policy = TimestampPolicy {
            compacted: false,
            log_append_time: false,
            before_max_ms: 100,
            after_max_ms: 100,
            now_ms: 5000,
        };
        assert!(matches!(
            validate(&h, &with_header(&body), &policy),
            Err(RecordError::Timestamp { index: 0, .. })
        ));
    }

    #[test]
    fn leading_batches_cut_at_whole_batches() {
        let batches: Vec<Vec<u8>> = (0..3)
            .map(|i| ferrolog_io::batch::make_batch(i * 2, 2, 0, 100))
            .collect();
        let len = batches[0].len();
        let all = bytes::Bytes::from(batches.concat());
        assert_eq!(next_offset(&all), Some(6));
        assert_eq!(leading_batches(&all, all.len(), false), all);
        assert_eq!(leading_batches(&all, 2 * len + 1, false).len(), 2 * len);
        assert_eq!(
            next_offset(&leading_batches(&all, 2 * len + 1, false)),
            Some(4)
        );
        assert!(leading_batches(&all, len - 1, false).is_empty());
        assert_eq!(leading_batches(&all, len - 1, true).len(), len);
        assert_eq!(leading_batches(&all, 0, true).len(), len);
        // A cut batch at the end is not whole.
        let cut = all.slice(..all.len() - 1);
        assert_eq!(leading_batches(&cut, usize::MAX, false).len(), 2 * len);
        assert_eq!(next_offset(&cut), Some(4));
        assert_eq!(next_offset(&[]), None);
    }
}
