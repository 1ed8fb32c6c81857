//! Kafka v2 record batches: the bench encodes its own (no compression, no producer id)
//! and walks the ones a Fetch returns.
//!
//! Batch header (61 bytes, big endian): baseOffset i64, batchLength i32,
//! partitionLeaderEpoch i32, magic i8 (= 2), crc u32 (CRC32C over everything after it),
//! attributes i16, lastOffsetDelta i32, baseTimestamp i64, maxTimestamp i64, producerId i64,
//! producerEpoch i16, baseSequence i32, recordCount i32. Then the records, each:
//! length varint, attributes i8, timestampDelta varlong, offsetDelta varint, key
//! (varint length, -1 = null), value (varint length + bytes), header count varint.
//! All varints are zigzag, as in Kafka's `ByteUtils.writeVarint`.
//!
//! Payload: every record value starts with the intended send time (unix microseconds,
//! big endian) and the 8-byte marker `PAYLOAD_MARKER`, so a consumer anywhere can
//! compute end-to-end latency; the rest is filler that does not compress.

use anyhow::{ensure, Result};
use bytes::{BufMut, Bytes, BytesMut};

pub const BATCH_HEADER_BYTES: usize = 61;
pub const PAYLOAD_HEADER_BYTES: usize = 16;
pub const PAYLOAD_MARKER: &[u8; 8] = b"FLBENCH1";
const CRC_OFFSET: usize = 17;
const ATTRIBUTES_OFFSET: usize = 21;

/// Builds one batch for one partition, record by record.
pub struct BatchBuilder {
    buf: BytesMut,
    count: i32,
    base_timestamp_ms: i64,
    max_timestamp_ms: i64,
}

impl BatchBuilder {
    pub fn new(capacity: usize) -> BatchBuilder {
        let mut buf = BytesMut::with_capacity(capacity + BATCH_HEADER_BYTES + 64);
        buf.put_bytes(0, BATCH_HEADER_BYTES);
        BatchBuilder {
            buf,
            count: 0,
            base_timestamp_ms: 0,
            max_timestamp_ms: 0,
        }
    }

    pub fn bytes(&self) -> usize {
        self.buf.len()
    }

    /// Size a record with a `value_len`-byte value and a key of at most `key_len` bytes
    /// adds to the batch (upper bound).
    pub fn record_bytes_max(value_len: usize, key_len: usize) -> usize {
        value_len + key_len + 5 + 1 + 10 + 5 + 5 + 5 + 1
    }

    /// Appends a record without headers, with `key` (null if `None`) and a value that is
    /// `PAYLOAD_HEADER_BYTES` of header (the timestamp and marker) followed by `filler`.
    pub fn append(
        &mut self,
        timestamp_ms: i64,
        send_time_unix_us: u64,
        key: Option<&[u8]>,
        filler: &[u8],
    ) {
        if self.count == 0 {
            self.base_timestamp_ms = timestamp_ms;
        }
        self.max_timestamp_ms = self.max_timestamp_ms.max(timestamp_ms);
        let value_len = PAYLOAD_HEADER_BYTES + filler.len();
        let timestamp_delta = timestamp_ms - self.base_timestamp_ms;
        let offset_delta = self.count as i64;
        let key_len = key.map_or(-1, |k| k.len() as i64);
        let body_len = 1
            + varlong_len(timestamp_delta)
            + varlong_len(offset_delta)
            + varlong_len(key_len)
            + key.map_or(0, <[u8]>::len)
            + varlong_len(value_len as i64)
            + value_len
            + varlong_len(0);
        put_varlong(&mut self.buf, body_len as i64);
        self.buf.put_i8(0);
        put_varlong(&mut self.buf, timestamp_delta);
        put_varlong(&mut self.buf, offset_delta);
        put_varlong(&mut self.buf, key_len);
        if let Some(key) = key {
            self.buf.put_slice(key);
        }
        put_varlong(&mut self.buf, value_len as i64);
        self.buf.put_u64(send_time_unix_us);
        self.buf.put_slice(PAYLOAD_MARKER);
        self.buf.put_slice(filler);
        put_varlong(&mut self.buf, 0);
        self.count += 1;
    }

    /// Fills in the header and the CRC; the batch is ready to send.
    pub fn finish(self) -> Bytes {
        self.finish_with(-1, -1, -1, 0)
    }

