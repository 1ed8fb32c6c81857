//! One partition on the shard that owns it: its log, its idempotent-producer state, and the
//! Kafka rules for appending and reading (validation, offsets, HW).
//!
//! Unreplicated (one replica): the leader epoch is 0 and the high watermark is the durable
//! (fsynced) log end, which is what Raft's commit index is with one member; appends go
//! straight to the log. Replicated: appends go through the partition's Raft group
//! (`replica`), and HW and epoch come from it. Everything here runs on the owning shard;
//! the synchronous part of `append` runs in the order requests arrived in.

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

use futures::future::LocalBoxFuture;
use futures::FutureExt;

use bytes::{Bytes, BytesMut};
use ferrolog_io::batch::{self, BatchError, BatchHeader, ATTR_TIMESTAMP_LOG_APPEND};
use ferrolog_io::{Log, LogError};
use uuid::Uuid;

use crate::config::TopicSettings;
use crate::errors::BrokerError;
use crate::producer_state::{ProducerStates, SequenceCheck};
use crate::records::{self, RecordError, TimestampPolicy};
use crate::replica::Replica;

/// The leader epoch of every partition until replication brings Raft terms.
pub const LEADER_EPOCH: i32 = 0;
/// Bytes read per round while rebuilding producer state at open.
const RECOVERY_READ_BYTES: usize = 1 << 20;

/// What a successful produce to one partition returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub base_offset: i64,
    /// Offset after the batch: wait for it to be durable before acks=all answers.
    pub end_offset: i64,
    /// LogAppendTime topics: the time the broker stamped; otherwise -1.
    pub log_append_time_ms: i64,
    /// A retried batch that was already written: nothing new to wait for.
    pub duplicate: bool,
}

/// What `append` did with a batch.
pub enum AppendStep {
    /// Appended to the local log (unreplicated): wait for durability as acks asks.
    Local(Appended),
    /// Proposed to the Raft group (replicated): `commit` resolves once it is committed (the
    /// proposal is under way whether or not anyone waits). `reserved`: where the leader
    /// predicted it lands (a duplicate: where it already is); `crc`: the batch's CRC, which
    /// tells it from another batch at those offsets.
    Replicated {
        reserved: Appended,
        crc: u32,
        commit: LocalBoxFuture<'static, Result<Appended, BrokerError>>,
    },
}

impl AppendStep {
    /// Waits until the batch counts as written, `durable` for acks=all. Unreplicated: fsynced
    /// when `durable`, else at once. Replicated: committed on a majority when `durable`, else
    /// (acks=1) once the leader's own log holds it where predicted, fsynced, unless the
    /// proposal failed first; a leader deposed before a majority has it may lose it, as in
    /// Kafka.
    pub async fn finish(self, log: &Log, durable: bool) -> Result<Appended, BrokerError> {
        match self {
            AppendStep::Local(appended) if durable => {
                log.wait_durable(appended.end_offset)
                    .await
                    .map_err(|e| BrokerError::Storage(e.to_string()))?;
                Ok(appended)
            }
            AppendStep::Local(appended) => Ok(appended),
            AppendStep::Replicated { commit, .. } if durable => commit.await,
            AppendStep::Replicated {
                reserved,
                crc,
                commit,
            } => {
                let written = std::pin::pin!(log.wait_durable(reserved.end_offset));
                match futures::future::select(commit, written).await {
                    futures::future::Either::Left((committed, _)) => committed,
                    futures::future::Either::Right((Ok(()), commit)) => {
                        // Durable up to the predicted end; but a refused earlier proposal
                        // shifts later ones, so the batch there must be this one.
                        let there = log
                            .read(reserved.base_offset, 1, reserved.end_offset, true)
                            .await
                            .ok()
                            .and_then(|b| BatchHeader::parse(&b).ok());
                        match there {
                            Some(h)
                                if h.base_offset == reserved.base_offset
                                    && h.crc == crc
                                    && h.base_offset + i64::from(h.record_count)
                                        == reserved.end_offset =>
                            {
                                Ok(reserved)
                            }
                            _ => commit.await,
                        }
                    }
                    // Truncated: this node lost the lead and its unreplicated tail.
                    futures::future::Either::Right((Err(LogError::Truncated), _)) => {
                        Err(BrokerError::NotLeaderOrFollower)
                    }
                    futures::future::Either::Right((Err(e), _)) => {
                        Err(BrokerError::Storage(e.to_string()))
                    }
                }
            }
        }
    }
}

