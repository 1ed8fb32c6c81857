//! ferrolog-io: the storage layer. It owns partition logs on disk and nothing else: no Kafka
//! requests, no replication.
//!
//! A partition is a directory of segments in Apache Kafka's layout (`<20-digit base>.log`,
//! `.index`, `.timeindex`, `.txnindex`); the `.log` files hold Kafka v2 record batches verbatim. Appends go
//! through glommio's Direct I/O (`DmaFile`) in large aligned writes with group commit; reads
//! come from a small per-log tail cache or from the files. Crash recovery verifies CRCs and cuts
//! a torn tail.
//!
//! Everything here runs on the glommio executor of the shard that owns the partition; a `Log`
//! is `Rc`, never shared across threads. Every file operation goes through [`fs::Fs`], so the
//! simulator runs the same log on a simulated disk.

pub mod batch;
pub mod fs;
pub mod log;
pub mod pool;
pub mod read_gate;
mod segment;
pub mod txn_index;
pub mod uring;

pub use fs::{Fs, GlommioFs};
pub use log::{write_file, AppendInfo, Log};
pub use segment::file_stem;
pub use txn_index::AbortedTxn;

/// Per-log settings, taken from the topic configs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// `segment.bytes`: roll to a new segment before one grows past this.
    pub segment_bytes: u64,
    /// `segment.ms`: roll a segment this old at the next append.
    pub segment_ms: i64,
    /// `index.interval.bytes`: bytes of log between two offset-index entries.
    pub index_interval_bytes: u32,
    /// Preallocate segment files in steps of this many bytes.
    pub preallocate_bytes: u64,
    /// Most bytes of recent batches kept in memory for tail reads.
    pub cache_bytes_max: usize,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1 << 30,
            segment_ms: 7 * 24 * 3600 * 1000,
            index_interval_bytes: 4096,
            preallocate_bytes: 64 << 20,
            cache_bytes_max: 1 << 20,
        }
    }
}

impl LogConfig {
    /// Bugs, not user errors: the broker validates configs before they get here.
    fn validate(&self) {
        assert!(
            self.segment_bytes >= 14,
            "segment.bytes below Kafka's minimum"
        );
        assert!(
            self.segment_bytes <= i32::MAX as u64,
            "segment.bytes above i32::MAX"
        );
        assert!(self.segment_ms >= 1, "segment.ms must be positive");
        assert!(
            self.preallocate_bytes >= 4096,
            "preallocation step below one page"
        );
    }
}

/// Why a log operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogError {
    /// A read or write of the disk failed; the message names the file and the OS error.
    #[error("storage error: {0}")]
    Io(String),
    /// Data on disk that recovery cannot repair without losing acknowledged records.
    #[error("corrupt log: {0}")]
    Corrupt(String),
    /// A batch handed to `append` or found on disk does not parse.
    #[error("invalid batch: {0}")]
    InvalidBatch(batch::BatchError),
    /// The offset is below the log start or above the log end.
    #[error("offset {requested} out of range [{log_start}, {log_end}]")]
    OffsetOutOfRange {
        requested: i64,
        log_start: i64,
        log_end: i64,
    },
    /// The offset waited on was removed by `Log::truncate` before it became durable.
    #[error("log truncated below the offset waited on")]
    Truncated,
    /// The log was dropped while a caller waited on it.
    #[error("log closed")]
    Closed,
}