    /// `finish` for a transactional producer: its id, epoch and the batch's first sequence.
    pub fn finish_transactional(self, producer_id: i64, epoch: i16, base_sequence: i32) -> Bytes {
        const TRANSACTIONAL: i16 = 0x10;
        self.finish_with(producer_id, epoch, base_sequence, TRANSACTIONAL)
    }

    fn finish_with(
        mut self,
        producer_id: i64,
        epoch: i16,
        base_sequence: i32,
        attributes: i16,
    ) -> Bytes {
        assert!(self.count > 0, "empty batch");
        let batch_length = (self.buf.len() - 12) as i32;
        let h = &mut self.buf[..BATCH_HEADER_BYTES];
        h[0..8].copy_from_slice(&0i64.to_be_bytes());
        h[8..12].copy_from_slice(&batch_length.to_be_bytes());
        h[12..16].copy_from_slice(&(-1i32).to_be_bytes());
        h[16] = 2;
        h[21..23].copy_from_slice(&attributes.to_be_bytes());
        h[23..27].copy_from_slice(&(self.count - 1).to_be_bytes());
        h[27..35].copy_from_slice(&self.base_timestamp_ms.to_be_bytes());
        h[35..43].copy_from_slice(&self.max_timestamp_ms.to_be_bytes());
        h[43..51].copy_from_slice(&producer_id.to_be_bytes());
        h[51..53].copy_from_slice(&epoch.to_be_bytes());
        h[53..57].copy_from_slice(&base_sequence.to_be_bytes());
        h[57..61].copy_from_slice(&self.count.to_be_bytes());
        let crc = crc32c::crc32c(&self.buf[ATTRIBUTES_OFFSET..]);
        self.buf[CRC_OFFSET..ATTRIBUTES_OFFSET].copy_from_slice(&crc.to_be_bytes());
        self.buf.freeze()
    }
}

/// What a consumer learns from one partition's `records` in a Fetch response.
#[derive(Default, Debug)]
pub struct Walked {
    /// Offset to fetch next (after the last complete batch), if any batch was complete.
    pub next_offset: Option<i64>,
    pub records: u64,
    /// Bytes of the complete batches, headers included.
    pub batch_bytes: u64,
    /// Bytes of record values.
    pub value_bytes: u64,
    pub crc_errors: u64,
}

/// Walks the complete batches in `data` (a Fetch may end in a partial batch, which is
/// dropped). `on_send_time` gets the send time of every bench record when `parse_records`.
pub fn walk_batches(
    data: &[u8],
    fetch_offset: i64,
    parse_records: bool,
    verify_crc: bool,
    on_send_time: &mut impl FnMut(u64),
) -> Result<Walked> {
    let mut w = Walked::default();
    let mut pos = 0usize;
    while data.len() - pos >= BATCH_HEADER_BYTES {
        let h = &data[pos..];
        let base_offset = i64::from_be_bytes(h[0..8].try_into().unwrap());
        let batch_length = i32::from_be_bytes(h[8..12].try_into().unwrap());
        ensure!(
            batch_length >= (BATCH_HEADER_BYTES - 12) as i32,
            "batch at offset {base_offset}: length {batch_length}"
        );
        let total = 12 + batch_length as usize;
        if data.len() - pos < total {
            break;
        }
        let magic = h[16];
        ensure!(
            magic == 2,
            "batch at offset {base_offset}: magic {magic}, expected 2"
        );
        let batch = &data[pos..pos + total];
        let attributes = i16::from_be_bytes(batch[21..23].try_into().unwrap());
        let last_offset_delta = i32::from_be_bytes(batch[23..27].try_into().unwrap());
        let record_count = i32::from_be_bytes(batch[57..61].try_into().unwrap());
        let last_offset = base_offset + last_offset_delta as i64;
        pos += total;
        w.next_offset = Some(last_offset + 1);
        if last_offset < fetch_offset {
            continue;
        }
        if verify_crc {
            let crc = u32::from_be_bytes(batch[CRC_OFFSET..ATTRIBUTES_OFFSET].try_into().unwrap());
            if crc32c::crc32c(&batch[ATTRIBUTES_OFFSET..]) != crc {
                w.crc_errors += 1;
            }
        }
        let is_control = attributes & 0x20 != 0;
        let compressed = attributes & 0x07 != 0;
        if is_control {
            continue;
        }
        w.records += record_count.max(0) as u64;
        w.batch_bytes += total as u64;
        if compressed {
            // Not the bench's own records; count the batch, skip the values.
            continue;
        }
        let mut r = &batch[BATCH_HEADER_BYTES..];
        for _ in 0..record_count {
            let (len, n) = read_varlong(r)?;
            ensure!(
                len >= 0 && (len as usize) <= r.len() - n,
                "record length {len} past the batch end"
            );
            let rec = &r[n..n + len as usize];
            r = &r[n + len as usize..];
            let value = record_value(rec)?;
            if let Some(v) = value {
                w.value_bytes += v.len() as u64;
                if parse_records && v.len() >= PAYLOAD_HEADER_BYTES && &v[8..16] == PAYLOAD_MARKER {
                    on_send_time(u64::from_be_bytes(v[0..8].try_into().unwrap()));
                }
            }
        }
    }
    Ok(w)
}

