//! Replication: the one interface a partition writes and reads through, and its two
//! implementations.
//!
//! - `local::Local`, a partition with one replica: it always leads, in epoch 0, and a batch
//!   commits when the log has fsynced it (what Raft's commit index is with one member).
//! - `raft::Replica`, a partition with more: one openraft group whose log is the partition
//!   log; it commits on a majority's fsync.
//!
//! `Partition` holds a `Replication` and never asks which one it is: the validation, the
//! producer-sequence check and the offsets a produce is answered with are the same for both.
//! The offsets of a new batch come from the log that stores it: `Local` appends it at once and
//! answers with where it went, and the Raft leader's answer is where the committed entry is
//! in its log (a batch that did not land where the leader's producer state expected it is
//! refused, see `raft::Replica::replicate`). The shard's Raft services (the transport, the
//! coalesced beats and quiescence in `peers`, the controller's leader reports) concern only
//! Raft groups and reach them through `Replication::raft`.

pub mod host;
pub mod local;
pub mod peers;
pub mod preferred;
pub mod raft;

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;

use bytes::BytesMut;
use ferrolog_io::batch::BatchHeader;
use ferrolog_io::{Log, LogConfig, LogError};
use ferrolog_raft::wire::Handover;
use futures::future::LocalBoxFuture;
use futures::FutureExt;

use crate::config::TopicSettings;
use crate::errors::BrokerError;
use crate::partition::Appended;
use crate::producer_state::ProducerStates;

pub use local::Local;
pub use raft::{Placement, Replica};

/// How a partition is replicated.
pub enum Replication {
    Local(Local),
    Raft(Rc<Replica>),
}

/// What `Replication::open` gives a partition: its log, how it replicates, and the producer
/// state it starts with.
pub struct Opened {
    pub log: Rc<Log>,
    pub replication: Replication,
    pub producers: ProducerStates,
}

/// What appending a batch did, until `finish` says it counts as written.
pub struct AppendStep(Step);