/// A fetch result for one partition.
#[derive(Debug, Clone)]
pub struct ReadResult {
    pub records: Bytes,
    pub high_watermark: i64,
    pub log_start_offset: i64,
}

pub struct Partition {
    pub topic: String,
    pub topic_id: Uuid,
    pub index: i32,
    pub log: Rc<Log>,
    settings: RefCell<TopicSettings>,
    producers: RefCell<ProducerStates>,
    /// The Raft group of a replicated partition.
    pub replica: Option<Replica>,
}

impl Partition {
    pub async fn open(
        base_dir: &Path,
        topic: &str,
        topic_id: Uuid,
        index: i32,
        settings: TopicSettings,
        now_ms: i64,
    ) -> Result<Rc<Partition>, LogError> {
        let dir = base_dir.join(format!("{topic}-{index}"));
        claim_directory(&dir, topic_id).await?;
        let log = Log::open(&dir, settings.log_config(), now_ms).await?;
        let partition = Partition {
            topic: topic.to_string(),
            topic_id,
            index,
            log,
            settings: RefCell::new(settings),
            producers: RefCell::new(ProducerStates::default()),
            replica: None,
        };
        partition.rebuild_producer_state().await?;
        Ok(Rc::new(partition))
    }

    /// Opens a replicated partition: its log is the Raft log of `replica`'s group.
    pub async fn open_replicated(
        base_dir: &Path,
        topic: &str,
        topic_id: Uuid,
        index: i32,
        settings: TopicSettings,
        open: impl FnOnce(
            std::path::PathBuf,
            ferrolog_io::LogConfig,
        ) -> LocalBoxFuture<'static, std::io::Result<(Rc<Log>, Replica)>>,
    ) -> Result<Rc<Partition>, LogError> {
        let dir = base_dir.join(format!("{topic}-{index}"));
        claim_directory(&dir, topic_id).await?;
        let (log, replica) = open(dir, settings.log_config())
            .await
            .map_err(|e| LogError::Io(e.to_string()))?;
        Ok(Rc::new(Partition {
            topic: topic.to_string(),
            topic_id,
            index,
            log,
            settings: RefCell::new(settings),
            // Rebuilt from the applied entries when this replica starts leading.
            producers: RefCell::new(ProducerStates::default()),
            replica: Some(replica),
        }))
    }

    /// Kafka's leader epoch: the Raft term of a replicated partition, 0 otherwise.
    pub fn leader_epoch(&self) -> i32 {
        self.replica
            .as_ref()
            .map_or(LEADER_EPOCH, |r| r.leader_epoch())
    }

    /// Resolves the next time the HW may have moved.
    pub fn hw_changed(&self) -> futures::channel::oneshot::Receiver<()> {
        match &self.replica {
            Some(r) => r.hw_changed(),
            None => self.log.durable_changed(),
        }
    }

    /// OffsetForLeaderEpoch on the leader: Kafka's fencing of the caller's current epoch,
    /// then (largest epoch <= `requested`, offset after it), or (-1, -1) when unknown.
    pub fn epoch_end_offset(
        &self,
        current_leader_epoch: i32,
        requested: i32,
    ) -> Result<(i32, i64), BrokerError> {
        let epoch = self.check_leader(current_leader_epoch)?;
        if requested == epoch {
            return Ok((epoch, self.log.end_offset()));
        }
        match &self.replica {
            Some(r) if requested < epoch => {
                Ok(r.end_offset_for_epoch(requested).unwrap_or((-1, -1)))
            }
            _ => Ok((-1, -1)),
        }
    }