/// The value of one record (the bytes after its length varint).
fn record_value(rec: &[u8]) -> Result<Option<&[u8]>> {
    ensure!(!rec.is_empty(), "empty record");
    let mut p = 1; // attributes
    let (_, n) = read_varlong(&rec[p..])?; // timestampDelta
    p += n;
    let (_, n) = read_varlong(&rec[p..])?; // offsetDelta
    p += n;
    let (key_len, n) = read_varlong(&rec[p..])?;
    p += n;
    if key_len > 0 {
        p += key_len as usize;
    }
    ensure!(p <= rec.len(), "key past the record end");
    let (value_len, n) = read_varlong(&rec[p..])?;
    p += n;
    if value_len < 0 {
        return Ok(None);
    }
    ensure!(
        p + value_len as usize <= rec.len(),
        "value past the record end"
    );
    Ok(Some(&rec[p..p + value_len as usize]))
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn varlong_len(v: i64) -> usize {
    let mut z = zigzag(v);
    let mut n = 1;
    while z >= 0x80 {
        z >>= 7;
        n += 1;
    }
    n
}

fn put_varlong(buf: &mut BytesMut, v: i64) {
    let mut z = zigzag(v);
    while z >= 0x80 {
        buf.put_u8((z as u8) | 0x80);
        z >>= 7;
    }
    buf.put_u8(z as u8);
}

fn read_varlong(buf: &[u8]) -> Result<(i64, usize)> {
    let mut z = 0u64;
    for (i, b) in buf.iter().enumerate().take(10) {
        z |= ((b & 0x7f) as u64) << (7 * i);
        if b & 0x80 == 0 {
            return Ok((((z >> 1) as i64) ^ -((z & 1) as i64), i + 1));
        }
    }
    anyhow::bail!("truncated or overlong varint")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_crc() {
        let filler = vec![7u8; 100];
        let mut b = BatchBuilder::new(4096);
        for i in 0..10 {
            let key = format!("key-{i}");
            let key = (i % 2 == 0).then_some(key.as_bytes());
            b.append(1_700_000_000_000 + i, 1_000_000 + i as u64, key, &filler);
        }
        let batch = b.finish();
        let mut times = Vec::new();
        let w = walk_batches(&batch, 0, true, true, &mut |t| times.push(t)).unwrap();
        assert_eq!(w.records, 10);
        assert_eq!(w.crc_errors, 0);
        assert_eq!(w.next_offset, Some(10));
        assert_eq!(w.value_bytes, 10 * (100 + PAYLOAD_HEADER_BYTES as u64));
        assert_eq!(times, (0..10).map(|i| 1_000_000 + i).collect::<Vec<u64>>());
        // A partial batch at the end is not counted.
        let w = walk_batches(&batch[..batch.len() - 1], 0, true, true, &mut |_| {}).unwrap();
        assert_eq!(w.records, 0);
        assert_eq!(w.next_offset, None);
    }

    #[test]
    fn crc_catches_a_flipped_byte() {
        let mut b = BatchBuilder::new(1024);
        b.append(1, 2, None, &[1, 2, 3]);
        let mut bytes = b.finish().to_vec();
        let last = bytes.len() - 2;
        bytes[last] ^= 1;
        let w = walk_batches(&bytes, 0, false, true, &mut |_| {}).unwrap();
        assert_eq!(w.crc_errors, 1);
    }

    #[test]
    fn varlong_round_trip() {
        for v in [
            0i64,
            1,
            -1,
            63,
            -64,
            64,
            300,
            -300,
            i32::MAX as i64,
            i64::MIN,
            i64::MAX,
        ] {
            let mut b = BytesMut::new();
            put_varlong(&mut b, v);
            assert_eq!(b.len(), varlong_len(v));
            assert_eq!(read_varlong(&b).unwrap(), (v, b.len()));
        }
    }
}
