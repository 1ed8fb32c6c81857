//! One segment of a partition log: `<base>.log`, `<base>.index`, `<base>.timeindex`, and
//! `<base>.txnindex` when a transaction was aborted in it (`txn_index`).
//!
//! The `.log` file holds whole record batches back to back. The offset index maps a relative
//! offset to a byte position, one entry per `index.interval.bytes` of log; the time index maps
//! the largest timestamp seen so far to the relative offset of the batch that carried it. Both
//! indexes live in memory and are written to disk in Kafka's layout (big-endian `(i32 rel,
//! i32 pos)` and `(i64 ts, i32 rel)`) when the segment is closed; they are rebuilt from the log
//! when missing or inconsistent.

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::batch::BatchHeader;
use crate::fs::Fs;
use crate::txn_index::AbortedTxn;

/// File name stem of a segment: its base offset in 20 digits, as Kafka names them.
pub fn file_stem(base_offset: i64) -> String {
    format!("{base_offset:020}")
}

static NEXT_GENERATION: AtomicU64 = AtomicU64::new(0);

/// In-memory state of one segment. Owned by its `Log`; only the owning shard touches it.
pub(crate) struct Segment<F: Fs> {
    pub base_offset: i64,
    /// Unique to this segment among all a process makes: a segment made again at the same
    /// base (a restart or a cut) is another segment, and a read planned on the old one must
    /// not cache a handle for the new one.
    pub generation: u64,
    /// `<dir>/<20-digit base>` without extension.
    pub path_stem: PathBuf,
    /// Created by the flusher on first write; `None` for a segment nothing was written to yet.
    pub file: Option<Rc<F::File>>,
    /// Buffered handle for reads (see `log::open_reader`), opened on the first disk read.
    pub reader: Option<Rc<F::Reader>>,
    /// Logical bytes appended (accepted into memory).
    pub size: u64,
    /// Bytes written to the file and fsynced: the readable, durable part.
    pub synced: u64,
    /// Bytes of the file reserved by fallocate.
    pub allocated: u64,
    /// Sparse offset index: (offset - base, byte position).
    pub index: Vec<(u32, u32)>,
    /// Sparse time index: (largest timestamp so far, offset - base).
    pub time_index: Vec<(i64, u32)>,
    pub bytes_since_index: u32,
    pub max_timestamp: i64,
    /// Base offset of the batch that carried `max_timestamp`.
    pub max_timestamp_batch: i64,
    /// Offset after the last batch of this segment.
    pub next_offset: i64,
    /// Wall-clock time the segment was opened, for `segment.ms`.
    pub created_ms: i64,
    /// No more appends: a newer segment exists.
    pub closed: bool,
    /// Closed, fully written, trimmed, and its index files written.
    pub finalized: bool,
    /// Copy of the partial last page on disk, `[synced rounded down to 4096, synced)`, which
    /// the next Direct I/O write rewrites whole.
    pub tail: Vec<u8>,
    /// Transactions aborted by a marker in this segment, in marker order.
    pub aborted: Vec<AbortedTxn>,
    /// Whether `<base>.txnindex` holds `aborted` as it is (the flusher writes it otherwise).
    pub aborted_synced: bool,
}

impl<F: Fs> Segment<F> {
    pub fn new(dir: &Path, base_offset: i64, now_ms: i64) -> Segment<F> {
        Segment {
            base_offset,
            generation: NEXT_GENERATION.fetch_add(1, Ordering::Relaxed),
            path_stem: dir.join(file_stem(base_offset)),
            file: None,
            reader: None,
            size: 0,
            synced: 0,
            allocated: 0,
            index: Vec::new(),
            time_index: Vec::new(),
            bytes_since_index: 0,
            max_timestamp: -1,
            max_timestamp_batch: base_offset,
            next_offset: base_offset,
            created_ms: now_ms,
            closed: false,
            finalized: false,
            tail: Vec::new(),
            aborted: Vec::new(),
            aborted_synced: true,
        }
    }

    pub fn log_path(&self) -> PathBuf {
        self.path_stem.with_extension("log")
    }

    /// Makes this another segment for reads planned before now: a truncation calls it before
    /// it cuts the file in place, so a read that was under way reads again.
    pub fn renew_generation(&mut self) {
        self.generation = NEXT_GENERATION.fetch_add(1, Ordering::Relaxed);
    }

    pub fn index_path(&self) -> PathBuf {
        self.path_stem.with_extension("index")
    }

    pub fn time_index_path(&self) -> PathBuf {
        self.path_stem.with_extension("timeindex")
    }

    pub fn txn_index_path(&self) -> PathBuf {
        self.path_stem.with_extension("txnindex")
    }

    /// Every file of this segment.
    pub fn paths(&self) -> [PathBuf; 4] {
        [
            self.log_path(),
            self.index_path(),
            self.time_index_path(),
            self.txn_index_path(),
        ]
    }

    /// Adds an aborted transaction whose marker is in this segment, in marker order; one
    /// already known (the same marker) is left as it is. Returns whether it was new.
    pub fn add_aborted(&mut self, txn: AbortedTxn) -> bool {
        let at = self
            .aborted
            .partition_point(|e| e.last_offset < txn.last_offset);
        if self
            .aborted
            .get(at)
            .is_some_and(|e| e.last_offset == txn.last_offset)
        {
            return false;
        }
        self.aborted.insert(at, txn);
        self.aborted_synced = false;
        true
    }