    /// Checks, as Kafka does for Fetch, ListOffsets and OffsetForLeaderEpoch, the leader
    /// epoch a client says it knows (-1: it does not say) against this replica's, then that
    /// this replica leads; returns the epoch. An older epoch is FENCED_LEADER_EPOCH (the
    /// client must refresh its metadata), a newer one UNKNOWN_LEADER_EPOCH (this replica has
    /// not caught up with the election yet).
    pub fn check_leader(&self, current_leader_epoch: i32) -> Result<i32, BrokerError> {
        let epoch = self.leader_epoch();
        if current_leader_epoch > epoch {
            return Err(BrokerError::UnknownLeaderEpoch);
        }
        if current_leader_epoch >= 0 && current_leader_epoch < epoch {
            return Err(BrokerError::FencedLeaderEpoch);
        }
        if !self.is_leader() {
            return Err(BrokerError::NotLeaderOrFollower);
        }
        Ok(epoch)
    }

    /// `check_leader`, and for a replicated partition that the leader holds a current lease
    /// (`Replica::read_lease`): what Fetch and ListOffsets check before they answer.
    /// (OffsetForLeaderEpoch checks the leader only.)
    pub async fn check_read(&self, current_leader_epoch: i32) -> Result<i32, BrokerError> {
        let epoch = self.check_leader(current_leader_epoch)?;
        self.read_lease().await?;
        Ok(epoch)
    }

    /// A current lease to answer reads with (always, unreplicated).
    pub async fn read_lease(&self) -> Result<(), BrokerError> {
        match &self.replica {
            Some(r) => r.read_lease().await,
            None => Ok(()),
        }
    }

    /// Whether this replica serves produce and consumer fetches.
    pub fn is_leader(&self) -> bool {
        self.replica.as_ref().is_none_or(|r| r.is_leader())
    }

    /// How many replicas are in sync (as the leader sees it).
    pub fn in_sync_replicas(&self) -> usize {
        self.replica
            .as_ref()
            .map_or(1, |r| r.in_sync_replicas().len())
    }