enum Step {
    /// In the local log.
    Local(Appended),
    /// Refused, once the refusal is sure (`Replication::out_of_order`).
    Refused(LocalBoxFuture<'static, BrokerError>),
    /// Proposed to the Raft group: `commit` resolves once it is committed (the proposal is
    /// under way whether or not anyone waits). `reserved`: where the leader's producer state
    /// has it (a duplicate: where it already is); `crc`: the batch's CRC, which tells it
    /// from another batch at those offsets.
    Raft {
        reserved: Appended,
        crc: u32,
        commit: LocalBoxFuture<'static, Result<Appended, BrokerError>>,
    },
}

impl AppendStep {
    /// Waits until the batch counts as written, `durable` for acks=all. Local: fsynced when
    /// `durable`, else at once. Raft: committed on a majority when `durable`, else (acks=1)
    /// once the leader's own log holds it where expected, fsynced, unless the proposal
    /// failed first; a leader deposed before a majority has it may lose it, as in Kafka.
    pub async fn finish(self, log: &Log, durable: bool) -> Result<Appended, BrokerError> {
        match self.0 {
            Step::Local(appended) if durable => {
                log.wait_durable(appended.end_offset)
                    .await
                    .map_err(|e| BrokerError::Storage(e.to_string()))?;
                Ok(appended)
            }
            Step::Local(appended) => Ok(appended),
            Step::Refused(refusal) => Err(refusal.await),
            Step::Raft { commit, .. } if durable => commit.await,
            Step::Raft {
                reserved,
                crc,
                commit,
            } => {
                let written = std::pin::pin!(log.wait_durable(reserved.end_offset));
                match futures::future::select(commit, written).await {
                    futures::future::Either::Left((committed, _)) => committed,
                    futures::future::Either::Right((Ok(()), commit)) => {
                        // Durable up to the expected end; the batch there must be this one.
                        let there = log
                            .read(reserved.base_offset, 1, reserved.end_offset, true)
                            .await
                            .ok()
                            .and_then(|b| BatchHeader::parse(&b).ok());
                        match there {
                            Some(h)
                                if h.base_offset == reserved.base_offset
                                    && h.crc == crc
                                    && h.next_offset() == reserved.end_offset =>
                            {
                                Ok(reserved)
                            }
                            _ => commit.await,
                        }
                    }
                    // Truncated: this node lost the lead and its uncommitted tail.
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

impl Replication {
    /// Opens the partition log in `dir`: as a Raft log when the partition has more than one
    /// replica, else as a local one.
    pub async fn open(
        dir: PathBuf,
        log_config: LogConfig,
        placement: Placement<'_>,
        now_ms: i64,
    ) -> Result<Opened, LogError> {
        if placement.replicas.len() <= 1 {
            return Local::open(&dir, log_config, now_ms).await;
        }
        let (log, replica) = Replica::open(&dir, log_config, placement)
            .await
            .map_err(|e| LogError::Io(e.to_string()))?;
        Ok(Opened {
            log,
            replication: Replication::Raft(Rc::new(replica)),
            // Rebuilt from the applied entries when this replica starts leading (`ready`).
            producers: ProducerStates::default(),
        })
    }

    /// The Raft group, for the shard's Raft services; None for a local partition.
    pub fn raft(&self) -> Option<&Rc<Replica>> {
        match self {
            Replication::Local(_) => None,
            Replication::Raft(r) => Some(r),
        }
    }

    /// Kafka's leader epoch: the Raft term, or 0.
    pub fn leader_epoch(&self) -> i32 {
        match self {
            Replication::Local(_) => local::LEADER_EPOCH,
            Replication::Raft(r) => r.leader_epoch(),
        }
    }

    /// Whether this replica serves produce and consumer fetches.
    pub fn is_leader(&self) -> bool {
        match self {
            Replication::Local(_) => true,
            Replication::Raft(r) => r.is_leader(),
        }
    }

    /// Hands leadership to replica `to` (a preferred-leader election). A local partition has
    /// no other replica.
    pub async fn hand_over(&self, to: i32) -> Handover {
        match self {
            Replication::Local(_) => Handover::NotLeader,
            Replication::Raft(r) => r.hand_over(to).await,
        }
    }

    /// HW: the offset after the last committed batch.
    pub fn high_watermark(&self) -> i64 {
        match self {
            Replication::Local(l) => l.high_watermark(),
            Replication::Raft(r) => r.high_watermark(),
        }
    }

    /// Resolves the next time the HW may have moved.
    pub fn hw_changed(&self) -> futures::channel::oneshot::Receiver<()> {
        match self {
            Replication::Local(l) => l.hw_changed(),
            Replication::Raft(r) => r.hw_changed(),
        }
    }

    /// A current lease to answer reads with (a local partition always has one).
    pub async fn read_lease(&self) -> Result<(), BrokerError> {
        match self {
            Replication::Local(_) => Ok(()),
            Replication::Raft(r) => r.read_lease().await,
        }
    }

    /// How many replicas are in sync, as the leader sees it.
    pub fn in_sync_replicas(&self) -> usize {
        match self {
            Replication::Local(_) => 1,
            Replication::Raft(r) => r.in_sync_replicas().len(),
        }
    }

    /// OffsetForLeaderEpoch for an epoch older than the current one: (largest epoch <=
    /// `epoch`, offset after it), None when unknown. A local partition has only epoch 0.
    pub fn end_offset_for_epoch(&self, epoch: i32) -> Option<(i32, i64)> {
        match self {
            Replication::Local(_) => None,
            Replication::Raft(r) => r.end_offset_for_epoch(epoch),
        }
    }

    /// The first offset read_committed consumers may not read yet
    /// (`ProducerStates::first_unstable`): from a local partition's producer state; from a
    /// Raft replica's applied state, as everything below its HW is applied (its leader's own
    /// `producers` runs ahead with proposals, and is stale until its first write of a term).
    pub fn first_unstable(&self, producers: &RefCell<ProducerStates>, hw: i64) -> Option<i64> {
        match self {
            Replication::Local(_) => producers.borrow_mut().first_unstable(hw),
            Replication::Raft(r) => r.applied_first_unstable(hw),
        }
    }

    /// The producers as this replica has applied them: `producers` for a local partition,
    /// a Raft replica's applied state (what is below its HW, the same on every replica).
    pub fn active_producers(
        &self,
        producers: &RefCell<ProducerStates>,
    ) -> Vec<crate::producer_state::ActiveProducer> {
        match self {
            Replication::Local(_) => producers.borrow().active(),
            Replication::Raft(r) => r.applied_active_producers(),
        }
    }

    /// Checks this replica may take produce requests now; a Raft leader resets `producers`
    /// from its applied state at the start of each term.
    pub fn ready(
        &self,
        producers: &RefCell<ProducerStates>,
        log_end: i64,
    ) -> Result<(), BrokerError> {
        match self {
            Replication::Local(_) => Ok(()),
            Replication::Raft(r) => r.ready(producers, log_end),
        }
    }

    /// Appends a validated new batch (`header` is its header, `bytes` the batch as stored),
    /// records it in `producers` where it lands, and says how to wait for it.
    /// `log_append_time_ms` goes into the answer.
    pub fn append(
        &self,
        producers: &RefCell<ProducerStates>,
        bytes: BytesMut,
        header: &BatchHeader,
        log_append_time_ms: i64,
        now_ms: i64,
    ) -> Result<AppendStep, BrokerError> {
        let step = match self {
            Replication::Local(l) => {
                Step::Local(l.append(producers, bytes, header, log_append_time_ms, now_ms)?)
            }
            Replication::Raft(r) => {
                let (reserved, crc, commit) =
                    r.propose(producers, bytes.freeze(), header, log_append_time_ms);
                Step::Raft {
                    reserved,
                    crc,
                    commit,
                }
            }
        };
        Ok(AppendStep(step))
    }

    /// A retry of a batch the producer state already holds at `appended`. A local
    /// partition's producer state records only appended batches, so `finish` waits only for
    /// the fsync that acks=all asks for; a Raft leader answers once the batch itself is
    /// committed there.
    pub fn duplicate(&self, header: &BatchHeader, appended: Appended) -> AppendStep {
        AppendStep(match self {
            Replication::Local(_) => Step::Local(appended),
            Replication::Raft(r) => Step::Raft {
                reserved: appended,
                crc: header.crc,
                commit: r.clone().confirm_duplicate(*header, appended),
            },
        })
    }

    /// A batch whose sequence number does not follow the producer's last one:
    /// OUT_OF_ORDER_SEQUENCE_NUMBER, which fails the batch for good at the client. A Raft
    /// leader says so only while it holds a current lease in the term its producer state is
    /// of: one deposed without knowing it yet (cut off from its group) has not seen the
    /// batches its successor took, and answers NOT_LEADER_OR_FOLLOWER instead, so the
    /// producer finds the new leader, where its batch is in sequence. (A zombie Kafka leader
    /// answers OUT_OF_ORDER_SEQUENCE_NUMBER there.)
    pub fn out_of_order(&self) -> AppendStep {
        AppendStep(Step::Refused(match self {
            Replication::Local(_) => async { BrokerError::OutOfOrderSequence }.boxed_local(),
            Replication::Raft(r) => r.clone().confirm_out_of_order(),
        }))
    }

    /// Moves the log start to `offset` (at or below the HW) and returns it. Raft (the leader
    /// only): through a Raft entry that every replica applies and acts on; answers once the
    /// leader's own log starts there.
    pub async fn move_log_start(
        &self,
        log: &Log,
        producers: &RefCell<ProducerStates>,
        offset: i64,
        now_ms: i64,
    ) -> Result<i64, BrokerError> {
        match self {
            Replication::Local(_) => log
                .advance_start(offset)
                .await
                .map_err(BrokerError::from_log),
            Replication::Raft(r) => {
                if !r.log_start_proposed(offset) {
                    r.propose_log_start(producers, log.end_offset(), offset, now_ms)
                        .await?;
                }
                if log.start_offset() < offset {
                    r.apply_retention(log, now_ms, None, true)
                        .await
                        .map_err(|e| BrokerError::RequestTimedOut(e.to_string()))?;
                }
                Ok(log.start_offset())
            }
        }
    }

    /// The log start clients see (`Replica::log_start`).
    pub fn log_start(&self, log: &Log) -> i64 {
        match self {
            Replication::Local(_) => log.start_offset(),
            Replication::Raft(r) => r.log_start(log),
        }
    }

    /// DeleteRecords' answer after `move_log_start`: Kafka's low watermark, once it reaches
    /// `offset` on every live replica (`live` takes a node id) or REQUEST_TIMED_OUT at
    /// `deadline`. A local partition's is its log start.
    pub async fn wait_low_watermark(
        &self,
        log: &Log,
        offset: i64,
        live: impl Fn(i32) -> bool,
        deadline: std::time::Instant,
    ) -> Result<i64, BrokerError> {
        match self {
            // The local log is the only replica, and `move_log_start` moved it already.
            Replication::Local(_) => Ok(log.start_offset()),
            Replication::Raft(r) => r.wait_low_watermark(log, offset, live, deadline).await,
        }
    }

    /// Applies retention: with `full`, the topic's limits (a full pass, every
    /// `log.retention.check.interval.ms`); else only a log start a committed Raft entry asked
    /// a follower for (a leader moves its own in `move_log_start`, one elected since it
    /// applied the entry at the next full pass; reads see that start at once, see
    /// `log_start`). None: nothing to do.
    pub async fn apply_retention(
        &self,
        log: &Log,
        settings: &TopicSettings,
        now_ms: i64,
        full: bool,
    ) -> Option<std::io::Result<()>> {
        let limits = settings
            .deletes
            .then_some((settings.retention_ms, settings.retention_bytes));
        match self {
            Replication::Local(_) => {
                let (ms, bytes) = limits.filter(|_| full)?;
                Some(
                    log.apply_retention(now_ms, ms, bytes)
                        .await
                        .map(drop)
                        .map_err(std::io::Error::other),
                )
            }
            // A replicated log is the Raft log: its prefix goes through Raft, also when a
            // log-start entry asks for it on a topic that does not delete.
            Replication::Raft(r) if full => {
                Some(r.apply_retention(log, now_ms, limits, false).await)
            }
            Replication::Raft(r) if r.log_start_asked(log) && !r.is_leader() => {
                Some(r.apply_retention(log, now_ms, None, true).await)
            }
            Replication::Raft(_) => None,
        }
    }

    /// Stops the Raft group, if any (the log is closed apart).
    pub async fn shutdown(&self) {
        if let Replication::Raft(r) = self {
            let _ = r.raft.shutdown().await;
        }
    }
}