    /// Whether a batch at `position` with this header can be tracked (offsets in order,
    /// relative offset and position within the index's 32 bits).
    pub fn fits(&self, header: &BatchHeader, position: u64) -> bool {
        header.base_offset >= self.next_offset
            && u32::try_from(header.last_offset() - self.base_offset).is_ok()
            && u32::try_from(position).is_ok()
    }

    /// Records a batch appended at byte `position`, updating both sparse indexes.
    pub fn track_batch(&mut self, header: &BatchHeader, position: u64, interval_bytes: u32) {
        assert!(
            header.base_offset >= self.next_offset,
            "offsets go backwards"
        );
        assert!(position == self.size, "batch not at the segment end");
        let relative = u32::try_from(header.base_offset - self.base_offset)
            .expect("relative offset fits the index");
        let position32 = u32::try_from(position).expect("segment position fits the index");
        if header.max_timestamp > self.max_timestamp {
            self.max_timestamp = header.max_timestamp;
            self.max_timestamp_batch = header.base_offset;
        }
        if self.index.is_empty() || self.bytes_since_index >= interval_bytes {
            self.index.push((relative, position32));
            // As Kafka's time index: the running maximum and the first batch that reached it,
            // so every batch before an entry's offset is older than the entry's timestamp.
            self.seal_time_index();
            self.bytes_since_index = 0;
        }
        self.bytes_since_index = self
            .bytes_since_index
            .saturating_add(header.total_bytes() as u32);
        self.size += header.total_bytes() as u64;
        self.next_offset = header.next_offset();
    }

    /// Byte position from which a scan for `offset` must start.
    pub fn position_for(&self, offset: i64) -> u64 {
        let relative = (offset - self.base_offset).max(0);
        let i = self
            .index
            .partition_point(|&(rel, _)| i64::from(rel) <= relative);
        if i == 0 {
            0
        } else {
            u64::from(self.index[i - 1].1)
        }
    }

    /// Offset from which a scan for the first timestamp >= `timestamp` must start.
    pub fn offset_for_timestamp(&self, timestamp: i64) -> i64 {
        let i = self.time_index.partition_point(|&(ts, _)| ts < timestamp);
        if i == 0 {
            self.base_offset
        } else {
            self.base_offset + i64::from(self.time_index[i - 1].1)
        }
    }

    /// Adds a time-index entry for the running maximum if it grew. Also called when the
    /// segment is closed, so a reopened segment knows its largest timestamp from the index
    /// alone (Kafka does the same on roll).
    pub fn seal_time_index(&mut self) {
        if self.max_timestamp > self.time_index.last().map_or(-1, |e| e.0) {
            let relative = u32::try_from(self.max_timestamp_batch - self.base_offset)
                .expect("relative offset fits the index");
            self.time_index.push((self.max_timestamp, relative));
        }
    }

    pub fn encode_index(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.index.len() * 8);
        for &(rel, pos) in &self.index {
            out.extend_from_slice(&rel.to_be_bytes());
            out.extend_from_slice(&pos.to_be_bytes());
        }
        out
    }

    pub fn encode_time_index(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.time_index.len() * 12);
        for &(ts, rel) in &self.time_index {
            out.extend_from_slice(&ts.to_be_bytes());
            out.extend_from_slice(&rel.to_be_bytes());
        }
        out
    }

    /// Loads index files written at close. Returns false (and loads nothing) when a file is
    /// missing or does not fit this segment, so the caller rebuilds from the log.
    pub fn load_indexes(&mut self, index: &[u8], time_index: &[u8], log_size: u64) -> bool {
        // Both files are written when the segment is finished, the offset index first: an
        // empty time index beside a full offset index is a finish cut short (or a deletion
        // half undone by a power loss), and trusting it would leave the segment without a
        // timestamp for good, which stalls time-based retention. (A segment whose batches
        // all carry no timestamp is rescanned at every open: rare, and only a scan.)
        if index.is_empty()
            || time_index.is_empty()
            || !index.len().is_multiple_of(8)
            || !time_index.len().is_multiple_of(12)
        {
            return false;
        }
        let mut entries = Vec::with_capacity(index.len() / 8);
        for chunk in index.chunks_exact(8) {
            let rel = u32::from_be_bytes(chunk[0..4].try_into().expect("4 bytes"));
            let pos = u32::from_be_bytes(chunk[4..8].try_into().expect("4 bytes"));
            if let Some(&(prev_rel, prev_pos)) = entries.last() {
                if rel <= prev_rel || pos <= prev_pos {
                    return false;
                }
            }
            if u64::from(pos) >= log_size {
                return false;
            }
            entries.push((rel, pos));
        }
        let mut times = Vec::with_capacity(time_index.len() / 12);
        for chunk in time_index.chunks_exact(12) {
            let ts = i64::from_be_bytes(chunk[0..8].try_into().expect("8 bytes"));
            let rel = u32::from_be_bytes(chunk[8..12].try_into().expect("4 bytes"));
            if times
                .last()
                .is_some_and(|&(prev, _): &(i64, u32)| ts <= prev)
            {
                return false;
            }
            times.push((ts, rel));
        }
        if let Some(&(ts, rel)) = times.last() {
            self.max_timestamp = ts;
            self.max_timestamp_batch = self.base_offset + i64::from(rel);
        }
        self.index = entries;
        self.time_index = times;
        true
    }
}