    /// Restores the producer state, so a producer that retries across a broker restart is
    /// still recognised: the newest snapshot (written at each segment roll) at or below the
    /// log end, then the batch headers after it. Without a snapshot, the active segment.
    async fn rebuild_producer_state(&self) -> Result<(), LogError> {
        let end = self.log.durable_offset();
        let mut offset = self.log.active_base_offset().max(self.log.start_offset());
        if let Some((at, states)) = load_snapshot(self.log.dir(), end) {
            if at <= offset {
                *self.producers.borrow_mut() = states;
                offset = at.max(self.log.start_offset());
            }
        }
        while offset < end {
            let bytes = self
                .log
                .read(offset, RECOVERY_READ_BYTES, end, true)
                .await?;
            if bytes.is_empty() {
                break;
            }
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let h = BatchHeader::parse(rest).map_err(LogError::InvalidBatch)?;
                self.producers.borrow_mut().record(&h);
                offset = h.next_offset();
                rest = &rest[h.total_bytes()..];
            }
        }
        Ok(())
    }

    pub fn settings(&self) -> TopicSettings {
        self.settings.borrow().clone()
    }

    pub fn set_settings(&self, settings: TopicSettings) {
        self.log.set_config(settings.log_config());
        *self.settings.borrow_mut() = settings;
    }

    /// HW: offset after the last committed batch (unreplicated: the last fsynced one).
    pub fn high_watermark(&self) -> i64 {
        match &self.replica {
            Some(r) => r.high_watermark(),
            None => self.log.durable_offset(),
        }
    }

    /// Moves the log start to `offset`, at or below the HW, and returns it. Replicated (the
    /// leader only): through a Raft entry that every replica applies and acts on
    /// (`Replica::propose_log_start`); answers once the leader's own log starts there.
    pub async fn move_log_start(&self, offset: i64, now_ms: i64) -> Result<i64, BrokerError> {
        let Some(r) = &self.replica else {
            return self
                .log
                .advance_start(offset)
                .await
                .map_err(BrokerError::from_log);
        };
        if offset > self.log.start_offset() {
            r.propose_log_start(&self.producers, self.log.end_offset(), offset, now_ms)
                .await?;
            r.apply_retention(&self.log, now_ms, None, true)
                .await
                .map_err(|e| BrokerError::RequestTimedOut(e.to_string()))?;
        }
        Ok(self.log.start_offset())
    }

    /// Validates one produced batch and appends it. Synchronous: the caller awaits
    /// durability separately (`wait_durable`). `transactional_id` tells whether the request
    /// named one (Kafka checks it before it looks at transactional batches).
    pub fn append(
        self: &Rc<Self>,
        records: &Bytes,
        transactional_id: bool,
        now_ms: i64,
    ) -> Result<AppendStep, BrokerError> {
        if let Some(e) = self.log.failure() {
            return Err(BrokerError::Storage(e.to_string()));
        }
        if let Some(replica) = &self.replica {
            replica.ready(&self.producers, self.log.end_offset())?;
        }
        let settings = self.settings.borrow().clone();
        // Kafka answers INVALID_RECORD for anything that is not one whole v2 batch, and
        // CORRUPT_MESSAGE only for a CRC mismatch.
        let header =
            BatchHeader::parse(records).map_err(|e| BrokerError::InvalidRecord(e.to_string()))?;
        if header.total_bytes() > settings.max_message_bytes {
            return Err(BrokerError::MessageTooLarge(format!(
                "batch of {} bytes exceeds max.message.bytes={}",
                header.total_bytes(),
                settings.max_message_bytes
            )));
        }
        let header = batch::verify(records).map_err(|e| match e {
            BatchError::CrcMismatch { .. } => BrokerError::CorruptMessage(e.to_string()),
            other => BrokerError::InvalidRecord(other.to_string()),
        })?;
        if header.total_bytes() != records.len() {
            return Err(BrokerError::InvalidRecord(
                "produce requests must carry exactly one record batch per partition".into(),
            ));
        }
        if header.is_control() {
            return Err(BrokerError::InvalidRecord(
                "control batches are written by the broker only".into(),
            ));
        }
        if header.is_transactional() {
            // No transaction coordinator yet: a transactional batch cannot be part of an
            // ongoing transaction here.
            return Err(if transactional_id {
                BrokerError::InvalidTxnState
            } else {
                BrokerError::TransactionalIdAuthorizationFailed
            });
        }
        let policy = TimestampPolicy {
            compacted: settings.compacted,
            log_append_time: settings.log_append_time,
            before_max_ms: settings.timestamp_before_max_ms,
            after_max_ms: settings.timestamp_after_max_ms,
            now_ms,
        };
        if header.record_count < 1 || header.last_offset_delta != header.record_count - 1 {
            // Kafka: a v2 batch's offsets must be exactly 0..count-1.
            return Err(BrokerError::InvalidRecord(format!(
                "batch has {} records but last offset delta {}",
                header.record_count, header.last_offset_delta
            )));
        }
        let max_timestamp = records::validate(&header, records, &policy).map_err(|e| match e {
            RecordError::Timestamp { index, .. } => BrokerError::RecordErrors {
                timestamp: true,
                message: "One or more records have been rejected due to invalid timestamp".into(),
                records: vec![(index, e.to_string())],
            },
            RecordError::MissingKey { index } => {
                let reason = format!(
                    "Compacted topic cannot accept message without key in topic partition {}-{}.",
                    self.topic, self.index
                );
                BrokerError::RecordErrors {
                    timestamp: false,
                    message: format!(
                        "One or more records have been rejected due to 1 record errors in total, and only showing the first three errors at most: [{reason}]"
                    ),
                    records: vec![(index, reason)],
                }
            }
            RecordError::UnknownCodec(_) => BrokerError::CorruptMessage(e.to_string()),
            RecordError::Invalid(m) => BrokerError::InvalidRecord(m),
        })?;
        match self.producers.borrow().check(&header) {
            SequenceCheck::Accept => {}
            SequenceCheck::Duplicate {
                base_offset,
                timestamp,
            } => {
                let appended = Appended {
                    base_offset,
                    end_offset: base_offset + i64::from(header.last_offset_delta) + 1,
                    // Kafka answers a duplicate with the stored batch's max timestamp, whatever
                    // the topic's timestamp type.
                    log_append_time_ms: timestamp,
                    duplicate: true,
                };
                if self.replica.is_none() {
                    return Ok(AppendStep::Local(appended));
                }
                // Proposed, maybe not yet committed: answered once this very batch is.
                let me = self.clone();
                return Ok(AppendStep::Replicated {
                    reserved: appended,
                    crc: header.crc,
                    commit: async move {
                        let replica = me.replica.as_ref().expect("replicated");
                        replica
                            .wait_duplicate(&header, base_offset, appended.end_offset)
                            .await?;
                        Ok(appended)
                    }
                    .boxed_local(),
                });
            }
            SequenceCheck::OutOfOrder => return Err(BrokerError::OutOfOrderSequence),
            SequenceCheck::StaleEpoch => return Err(BrokerError::InvalidProducerEpoch),
        }
        let mut bytes = BytesMut::from(&records[..]);
        let log_append_time_ms = if settings.log_append_time {
            restamp(&mut bytes, ATTR_TIMESTAMP_LOG_APPEND, now_ms);
            now_ms
        } else {
            // Retention and time lookups use the header's max timestamp; like Kafka, take it
            // from the records rather than trusting the producer.
            if max_timestamp != header.max_timestamp {
                restamp(&mut bytes, 0, max_timestamp);
            }
            -1
        };
        if let Some(replica) = &self.replica {
            // A ready leader is the only writer of its log in its term, so it knows where
            // the batch will land; its producer state records it at once, so pipelined
            // batches of one producer pass the sequence check. acks=all answers with the
            // offsets the commit reports, acks=1 with these once it finds the batch there.
            let reservation = replica.reserve(i64::from(header.record_count));
            let base_offset = reservation.base_offset;
            let crc = BatchHeader::parse(&bytes)
                .expect("a verified batch, restamped")
                .crc;
            let appended = Appended {
                base_offset,
                end_offset: base_offset + i64::from(header.record_count),
                log_append_time_ms,
                duplicate: false,
            };
            self.producers.borrow_mut().record(&BatchHeader {
                base_offset,
                ..header
            });
            // Proposed now, in request order, whatever the caller waits for.
            let (tx, rx) = futures::channel::oneshot::channel();
            let me = self.clone();
            let bytes = bytes.freeze();
            glommio::spawn_local(async move {
                let replica = me.replica.as_ref().expect("replicated");
                let committed = replica.replicate(bytes, reservation).await.map(|(base, end)| {
                    if base != appended.base_offset {
                        // An earlier proposal was refused after this one went out (see
                        // `Replica::replicate`); the log's word wins.
                        tracing::warn!(topic = %me.topic, partition = me.index, predicted = appended.base_offset,
                            actual = base, "replicated batch landed at another offset than predicted");
                    }
                    Appended {
                        base_offset: base,
                        end_offset: end,
                        ..appended
                    }
                });
                let _ = tx.send(committed);
            })
            .detach();
            return Ok(AppendStep::Replicated {
                reserved: appended,
                crc,
                commit: async move { rx.await.unwrap_or(Err(BrokerError::NotLeaderOrFollower)) }
                    .boxed_local(),
            });
        }
        let active_before = self.log.active_base_offset();
        let info = self
            .log
            .append(bytes, LEADER_EPOCH, now_ms)
            .map_err(|e| BrokerError::Storage(e.to_string()))?;
        if self.log.active_base_offset() != active_before {
            // A roll: snapshot the producer state as of the new segment's start (Kafka does
            // the same), so a restart need not replay the whole log.
            self.write_snapshot(info.base_offset);
        }
        let stored = BatchHeader {
            base_offset: info.base_offset,
            ..header
        };
        self.producers.borrow_mut().record(&stored);
        Ok(AppendStep::Local(Appended {
            base_offset: info.base_offset,
            end_offset: info.last_offset + 1,
            log_append_time_ms,
            duplicate: false,
        }))
    }

    fn write_snapshot(&self, at: i64) {
        let path = self
            .log
            .dir()
            .join(format!("{}.snapshot", ferrolog_io::file_stem(at)));
        let bytes =
            serde_json::to_vec(&*self.producers.borrow()).expect("producer state serialises");
        let dir = self.log.dir().to_path_buf();
        glommio::spawn_local(async move {
            if let Err(e) = ferrolog_io::write_file(&path, bytes).await {
                tracing::warn!(path = %path.display(), error = %e, "producer snapshot not written");
                return;
            }
            prune_snapshots(&dir, at);
        })
        .detach();
    }

    /// Reads from `offset` up to the HW; `first_in_response`: the first batch may exceed
    /// `max_bytes` (KIP-74), otherwise an oversized batch is left for a later fetch.
    pub async fn read(
        &self,
        offset: i64,
        max_bytes: usize,
        first_in_response: bool,
    ) -> Result<ReadResult, BrokerError> {
        // Consumers read from the leader (no KIP-392 follower fetching).
        if !self.is_leader() {
            return Err(BrokerError::NotLeaderOrFollower);
        }
        let hw = self.high_watermark();
        let records = self
            .log
            .read(offset, max_bytes, hw, first_in_response)
            .await
            .map_err(BrokerError::from_log)?;
        Ok(ReadResult {
            records,
            high_watermark: hw,
            log_start_offset: self.log.start_offset(),
        })
    }

    /// ListOffsets by timestamp: the first record with timestamp >= `timestamp`, as
    /// (offset, timestamp), or None when every record is older.
    pub async fn offset_for_timestamp(
        &self,
        timestamp: i64,
    ) -> Result<Option<(i64, i64)>, BrokerError> {
        let hw = self.high_watermark();
        let Some(batch_bytes) = self
            .log
            .find_batch_by_timestamp(timestamp, hw)
            .await
            .map_err(BrokerError::from_log)?
        else {
            return Ok(None);
        };
        let header =
            BatchHeader::parse(&batch_bytes).map_err(|e| BrokerError::Storage(e.to_string()))?;
        if header.attributes & ATTR_TIMESTAMP_LOG_APPEND != 0 {
            return Ok(Some((header.base_offset, header.max_timestamp)));
        }
        let mut found = None;
        records::for_each_record(&header, &batch_bytes, |r| {
            if found.is_none() && r.timestamp >= timestamp {
                found = Some((header.base_offset + r.offset_delta, r.timestamp));
            }
            Ok(())
        })
        .map_err(|e| BrokerError::Storage(format!("stored batch does not decode: {e}")))?;
        Ok(found.or(Some((header.base_offset, header.max_timestamp))))
    }

    /// ListOffsets -3 (KIP-734): the offset of the record with the largest timestamp.
    pub async fn max_timestamp_offset(&self) -> Result<Option<(i64, i64)>, BrokerError> {
        let Some((max_ts, batch_offset)) = self.log.max_timestamp() else {
            return Ok(None);
        };
        let hw = self.high_watermark();
        let bytes = self
            .log
            .read(batch_offset, 1, hw, true)
            .await
            .map_err(BrokerError::from_log)?;
        if bytes.is_empty() {
            return Ok(None);
        }
        let header = BatchHeader::parse(&bytes).map_err(|e| BrokerError::Storage(e.to_string()))?;
        if header.attributes & ATTR_TIMESTAMP_LOG_APPEND != 0 {
            // Every record carries the append time; Kafka names the first.
            return Ok(Some((header.base_offset, max_ts)));
        }
        let mut found = (header.base_offset, max_ts);
        let mut best = i64::MIN;
        records::for_each_record(&header, &bytes, |r| {
            if r.timestamp > best {
                best = r.timestamp;
                found = (header.base_offset + r.offset_delta, r.timestamp);
            }
            Ok(())
        })
        .map_err(|e| BrokerError::Storage(format!("stored batch does not decode: {e}")))?;
        Ok(Some(found))
    }
}

