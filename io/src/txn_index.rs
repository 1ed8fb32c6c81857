//! The aborted-transaction index of a segment (`<base>.txnindex`, Kafka's layout): one entry
//! per transaction aborted by a marker in that segment, which read_committed fetches return
//! so consumers skip the aborted records.
//!
//! Each entry is 34 bytes, big-endian: version (i16, 0), producer id (i64), the transaction's
//! first offset, the offset of its abort marker (`last_offset`), and the last stable offset
//! when the marker was written. Entries are in marker order. The log keeps a segment's
//! entries in memory and its flusher writes the file again (whole, atomically) before the
//! next data round whenever they changed, so an abort marker is never durable without its
//! entry (`Log::add_aborted`). At open, entries past the recovered end are dropped; a file
//! that does not decode is reported (`Log::txn_index_lost_from`), and the partition
//! rebuilds from there.

use std::fmt;

/// Bytes per entry.
pub const ENTRY_BYTES: usize = 34;
/// The only entry version Kafka writes.
const VERSION: i16 = 0;

/// One aborted transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    pub producer_id: i64,
    /// The offset of the transaction's first batch in this partition.
    pub first_offset: i64,
    /// The offset of its abort marker.
    pub last_offset: i64,
    /// The partition's last stable offset once the marker was written.
    pub last_stable_offset: i64,
}

/// Why bytes are not a transaction index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnIndexError(String);

impl fmt::Display for TxnIndexError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "transaction index: {}", self.0)
    }
}

impl std::error::Error for TxnIndexError {}

/// Encodes entries in Kafka's `.txnindex` layout.
pub fn encode(entries: &[AbortedTxn]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * ENTRY_BYTES);
    for e in entries {
        out.extend_from_slice(&VERSION.to_be_bytes());
        for v in [
            e.producer_id,
            e.first_offset,
            e.last_offset,
            e.last_stable_offset,
        ] {
            out.extend_from_slice(&v.to_be_bytes());
        }
    }
    out
}

/// Decodes a segment's index, checking each entry against the segment's offsets
/// `[base, next)`: markers in order and inside it, first offsets not after their marker.
/// Anything else is an error, never a panic.
pub fn decode(bytes: &[u8], base: i64, next: i64) -> Result<Vec<AbortedTxn>, TxnIndexError> {
    if !bytes.len().is_multiple_of(ENTRY_BYTES) {
        return Err(TxnIndexError(format!(
            "{} bytes is not a whole number of entries",
            bytes.len()
        )));
    }
    let mut entries: Vec<AbortedTxn> = Vec::with_capacity(bytes.len() / ENTRY_BYTES);
    for chunk in bytes.chunks_exact(ENTRY_BYTES) {
        let version = i16::from_be_bytes([chunk[0], chunk[1]]);
        if version != VERSION {
            return Err(TxnIndexError(format!("unknown entry version {version}")));
        }
        let field = |i: usize| {
            let at = 2 + i * 8;
            i64::from_be_bytes(chunk[at..at + 8].try_into().expect("8 bytes"))
        };
        let e = AbortedTxn {
            producer_id: field(0),
            first_offset: field(1),
            last_offset: field(2),
            last_stable_offset: field(3),
        };
        if e.last_offset < base || e.last_offset >= next {
            return Err(TxnIndexError(format!(
                "marker at {} outside the segment [{base}, {next})",
                e.last_offset
            )));
        }
        if e.first_offset < 0 || e.first_offset > e.last_offset {
            return Err(TxnIndexError(format!(
                "first offset {} after its marker at {}",
                e.first_offset, e.last_offset
            )));
        }
        if entries
            .last()
            .is_some_and(|p| p.last_offset >= e.last_offset)
        {
            return Err(TxnIndexError(format!(
                "marker at {} out of order",
                e.last_offset
            )));
        }
        entries.push(e);
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(pid: i64, first: i64, last: i64) -> AbortedTxn {
        AbortedTxn {
            producer_id: pid,
            first_offset: first,
            last_offset: last,
            last_stable_offset: first,
        }
    }

    #[test]
    fn round_trips_in_kafkas_layout_and_refuses_damage() {
        let entries = [txn(7, 100, 105), txn(9, 101, 120)];
        let bytes = encode(&entries);
        assert_eq!(bytes.len(), 2 * ENTRY_BYTES);
        assert_eq!(&bytes[..2], &[0, 0], "version 0");
        assert_eq!(&bytes[2..10], &7i64.to_be_bytes(), "producer id");
        assert_eq!(&bytes[10..18], &100i64.to_be_bytes(), "first offset");
        assert_eq!(&bytes[18..26], &105i64.to_be_bytes(), "marker offset");
        assert_eq!(decode(&bytes, 100, 121).unwrap(), entries);
        assert!(decode(&bytes[..33], 100, 121).is_err(), "cut short");
        assert!(
            decode(&bytes, 106, 121).is_err(),
            "marker below the segment"
        );
        assert!(decode(&bytes, 100, 120).is_err(), "marker past the segment");
        let backwards = encode(&[entries[1], entries[0]]);
        assert!(decode(&backwards, 100, 121).is_err(), "out of order");
        let mut bad = bytes.clone();
        bad[1] = 1;
        assert!(decode(&bad, 100, 121).is_err(), "version 1");
        let after = encode(&[txn(7, 106, 105)]);
        assert!(decode(&after, 100, 121).is_err(), "first after marker");
        assert_eq!(decode(&[], 0, 0).unwrap(), vec![]);
    }
}
