//! A partition with one replica: it always leads, in epoch 0, and its commit is the fsync
//! (the HW is the durable log end), which is what Raft's commit index is with one member.
//!
//! Its producer state survives a restart through snapshots written at each segment roll
//! (as Kafka's `.snapshot` files) and the batches after the newest one. A marker that
//! aborts a transaction goes into the log's aborted-transaction index as it is appended.

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

use bytes::BytesMut;
use ferrolog_io::batch::BatchHeader;
use ferrolog_io::{Log, LogConfig, LogError};

use super::{Opened, Replication};
use crate::errors::BrokerError;
use crate::partition::Appended;
use crate::producer_state::{marker_of, ProducerStates};

/// The leader epoch of an unreplicated partition.
pub const LEADER_EPOCH: i32 = 0;
/// Bytes read per round while rebuilding producer state at open.
const RECOVERY_READ_BYTES: usize = 1 << 20;
/// Snapshots kept per partition: the newest few are enough to skip replaying old segments.
const SNAPSHOTS_KEPT: usize = 2;

/// Always the leader (`Replication::is_leader`), which `group::follow_leadership` relies on
/// to coordinate an unreplicated offsets partition's groups from its open on.
pub struct Local {
    log: Rc<Log>,
}

impl Local {
    /// Opens the log in `dir` and rebuilds its producer state.
    pub async fn open(dir: &Path, config: LogConfig, now_ms: i64) -> Result<Opened, LogError> {
        let log = Log::open(dir, config, now_ms).await?;
        let producers = rebuild_producer_state(&log).await?;
        Ok(Opened {
            log: log.clone(),
            replication: Replication::Local(Local { log }),
            producers,
        })
    }

    /// The durable (fsynced) log end.
    pub fn high_watermark(&self) -> i64 {
        self.log.durable_offset()
    }

    pub fn hw_changed(&self) -> futures::channel::oneshot::Receiver<()> {
        self.log.durable_changed()
    }

    /// Appends `bytes` (a validated batch with header `header`) where the log ends, and
    /// records it in `producers` there.
    pub fn append(
        &self,
        producers: &RefCell<ProducerStates>,
        bytes: BytesMut,
        header: &BatchHeader,
        log_append_time_ms: i64,
        now_ms: i64,
    ) -> Result<Appended, BrokerError> {
        let marker = marker_of(header, &bytes);
        let active_before = self.log.active_base_offset();
        let info = self
            .log
            .append(bytes, LEADER_EPOCH, now_ms)
            .map_err(|e| BrokerError::Storage(e.to_string()))?;
        if self.log.active_base_offset() != active_before {
            // A roll: snapshot the producer state as of the new segment's start (Kafka does
            // the same), so a restart need not replay the whole log.
            write_snapshot(&self.log, &producers.borrow(), info.base_offset);
        }
        let header = BatchHeader {
            base_offset: info.base_offset,
            ..*header
        };
        let mut producers = producers.borrow_mut();
        if let Some(closed) = producers.apply(&header, marker).filter(|c| c.aborted) {
            self.log.add_aborted(producers.aborted_entry(&closed));
        }
        producers.forget_closed_below(self.log.durable_offset());
        Ok(Appended {
            base_offset: info.base_offset,
            end_offset: info.last_offset + 1,
            log_append_time_ms,
            duplicate: false,
        })
    }
}

/// Restores the producer state, so a producer that retries across a broker restart is still
/// recognised and open transactions still hold the LSO: the newest snapshot at or below the
/// active segment's base, then the batches after it. Aborted transactions are in the segments'
/// indexes up to there, and are recorded again after it (an index that did not decode at open
/// moves the start down to its segment). Without a snapshot, the whole log.
async fn rebuild_producer_state(log: &Rc<Log>) -> Result<ProducerStates, LogError> {
    let end = log.durable_offset();
    let start = log.start_offset();
    let needed = log
        .txn_index_lost_from()
        .map_or(log.active_base_offset(), |lost| {
            lost.min(log.active_base_offset())
        });
    let (mut offset, mut producers) = match load_snapshot(log.dir(), needed) {
        Some((at, states)) => (at.max(start), states),
        None => (start, ProducerStates::default()),
    };
    while offset < end {
        let bytes = log.read(offset, RECOVERY_READ_BYTES, end, true).await?;
        if bytes.is_empty() {
            break;
        }
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let h = BatchHeader::parse(rest).map_err(LogError::InvalidBatch)?;
            let marker = marker_of(&h, rest);
            if let Some(closed) = producers.apply(&h, marker).filter(|c| c.aborted) {
                log.add_aborted(producers.aborted_entry(&closed));
            }
            offset = h.next_offset();
            rest = &rest[h.total_bytes()..];
        }
    }
    Ok(producers)
}

fn snapshot_path(dir: &Path, at: i64) -> std::path::PathBuf {
    dir.join(format!("{}.snapshot", ferrolog_io::file_stem(at)))
}

fn write_snapshot(log: &Log, producers: &ProducerStates, at: i64) {
    let path = snapshot_path(log.dir(), at);
    let bytes = serde_json::to_vec(producers).expect("producer state serialises");
    let dir = log.dir().to_path_buf();
    glommio::spawn_local(async move {
        if let Err(e) = ferrolog_io::write_file(&path, bytes).await {
            tracing::warn!(path = %path.display(), error = %e, "producer snapshot not written");
            return;
        }
        prune_snapshots(&dir, at);
    })
    .detach();
}

fn snapshot_offsets(dir: &Path) -> Vec<i64> {
    let mut offsets: Vec<i64> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".snapshot")?.parse().ok()
        })
        .collect();
    offsets.sort_unstable();
    offsets
}

/// The newest readable snapshot at or below `end`.
fn load_snapshot(dir: &Path, end: i64) -> Option<(i64, ProducerStates)> {
    snapshot_offsets(dir).into_iter().rev().filter(|&at| at <= end).find_map(|at| {
        let path = snapshot_path(dir, at);
        let bytes = std::fs::read(&path).ok()?;
        match serde_json::from_slice::<ProducerStates>(&bytes) {
            Ok(states) => Some((at, states.reindex())),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "ignoring a damaged producer snapshot");
                None
            }
        }
    })
}

fn prune_snapshots(dir: &Path, newest: i64) {
    let offsets = snapshot_offsets(dir);
    let keep_from = offsets.len().saturating_sub(SNAPSHOTS_KEPT);
    for at in offsets
        .into_iter()
        .take(keep_from)
        .filter(|&at| at < newest)
    {
        let _ = std::fs::remove_file(snapshot_path(dir, at));
    }
}