/// Snapshots kept per partition: the newest few are enough to skip replaying old segments.
const SNAPSHOTS_KEPT: usize = 2;

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
        let path = dir.join(format!("{}.snapshot", ferrolog_io::file_stem(at)));
        let bytes = std::fs::read(&path).ok()?;
        match serde_json::from_slice(&bytes) {
            Ok(states) => Some((at, states)),
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
        let _ = std::fs::remove_file(dir.join(format!("{}.snapshot", ferrolog_io::file_stem(at))));
    }
}

/// Makes sure `dir` belongs to this topic id, as Kafka's `partition.metadata` does: a
/// directory left by a deleted topic of the same name (a crash between deleting the topic and
/// its files) is removed instead of being adopted by the new topic.
async fn claim_directory(dir: &Path, topic_id: Uuid) -> Result<(), LogError> {
    let marker = dir.join("partition.metadata");
    let expected = format!("version: 0\ntopic_id: {topic_id}\n");
    match std::fs::read_to_string(&marker) {
        Ok(found) if found == expected => return Ok(()),
        Ok(found) => {
            tracing::warn!(dir = %dir.display(), %found, "partition directory of a deleted topic; removing it");
            std::fs::remove_dir_all(dir)
                .map_err(|e| LogError::Io(format!("removing {}: {e}", dir.display())))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(LogError::Io(format!("reading {}: {e}", marker.display()))),
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| LogError::Io(format!("creating {}: {e}", dir.display())))?;
    ferrolog_io::write_file(&marker, expected.into_bytes()).await
}

/// Sets attribute bits and the max timestamp, which the CRC covers, and recomputes the CRC:
/// for LogAppendTime topics, and when a producer's header disagrees with its records. The
/// only places a stored batch differs from what the producer sent beyond offset and epoch.
fn restamp(batch_bytes: &mut [u8], attributes_or: i16, max_timestamp: i64) {
    const ATTRIBUTES: usize = 21;
    const MAX_TIMESTAMP: usize = 35;
    const CRC: usize = 17;
    let attrs =
        i16::from_be_bytes([batch_bytes[ATTRIBUTES], batch_bytes[ATTRIBUTES + 1]]) | attributes_or;
    batch_bytes[ATTRIBUTES..ATTRIBUTES + 2].copy_from_slice(&attrs.to_be_bytes());
    batch_bytes[MAX_TIMESTAMP..MAX_TIMESTAMP + 8].copy_from_slice(&max_timestamp.to_be_bytes());
    let crc = batch::compute_crc(batch_bytes);
    batch_bytes[CRC..CRC + 4].copy_from_slice(&crc.to_be_bytes());
    assert!(
        batch::verify(batch_bytes).is_ok(),
        "re-stamped batch must verify"
    );
}
