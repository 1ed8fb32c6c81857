//! A replicated partition: its Raft group (ferrolog-raft), and Kafka's view of it.
//!
//! A partition with more than one replica runs one Raft group whose log is the partition log
//! (one entry = one batch). Kafka's words map onto Raft's:
//! - leader = the group's Raft leader; leader epoch = Raft term (`partitionLeaderEpoch` of
//!   every batch it wrote);
//! - HW = the offset after the last applied (committed) entry, on every replica;
//! - ISR = the leader plus the followers that had the leader's whole log as of some moment
//!   within `replica.lag.time.max.ms` (the leader's end is sampled a moment apart, so a
//!   follower one round trip behind a busy leader is in sync) and whose node answers pings;
//! - acks=all answers once the entry is committed, i.e. fsynced on a majority; acks=1 once
//!   the leader's own log holds it (see `replication::AppendStep`). There is no unclean
//!   election: Raft only elects a node holding every committed entry.
//!
//! A leader takes produce requests only once it has applied every entry of earlier terms
//! ("ready"); its idempotent-producer state then restarts from the applied state, so a batch
//! the old leader appended but never answered is recognised as a duplicate when retried.
//!
//! An idle group is quiescent: no ticks (openraft's 500 ms heartbeats and election timer) and
//! no Raft heartbeats. Its leader's node names it, with all the other quiet groups it leads
//! there, in one coalesced beat per peer per second (`Transport::beat`); a follower that stops
//! hearing it ticks again and stands for election (`Replica::tend`). openraft takes writes
//! only within a leader's quorum-acknowledged lease, which a quiet group lets run out: the
//! first proposal after a quiet spell renews it with one heartbeat round first
//! (`Replica::replicate`).
//!
//! Retention goes through Raft (`Replica::apply_retention`): each replica takes a snapshot
//! ending at its retention point and lets openraft purge the entries before it; a follower
//! that needs purged entries gets the leader's snapshot and restarts its log at the leader's
//! log start (see ferrolog-raft's `state_machine`). A snapshot carries the producer state
//! below its end, which a replica takes back whenever one is installed (at start-up too),
//! so producers of purged batches are still known to their retries.
//!
//! The replica runs on a `Host` (`host`): the broker's is the shard's transport on glommio;
//! the replica simulator (`crate::sim`, `ferrolog-sim --replica`) runs this very code on
//! simulated time, disks and network. DeleteRecords and the offsets rewrite
//! move the log start through a Raft entry that each replica acts on once it applies it; the
//! leader's DeleteRecords answer waits for the live replicas (`wait_low_watermark`).
//!
//! A replicated partition runs on shard `GroupId::shard` of every node that holds it, on that
//! shard's Raft transport (one connection each way per pair of shards, see `replication`).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use bytes::BufMut;
use ferrolog_io::batch::BatchHeader;
use ferrolog_io::{Log, LogConfig};
use ferrolog_raft::async_runtime::watch::WatchReceiver;
use ferrolog_raft::async_runtime::Instant as _;
use ferrolog_raft::check_quorum::CheckQuorum;
use ferrolog_raft::entry::{self, Batch};
use ferrolog_raft::network::{Transport, PRE_VOTE_GUARD};
use ferrolog_raft::openraft;
use ferrolog_raft::state_machine::{Applied, PartitionStateMachine, StateAt};
use ferrolog_raft::store::{LogStore, StoreView};
use ferrolog_raft::wire::{GroupId, Handover};
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use openraft::{AsyncRuntime, BasicNode, EntryPayload, Raft};
use uuid::Uuid;

use crate::errors::BrokerError;
use crate::partition::Appended;
use crate::producer_state::{marker_of, ProducerStates, SequenceCheck, StateError};

use super::host::{At, Host, HostRaft, Runtime};

/// Now, on host `H`'s clock.
fn now<H: Host>() -> At<H> {
    At::<H>::now()
}

/// How long a produce waits for its batch to commit before REQUEST_TIMED_OUT.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long retention waits for the snapshot it asked for (it only writes a small file).
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a leader waiting for its followers' log starts asks them again, and how long
/// it waits for one answer at most.
const LOG_START_POLL: Duration = Duration::from_millis(20);
const LOG_START_ASK_TTL: Duration = Duration::from_secs(1);

/// Bit 63 marks a partition group (the controller is group 0); bit 62 one whose topic has a
/// Raft number.
const PARTITION_GROUP: u64 = 1 << 63;
const NUMBERED_GROUP: u64 = 1 << 62;

/// The Raft group id of a partition: the same on every node, never the controller's 0, and
/// never another numbered partition's. A topic's `raft_number` (unique in the cluster and
/// never reused, given by the controller at creation) is the high word and the partition the
/// low one, offset by the number so that one-partition topics spread over the shards
/// (`GroupId::shard`).
///
/// Topics created before numbers existed keep their old id bit for bit: two CRC32C values
/// of one key, which carry 32 bits between them (the second follows from the first), so two
/// such partitions may collide, and one may meet a numbered id with a chance of 2^-32 per
/// pair; a node hosting both refuses the second loudly (`Transport::register`).
pub fn group_id(topic_id: &Uuid, raft_number: Option<u32>, partition: i32) -> GroupId {
    let partition = u32::try_from(partition).expect("a partition index is not negative");
    match raft_number {
        Some(number) => {
            assert!(number < 1 << 30, "a topic's Raft number fits in 30 bits");
            let low = partition.wrapping_add(number);
            GroupId(PARTITION_GROUP | NUMBERED_GROUP | u64::from(number) << 32 | u64::from(low))
        }
        None => {
            let mut key = [0u8; 20];
            key[..16].copy_from_slice(topic_id.as_bytes());
            key[16..].copy_from_slice(&partition.to_be_bytes());
            let hi = u64::from(crc32c::crc32c(&key));
            let lo = u64::from(crc32c::crc32c_append(0x9e37_79b9, &key));
            GroupId(PARTITION_GROUP | hi << 32 | lo)
        }
    }
}

/// How often the leader samples its log end for the ISR at most (see `Replica::end_sample`),
/// from the quiescence loop and whenever the ISR is asked for (the controller's leader
/// reports, every 200 ms).
const ISR_SAMPLE: Duration = Duration::from_millis(500);

/// How long a leader's group must stay unchanged (no new entries, followers caught up, the
/// same followers answering on the same connections) before it stops ticking.
const QUIET_AFTER: Duration = Duration::from_secs(3);

/// How often a node sends each peer the coalesced beat of the quiet groups it leads there.
pub const BEAT_INTERVAL: Duration = Duration::from_secs(1);

/// A quiet follower ticks again once its group heard nothing from its leader this long.
const LEADER_SILENT: Duration = Duration::from_secs(4);

/// A proposal goes out at once while a quorum acknowledged the leader this recently; later,
/// a heartbeat round renews the lease first (openraft's lease is `election_timeout_max`,
/// 3.5 s, and the proposal must reach openraft well within it).
const LEASE_FRESH: Duration = Duration::from_millis(1500);

/// A leader serves reads (Fetch, ListOffsets, a coordinator's requests) only while a quorum
/// acknowledged it this recently, counted from when the acknowledged heartbeat or beat was
/// sent. Its followers refuse Pre-Votes and votes for 3 s after they last heard it
/// (`PRE_VOTE_GUARD`), so no other leader takes writes within this lease; the half second
/// between covers clock rates and scheduling. Heartbeats (every 500 ms) or beats (every
/// second) renew it.
const READ_LEASE: Duration = Duration::from_millis(2500);
const _: () = assert!(READ_LEASE.as_millis() < PRE_VOTE_GUARD.as_millis());

/// How long a read waits for a heartbeat round to renew a lapsed lease: a leader whose
/// followers are there gets an answer within a round trip, and one cut off should answer
/// NOT_LEADER_OR_FOLLOWER soon, not after a client's request timeout.
const READ_RENEW_TIMEOUT: Duration = Duration::from_millis(500);

/// How long a proposal waits for the lease to be renewed before NOT_LEADER_OR_FOLLOWER.
const LEASE_RENEW_TIMEOUT: Duration = Duration::from_secs(2);

/// A follower whose node answered no ping this long counts as gone for quiescence.
const FOLLOWER_SILENT: Duration = Duration::from_secs(2);

/// Where a ready leader's proposal is to land, and the term it was reserved in.
#[derive(Debug, Clone, Copy)]
pub struct Reservation {
    pub base_offset: i64,
    term: Option<u64>,
}

/// A reserved proposal until `Replica::replicate` settles it. One dropped unsettled (its
/// request went away, e.g. a DeleteRecords whose connection closed) may or may not be in the
/// log: the leader's producer state is rebuilt before the next proposal, as after a refusal.
struct InFlight<'a, H: Host> {
    replica: &'a Replica<H>,
    term: Option<u64>,
    settled: bool,
}

impl<H: Host> Drop for InFlight<'_, H> {
    fn drop(&mut self) {
        let replica = self.replica;
        assert!(
            replica.in_flight.get() > 0,
            "a reserved proposal settles once"
        );
        replica.in_flight.set(replica.in_flight.get() - 1);
        if !self.settled && replica.ready_term.get() == self.term {
            replica.resync.set(true);
        }
    }
}

/// A quiet group this node leads: its term and followers, for the coalesced beat.
pub struct QuietLead {
    pub group: GroupId,
    pub term: u64,
    pub followers: Vec<u64>,
}

/// What a partition's Raft snapshot carries of the entries it covers (`StateAt`): the log
/// start that log-start entries asked for, the aborted transactions its node had not written
/// to its index yet (`Log::aborted_unsynced`), and the producer state. Encoded as version 3,
/// the log start, the aborted transactions (a count, then each in the index's layout), then
/// `ProducerStates::encode`. Version 2 had no aborted transactions; a snapshot written before
/// version 2 holds the producer state alone (its own version byte is 1), or nothing.
#[derive(Debug, Default)]
pub struct SnapshotState {
    log_start_wanted: i64,
    producers: ProducerStates,
    aborted: Vec<ferrolog_io::AbortedTxn>,
}

// The version byte tells the layouts apart.
const _: () = assert!(
    SnapshotState::VERSION != crate::producer_state::STATE_VERSION
        && SnapshotState::VERSION_2 != crate::producer_state::STATE_VERSION
        && SnapshotState::VERSION_2 != 1
        && SnapshotState::VERSION != 1
);

impl SnapshotState {
    const VERSION: u8 = 3;
    const VERSION_2: u8 = 2;

    fn encode(&self) -> bytes::Bytes {
        let producers = self.producers.encode();
        let aborted = ferrolog_io::txn_index::encode(&self.aborted);
        let mut out = bytes::BytesMut::with_capacity(13 + aborted.len() + producers.len());
        out.put_u8(Self::VERSION);
        out.put_i64(self.log_start_wanted);
        out.put_u32(u32::try_from(self.aborted.len()).expect("aborts fit u32"));
        out.put_slice(&aborted);
        out.put_slice(&producers);
        out.freeze()
    }

    /// Reads what `encode` wrote, or an older snapshot's state; anything else is an error,
    /// never a panic.
    pub fn decode(bytes: &[u8]) -> Result<SnapshotState, StateError> {
        let (version, rest) = match bytes {
            [v @ (Self::VERSION | Self::VERSION_2), rest @ ..] => (*v, rest),
            older => {
                return Ok(SnapshotState {
                    log_start_wanted: 0,
                    producers: ProducerStates::decode(older)?,
                    aborted: Vec::new(),
                })
            }
        };
        let (start, mut rest) = rest
            .split_first_chunk::<8>()
            .ok_or_else(|| StateError::new("truncated"))?;
        let log_start_wanted = i64::from_be_bytes(*start);
        if log_start_wanted < 0 {
            return Err(StateError::new("negative log start"));
        }
        let mut aborted = Vec::new();
        if version == Self::VERSION {
            let (count, after) = rest
                .split_first_chunk::<4>()
                .ok_or_else(|| StateError::new("truncated"))?;
            let len = (u32::from_be_bytes(*count) as usize)
                .checked_mul(ferrolog_io::txn_index::ENTRY_BYTES)
                .filter(|&len| len <= after.len())
                .ok_or_else(|| StateError::new("truncated aborted transactions"))?;
            aborted = ferrolog_io::txn_index::decode(&after[..len], 0, i64::MAX)
                .map_err(|e| StateError::new(&e.to_string()))?;
            rest = &after[len..];
        }
        // `ProducerStates::encode` writes at least its header, never nothing.
        if rest.is_empty() {
            return Err(StateError::new("truncated"));
        }
        Ok(SnapshotState {
            log_start_wanted,
            producers: ProducerStates::decode(rest)?,
            aborted,
        })
    }
}

/// The log starts that applied log-start entries asked for.
#[derive(Debug, Default)]
struct AskedStarts {
    /// The largest: reads see no offset below it.
    wanted: i64,
    /// Each rise of `wanted` as (the smallest end offset of a snapshot that covers its
    /// cause, the start), oldest first.
    rises: VecDeque<(i64, i64)>,
}

impl AskedStarts {
    /// Takes a start asked for by an entry or a snapshot that a snapshot ending at `from` or
    /// later covers (None: unknown, so no snapshot carries it); true if it rises.
    fn raise(&mut self, from: Option<i64>, start: i64) -> bool {
        if start <= self.wanted {
            return false;
        }
        self.wanted = start;
        if let Some(from) = from {
            self.rises.push_back((from, start));
        }
        true
    }

    /// The start a snapshot ending at `next` carries: what the entries below `next` asked
    /// for, as it carries the producer state as of `next` (a later entry is applied again
    /// after it). So it is at most `next`, and a replica that installs the snapshot can move
    /// its log start there at once. Forgets the rises a later one below `next` covers:
    /// snapshots only move forward.
    fn as_of(&mut self, next: i64) -> i64 {
        while self.rises.get(1).is_some_and(|(from, _)| *from <= next) {
            self.rises.pop_front();
        }
        self.rises
            .front()
            .filter(|(from, _)| *from <= next)
            .map_or(0, |(_, start)| *start)
    }
}

/// Where a replica sits: this node, the partition's replicas and their Raft addresses.
pub struct Placement<'a, H: Host = Transport> {
    pub node_id: i32,
    pub replicas: &'a [i32],
    pub addrs: &'a BTreeMap<i32, std::net::SocketAddr>,
    pub group: GroupId,
    /// `replica.lag.time.max.ms`.
    pub lag_max: Duration,
    /// Woken when this replica applies a log-start entry that moves its log start.
    pub log_start_asked: Rc<tokio::sync::Notify>,
    /// The shard's Raft transport, which carries the group.
    pub transport: &'a Rc<H>,
}

pub struct Replica<H: Host = Transport> {
    pub raft: HostRaft<H>,
    pub view: StoreView<H::Fs>,
    node_id: u64,
    hw: Rc<Cell<i64>>,
    /// Fetches waiting for the HW to move.
    hw_waiters: Rc<RefCell<Vec<futures::channel::oneshot::Sender<()>>>>,
    applied_producers: Rc<RefCell<ProducerStates>>,
    /// The log starts committed log-start entries asked for (`propose_log_start`).
    log_start_wanted: Rc<RefCell<AskedStarts>>,
    /// The term whose start reset the leader's producer state.
    ready_term: Cell<Option<u64>>,
    /// Proposals not yet committed or failed.
    in_flight: Cell<u32>,
    /// A proposal of the ready term failed: rebuild the producer state before the next one.
    resync: Cell<bool>,
    /// Proposals go to openraft one at a time, in the order their offsets were reserved
    /// (a lease renewal may hold the first while the next arrive).
    proposing: tokio::sync::Mutex<()>,
    /// Where the leader's next proposed batch lands in its log.
    next_offset: Cell<i64>,
    /// The term this leader judges the ISR in, and when each follower was last caught up.
    caught_up: RefCell<(u64, HashMap<u64, At<H>>)>,
    /// The leader's last log index a moment ago, and when: Kafka's rule is that a follower
    /// that has what the leader had then was caught up then. Kafka samples at each follower
    /// fetch; here the sample is taken at most every `ISR_SAMPLE`, so a follower that trails a
    /// busy leader by less than that still counts as caught up.
    end_sample: Cell<Option<(Option<u64>, At<H>)>>,
    /// When this leader last reported an ISR-only change to the controller.
    pub isr_reported_at: Cell<Option<At<H>>>,
    lag_max: Duration,
    transport: Rc<H>,
    group: GroupId,
    /// Whether the group's ticks are off (see `tend`).
    quiet: Cell<bool>,
    /// What the leader last saw of its group, and since when it has been so.
    calm: Cell<Option<(u64, At<H>)>>,
    /// Whether this leader is to mute its group (see `check_quorum`).
    check_quorum: RefCell<CheckQuorum<At<H>>>,
}

impl<H: Host> Replica<H> {
    /// Opens the partition log in `dir` as a Raft log and starts the group. The first replica
    /// of a new partition initializes the group with all replicas.
    pub async fn open(
        dir: &Path,
        log_config: LogConfig,
        placement: Placement<'_, H>,
    ) -> std::io::Result<(Rc<Log<H::Fs>>, Replica<H>)> {
        let Placement {
            node_id,
            replicas,
            addrs,
            group,
            lag_max,
            log_start_asked,
            transport,
        } = placement;
        let store = LogStore::open_on(transport.fs(), dir, log_config, transport.clock()).await?;
        let fresh = store.is_fresh();
        let view = store.view();
        let log = store.log().clone();
        let hw = Rc::new(Cell::new(log.start_offset()));
        let hw_waiters: Rc<RefCell<Vec<futures::channel::oneshot::Sender<()>>>> = Rc::default();
        let applied_producers = Rc::new(RefCell::new(ProducerStates::default()));
        let log_start_wanted: Rc<RefCell<AskedStarts>> = Rc::default();
        let hook = {
            let (view, hw, producers) = (view.clone(), hw.clone(), applied_producers.clone());
            let log = log.clone();
            let wanted = log_start_wanted.clone();
            let waiters = hw_waiters.clone();
            let host = transport.clone();
            Box::new(move |applied: Applied<'_>| {
                let (entry, end) = match applied {
                    Applied::Entry(entry) => (Some(entry), view.end_offset(entry.log_id.index)),
                    // The log goes on at the snapshot's end, and the producer state is the
                    // one the snapshot carries (the state as of its end, on the node that
                    // took it): a batch purged since is still known to its producer's
                    // retry after a restart or on a follower that took the snapshot, as a
                    // Kafka replica keeps its producer state across retention.
                    // The log start asked for comes back too: the log-start entries it
                    // covers are not applied again, and this replica's own log may still
                    // start lower (its purge had not moved it when it went down).
                    Applied::Snapshot(data) => {
                        match SnapshotState::decode(&data.partition_state) {
                            Ok(state) => {
                                *producers.borrow_mut() = state.producers;
                                // The aborts it covers that its node had not written to its
                                // index yet: those this log holds.
                                for txn in state.aborted {
                                    if txn.last_offset < log.end_offset() {
                                        log.add_aborted(txn);
                                    }
                                }
                                let start = state.log_start_wanted;
                                if wanted.borrow_mut().raise(Some(data.next_offset), start) {
                                    log_start_asked.notify_one();
                                }
                            }
                            Err(e) => {
                                tracing::error!(group = group.0, error = %e,
                                    "a snapshot's partition state does not decode: starting without it");
                                *producers.borrow_mut() = ProducerStates::default();
                            }
                        }
                        (None, Some(data.next_offset))
                    }
                };
                if let Some(end) = end {
                    if end > hw.get() {
                        hw.set(end);
                        for w in waiters.borrow_mut().drain(..) {
                            let _ = w.send(());
                        }
                    }
                }
                let Some(entry) = entry else { return };
                let index = entry.log_id.index;
                let base = view.base_offset(index);
                host.applied(entry, base);
                let EntryPayload::Normal(Batch(bytes)) = &entry.payload else {
                    return;
                };
                let Ok(header) = BatchHeader::parse(bytes) else {
                    return;
                };
                let marker = marker_of(&header, bytes);
                if header.is_control() && marker.is_none() {
                    if let Some(start) = entry::log_start_of(bytes) {
                        if wanted.borrow_mut().raise(base.map(|b| b + 1), start) {
                            log_start_asked.notify_one();
                        }
                    }
                } else if let Some(base) = base {
                    let header = BatchHeader {
                        base_offset: base,
                        ..header
                    };
                    let mut producers = producers.borrow_mut();
                    // An abort goes into the index once committed (this hook runs on every
                    // replica, the leader included).
                    if let Some(closed) = producers.apply(&header, marker).filter(|c| c.aborted) {
                        log.add_aborted(producers.aborted_entry(&closed));
                    }
                    // Applied is committed: a marker here holds nothing back.
                    producers.forget_closed_below(base + 1);
                }
            })
        };
        let state_at: StateAt = {
            let producers = applied_producers.clone();
            let asked = log_start_wanted.clone();
            let log = log.clone();
            Box::new(move |next| {
                let producers = match unfix::snapshots_without_producers() {
                    true => ProducerStates::default(),
                    false => producers.borrow().below(next),
                };
                let log_start_wanted = match unfix::snapshots_without_log_start() {
                    true => 0,
                    false => asked.borrow_mut().as_of(next),
                };
                SnapshotState {
                    log_start_wanted,
                    producers,
                    // All not on disk yet, those past `next` too: a snapshot may end below
                    // the applied state, and a marker after its end may close a transaction
                    // that began before it.
                    aborted: log.aborted_unsynced(i64::MAX),
                }
                .encode()
            })
        };
        let raft = Raft::new(
            node_id as u64,
            transport.raft_config(),
            transport.factory(group),
            store,
            PartitionStateMachine::open(view.clone(), hook, state_at)?,
        )
        .await
        .map_err(std::io::Error::other)?;
        if let Err(e) = transport.register(group, raft.clone(), log.clone()) {
            let _ = raft.shutdown().await;
            return Err(std::io::Error::other(e));
        }
        if !fresh {
            // It may have acknowledged a leader just before it went down.
            transport.hold_votes(group);
        }
        if fresh && replicas.first() == Some(&node_id) {
            let members: BTreeMap<u64, BasicNode> = replicas
                .iter()
                .map(|id| {
                    let addr = addrs.get(id).map(|a| a.to_string()).unwrap_or_default();
                    (*id as u64, BasicNode::new(addr))
                })
                .collect();
            if let Err(e) = raft.initialize(members).await {
                // Leave nothing serving this log: the next open starts from scratch.
                transport.unregister(group);
                let _ = raft.shutdown().await;
                return Err(std::io::Error::other(e));
            }
        }
        let replica = Replica {
            raft,
            view,
            node_id: node_id as u64,
            hw,
            hw_waiters,
            applied_producers,
            log_start_wanted,
            ready_term: Cell::new(None),
            in_flight: Cell::new(0),
            resync: Cell::new(false),
            proposing: tokio::sync::Mutex::new(()),
            next_offset: Cell::new(0),
            caught_up: RefCell::new((0, HashMap::new())),
            end_sample: Cell::new(None),
            isr_reported_at: Cell::new(None),
            lag_max,
            transport: transport.clone(),
            group,
            quiet: Cell::new(false),
            calm: Cell::new(None),
            check_quorum: RefCell::default(),
        };
        Ok((log, replica))
    }

    /// Applies `retention.ms` and `retention.bytes` (`limits`, for a topic that deletes) and
    /// any committed log-start entry through Raft: the oldest segments past either limit, or
    /// the entries below the log start asked for, as far as they are committed, go once a
    /// snapshot covers them (openraft purges the entries and the store moves the log start).
    /// Each replica does so on its own log, as each Kafka replica applies retention to its
    /// own; a follower that later needs a purged entry gets the leader's snapshot and starts
    /// its log where it ends. With `wait`, returns once the log start has moved (or after
    /// `SNAPSHOT_TIMEOUT`, with an error).
    pub async fn apply_retention(
        &self,
        log: &Log<H::Fs>,
        now: i64,
        limits: Option<(i64, i64)>,
        wait: bool,
    ) -> std::io::Result<()> {
        let by_limits = match limits {
            Some((ms, bytes)) => log
                .retention_point(now, ms, bytes)
                .await
                .map_err(std::io::Error::other)?,
            None => None,
        };
        let wanted =
            Some(self.log_start_wanted.borrow().wanted).filter(|w| *w > log.start_offset());
        let Some(start) = by_limits.max(wanted) else {
            return Ok(());
        };
        // Everything below the HW is applied. A log start asked for by DeleteRecords may lie
        // inside a batch: the entries wholly below it go, the one holding it stays.
        let start = start.min(self.hw.get());
        let upto = self.view.last_index_below(start);
        if let Some(upto) = upto {
            self.purge_through(upto).await?;
        }
        // openraft may hold a purge while a follower is still being sent those entries.
        let purged = |m: &openraft::RaftMetrics<H::Raft>| {
            upto.is_none_or(|upto| m.purged.is_some_and(|p| p.index >= upto))
        };
        if wait {
            self.raft
                .wait(Some(SNAPSHOT_TIMEOUT))
                .metrics(purged, "the purge below a log start")
                .await
                .map_err(std::io::Error::other)?;
        }
        // At a batch boundary the purge moves the log start. Inside a batch it moves on once
        // the entries below are gone (their segments go with it, and a replication may still
        // be reading them); until then, at a later pass.
        let inside = upto.is_none_or(|u| self.view.end_offset(u) != Some(start));
        if inside && start > log.start_offset() && purged(&self.raft.metrics().borrow_watched()) {
            log.wait_durable(start)
                .await
                .map_err(std::io::Error::other)?;
            log.advance_start(start)
                .await
                .map_err(std::io::Error::other)?;
        }
        Ok(())
    }

    /// Takes a snapshot through entry `upto` (unless one covers it) and has openraft purge
    /// the entries up to it.
    async fn purge_through(&self, upto: u64) -> std::io::Result<()> {
        let covered =
            |m: &openraft::RaftMetrics<H::Raft>| m.snapshot.is_some_and(|s| s.index >= upto);
        if !covered(&self.raft.metrics().borrow_watched()) {
            // Through `upto` only: a follower that takes it still gets the entries kept.
            self.view.snapshot_through(upto);
            self.raft
                .trigger()
                .snapshot()
                .await
                .map_err(std::io::Error::other)?;
            self.raft
                .wait(Some(SNAPSHOT_TIMEOUT))
                .metrics(covered, "a snapshot for retention")
                .await
                .map_err(std::io::Error::other)?;
        }
        self.raft
            .trigger()
            .purge_log(upto)
            .await
            .map_err(std::io::Error::other)
    }

    /// Moves the log start of every replica to `offset`, at or below the HW: a log-start
    /// entry that each replica acts on once it applies it (`apply_retention`, which the
    /// shard's retention loop runs on followers as soon as the hook signals the entry).
    /// Answers once the entry is committed.
    pub async fn propose_log_start(
        &self,
        producers: &RefCell<ProducerStates>,
        log_end: i64,
        offset: i64,
        now_ms: i64,
    ) -> Result<(), BrokerError> {
        assert!(offset <= self.hw.get(), "a log start past the HW");
        self.ready(producers, log_end)?;
        let reservation = self.reserve(1);
        self.replicate(entry::log_start_batch(offset, now_ms), reservation)
            .await
            .map(drop)
    }

    /// Whether a committed log-start entry asks this replica to start its log further on
    /// than it does (`apply_retention` acts on it).
    pub fn log_start_asked(&self, log: &Log<H::Fs>) -> bool {
        self.log_start_wanted.borrow().wanted > log.start_offset()
    }

    /// The log start that reads see: the log's own, or further on where a log-start entry
    /// this replica applied asks for it and its log has not moved there yet (a leader
    /// elected since, whose retention has not acted on it; Kafka, too, moves a log start
    /// before the segments below it go). Records below it are deleted for clients.
    pub fn log_start(&self, log: &Log<H::Fs>) -> i64 {
        let start = log.start_offset();
        match unfix::reads_below_asked_start() {
            true => start,
            false => start.max(self.log_start_wanted.borrow().wanted),
        }
    }

    /// Whether every replica has been asked to start its log at `offset` or later, by a
    /// log-start entry this replica applied. Else DeleteRecords proposes one, even when this
    /// leader's own log starts there already (its retention may have moved it): another
    /// replica's log may start lower, and may lead next.
    pub fn log_start_proposed(&self, offset: i64) -> bool {
        self.log_start_wanted.borrow().wanted >= offset
    }

    /// Kafka's low watermark as a leader sees it: the lowest log start among this replica
    /// and the followers on the nodes `live` takes (a live follower that does not answer
    /// counts as behind). Waits until it reaches `offset` and returns it, or until
    /// `deadline` (REQUEST_TIMED_OUT), as Kafka's DeleteRecords waits for every live replica.
    pub async fn wait_low_watermark(
        &self,
        log: &Log<H::Fs>,
        offset: i64,
        live: impl Fn(i32) -> bool,
        deadline: At<H>,
    ) -> Result<i64, BrokerError> {
        let followers: Vec<u64> = {
            let m = self.raft.metrics();
            let m = m.borrow_watched();
            let voters = m.membership_config.membership().voter_ids();
            voters.filter(|id| *id != self.node_id).collect()
        };
        loop {
            if !self.is_leader() {
                return Err(BrokerError::NotLeaderOrFollower);
            }
            let ttl = deadline
                .saturating_duration_since(now::<H>())
                .clamp(LOG_START_POLL, LOG_START_ASK_TTL);
            let asks = followers
                .iter()
                .filter(|id| live(**id as i32))
                .map(|id| self.transport.log_start(*id, self.group, ttl));
            let starts = futures::future::join_all(asks).await;
            let low = starts
                .into_iter()
                .map(|s| s.unwrap_or(-1))
                .fold(log.start_offset(), i64::min);
            if low >= offset {
                return Ok(low);
            }
            if now::<H>() >= deadline {
                return Err(BrokerError::RequestTimedOut(format!(
                    "a replica's log starts at {low}, below {offset}"
                )));
            }
            Runtime::<H>::sleep(LOG_START_POLL).await;
        }
    }

    /// The first offset of a transaction open in the applied state, for the LSO
    /// (`Replication::first_unstable`).
    pub fn applied_first_unstable(&self, hw: i64) -> Option<i64> {
        self.applied_producers.borrow_mut().first_unstable(hw)
    }

    /// The producers of the applied state (`Replication::active_producers`).
    pub fn applied_active_producers(&self) -> Vec<crate::producer_state::ActiveProducer> {
        self.applied_producers.borrow().active()
    }

    /// Offset after the last committed batch.
    pub fn high_watermark(&self) -> i64 {
        self.hw.get()
    }

    /// Resolves the next time the HW moves.
    pub fn hw_changed(&self) -> futures::channel::oneshot::Receiver<()> {
        let (tx, rx) = futures::channel::oneshot::channel();
        let mut waiters = self.hw_waiters.borrow_mut();
        waiters.retain(|w| !w.is_canceled());
        waiters.push(tx);
        rx
    }

    /// The Raft term, as Kafka's leader epoch.
    pub fn leader_epoch(&self) -> i32 {
        let term = self.raft.metrics().borrow_watched().current_term;
        i32::try_from(term).unwrap_or(i32::MAX)
    }

    /// The node this replica follows (itself when leading), if any.
    pub fn leader(&self) -> Option<i32> {
        let leader = self.raft.metrics().borrow_watched().current_leader;
        leader.map(|l| l as i32)
    }

    /// Leads, is not handing its leadership over (`hand_over`), and has applied every entry
    /// of earlier terms, so its HW covers everything committed: only then does it serve
    /// produce and fetch.
    pub fn is_leader(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        m.current_leader == Some(self.node_id)
            && m.last_applied.map(|l| l.leader_id.term) == Some(m.current_term)
            && !self.transport.handing_over(self.group, m.current_term)
    }

    /// Hands this replica's leadership to node `to` (a preferred-leader election), if it
    /// leads (`Transport::elect`, also what a peer's ask runs). While it hands over, `tend`
    /// neither quiets the group nor names it in beats: should `to` not take over, the
    /// followers hear nothing more from this leader and elect another.
    pub async fn hand_over(&self, to: i32) -> Handover {
        self.transport.elect(self.group, to as u64).await
    }

    /// Makes sure this replica may answer reads: it leads (`is_leader`), its Raft core runs,
    /// and a quorum acknowledged it within `READ_LEASE`, with one heartbeat round first when
    /// none did lately (a group going quiet, or a late beat). A leader cut off from its
    /// followers thus stops serving what a new leader on the other side may have changed
    /// already (issue 17, e): NOT_LEADER_OR_FOLLOWER.
    pub async fn read_lease(&self) -> Result<(), BrokerError> {
        if unfix::reads_without_lease() && self.is_leader() {
            return Ok(());
        }
        self.show_lease().await
    }

    /// `read_lease`: a current lease, renewed if need be.
    async fn show_lease(&self) -> Result<(), BrokerError> {
        if self.has_read_lease() {
            return Ok(());
        }
        if !self.is_leader() {
            return Err(BrokerError::NotLeaderOrFollower);
        }
        self.renew_lease(READ_RENEW_TIMEOUT).await?;
        if self.has_read_lease() {
            Ok(())
        } else {
            Err(BrokerError::NotLeaderOrFollower)
        }
    }

    fn has_read_lease(&self) -> bool {
        if !self.is_leader() {
            return false;
        }
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        m.state == openraft::ServerState::Leader
            && m.running_state.is_ok()
            && self.quorum_silent(&m).is_some_and(|d| d < READ_LEASE)
    }

    /// How long ago a majority last acknowledged this leader: by a heartbeat or append
    /// (openraft's `last_quorum_acked`), or, for a quiet group, by answering its beats; both
    /// count from when what they answered was sent (a heartbeat ack within `READ_LEASE` is
    /// taken without looking further). None if no majority ever did this term.
    fn quorum_silent(&self, m: &openraft::RaftMetrics<H::Raft>) -> Option<Duration> {
        let acked = m.last_quorum_acked.as_ref().map(|t| t.elapsed());
        // A busy group's heartbeats answer it; only a quiet one needs its beats looked up.
        if acked.is_some_and(|d| d < READ_LEASE) {
            return acked;
        }
        // Followers needed besides this leader for a majority of the voters.
        let followers = m.membership_config.membership().voter_ids().count() / 2;
        let beaten = self
            .transport
            .followed_by(self.group, m.current_term, followers)
            .map(|t| t.elapsed());
        acked.into_iter().chain(beaten).min()
    }

    /// Checks this replica may take produce requests now (it leads and has applied all of
    /// earlier terms); at the start of each term the leader's producer state is reset from
    /// the applied one.
    pub fn ready(
        &self,
        producers: &RefCell<ProducerStates>,
        log_end: i64,
    ) -> Result<(), BrokerError> {
        if !self.is_leader() {
            return Err(BrokerError::NotLeaderOrFollower);
        }
        let (term, unapplied) = {
            let m = self.raft.metrics();
            let m = m.borrow_watched();
            let applied = m.last_applied.map(|l| l.index);
            (m.current_term, m.last_log_index > applied)
        };
        if self.resync.get() && self.ready_term.get() == Some(term) {
            // A batch of this term was refused, yet it is in the producer state and the
            // predicted offsets. The applied state is the truth again once every proposal
            // is settled and everything in this leader's log is applied: a proposal that
            // timed out waiting for its commit is settled, yet it is in the log and may
            // still commit, so its retry must still be taken for a duplicate.
            if self.in_flight.get() > 0 || (unapplied && !unfix::resync_with_tail()) {
                return Err(BrokerError::NotLeaderOrFollower);
            }
            self.ready_term.set(None);
        }
        if self.ready_term.get() != Some(term) {
            // Everything before this term is applied, and nothing of it is proposed yet.
            let applied = self.applied_producers.borrow().clone();
            producers.borrow_mut().adopt(applied);
            self.next_offset.set(log_end);
            self.ready_term.set(Some(term));
            self.resync.set(false);
        }
        Ok(())
    }

    /// Where the next proposed batch of `records` records lands, on a ready leader; the
    /// batch counts as in flight until `replicate` settles it.
    pub fn reserve(&self, records: i64) -> Reservation {
        self.in_flight.set(self.in_flight.get() + 1);
        let base_offset = self.next_offset.get();
        self.next_offset.set(base_offset + records);
        Reservation {
            base_offset,
            term: self.ready_term.get(),
        }
    }

    /// Proposes a validated new batch (`bytes`, with header `header`) on a ready leader: its
    /// offsets are reserved and the producer state records it there at once, so pipelined
    /// batches of one producer pass the sequence check; the proposal goes out now, in request
    /// order, whoever waits for it. Returns where it is to land, its CRC, and its commit,
    /// which answers with the offsets of the committed entry (`replicate` refuses one that
    /// landed elsewhere).
    pub fn propose(
        self: &Rc<Self>,
        producers: &RefCell<ProducerStates>,
        bytes: bytes::Bytes,
        header: &BatchHeader,
        log_append_time_ms: i64,
    ) -> (
        Appended,
        u32,
        LocalBoxFuture<'static, Result<Appended, BrokerError>>,
    ) {
        let reservation = self.reserve(i64::from(header.record_count));
        let base_offset = reservation.base_offset;
        let crc = BatchHeader::parse(&bytes)
            .expect("a verified batch, restamped")
            .crc;
        let reserved = Appended {
            base_offset,
            end_offset: base_offset + i64::from(header.record_count),
            log_append_time_ms,
            duplicate: false,
        };
        producers.borrow_mut().apply(
            &BatchHeader {
                base_offset,
                ..*header
            },
            marker_of(header, &bytes),
        );
        let (tx, rx) = futures::channel::oneshot::channel();
        let me = self.clone();
        drop(Runtime::<H>::spawn(async move {
            let committed = me.replicate(bytes, reservation).await.map(|(base, end)| {
                // `replicate` answers Ok only at the reserved offsets (it refuses a batch
                // that landed elsewhere).
                assert_eq!(
                    base, reserved.base_offset,
                    "replicate refuses a moved batch"
                );
                Appended {
                    end_offset: end,
                    ..reserved
                }
            });
            let _ = tx.send(committed);
        }));
        let commit = async move { rx.await.unwrap_or(Err(BrokerError::NotLeaderOrFollower)) };
        (reserved, crc, commit.boxed_local())
    }

    /// Answers a retry of a batch the producer state holds at `appended` once the batch
    /// itself is committed there (`wait_duplicate`).
    pub fn confirm_duplicate(
        self: Rc<Self>,
        header: BatchHeader,
        appended: Appended,
    ) -> LocalBoxFuture<'static, Result<Appended, BrokerError>> {
        async move {
            self.wait_duplicate(&header, appended.base_offset, appended.end_offset)
                .await?;
            Ok(appended)
        }
        .boxed_local()
    }

    /// Replicates `batch` (its offsets `reserve`d) and returns the Kafka offsets it got once
    /// it is committed.
    ///
    /// Proposals reach openraft one at a time in reservation order, after the lease check
    /// (`renew_lease`), each only once the Raft core has appended or refused the one before.
    /// One that is refused (the lease could not be renewed, the term moved on, openraft
    /// refused it) was never appended, yet this term's producer state has it: every later
    /// proposal of the term is refused too rather than land at other offsets than reserved,
    /// and `ready` rebuilds the state once they settled, so a retry is not taken for a
    /// duplicate. (openraft refuses a write whose lease ran out when the core takes it; had
    /// the next one been submitted already, a heartbeat answer in between could let it in at
    /// the refused one's offsets, ahead of it: a producer's batch n+1 before batch n.) A
    /// batch that lands elsewhere all the same (an entry of openraft's own in between) is
    /// refused once committed: its retry is then a duplicate, answered where it is. (A batch
    /// that timed out is in the log and may still commit: its retry must be taken for a
    /// duplicate, and is.)
    pub async fn replicate(
        &self,
        batch: bytes::Bytes,
        reservation: Reservation,
    ) -> Result<(i64, i64), BrokerError> {
        let term = reservation.term;
        let this_term = || self.ready_term.get() == term;
        let refuse = || {
            if this_term() {
                self.resync.set(true);
            }
            BrokerError::NotLeaderOrFollower
        };
        let mut in_flight = InFlight {
            replica: self,
            term,
            settled: false,
        };
        let submitted = async {
            let _turn = self.proposing.lock().await;
            if !this_term() || self.resync.get() {
                return Err(refuse());
            }
            self.renew_lease(LEASE_RENEW_TIMEOUT)
                .await
                .map_err(|_| refuse())?;
            // The renewal may have waited: check again that the term stands.
            let current = self.raft.metrics().borrow_watched().current_term;
            if !this_term() || self.resync.get() || term != Some(current) {
                return Err(refuse());
            }
            let (responder, rx) = H::write_responder();
            let mut rx = Box::pin(rx);
            let decided = async {
                self.raft
                    .client_write_ff(Batch(batch), Some(responder))
                    .await?;
                // The core takes messages in order: once it ran this, it decided on the write.
                self.raft.with_raft_state(|_| ()).await
            };
            // A core that does not take messages any more: the write may be in or not.
            match Runtime::<H>::timeout(COMMIT_TIMEOUT, decided).await {
                Ok(Ok(())) => {}
                _ => return Err(refuse()),
            }
            match rx.as_mut().now_or_never() {
                None => Ok((rx, None)),
                Some(Ok(Ok(response))) => Ok((rx, Some(response))),
                Some(Ok(Err(_)) | Err(_)) => Err(refuse()),
            }
        }
        .await;
        let result = match submitted {
            Ok((_, Some(response))) => Ok(Ok(response)),
            Ok((rx, None)) => match Runtime::<H>::timeout(COMMIT_TIMEOUT, rx).await {
                Ok(Ok(result)) => Ok(result),
                // The group shut down with the proposal pending.
                Ok(Err(_)) => Err(BrokerError::NotLeaderOrFollower),
                Err(_) => Err(BrokerError::RequestTimedOut(format!(
                    "batch not committed within {COMMIT_TIMEOUT:?}: too few replicas reachable"
                ))),
            },
            Err(e) => Err(e),
        };
        in_flight.settled = true;
        drop(in_flight);
        match result? {
            Ok(response) => {
                let index = response.log_id.index;
                match (self.view.base_offset(index), self.view.end_offset(index)) {
                    (Some(base), Some(end)) if base == reservation.base_offset => Ok((base, end)),
                    (Some(base), Some(_)) => {
                        tracing::error!(
                            group = self.group.0,
                            base,
                            reserved = reservation.base_offset,
                            "a batch landed at other offsets than reserved"
                        );
                        Err(refuse())
                    }
                    // Truncated after commit: impossible in Raft, so a bug.
                    _ => unreachable!("committed entry {index} is not in the log"),
                }
            }
            Err(_) => Err(refuse()),
        }
    }

    /// Makes sure a quorum acknowledged this leader within `LEASE_FRESH`, with one heartbeat
    /// round when it did not (a group back from a quiet spell), waiting `timeout` for it.
    async fn renew_lease(&self, timeout: Duration) -> Result<(), BrokerError> {
        let me = self.node_id;
        let fresh = |m: &openraft::RaftMetrics<H::Raft>| {
            m.last_quorum_acked
                .as_ref()
                .is_some_and(|t| t.elapsed() < LEASE_FRESH)
        };
        let age = {
            let m = self.raft.metrics();
            let m = m.borrow_watched();
            if fresh(&m) {
                return Ok(());
            }
            m.last_quorum_acked.as_ref().map(|t| t.elapsed())
        };
        tracing::debug!(group = self.group.0, ?age, "renewing the leader's lease");
        self.wake();
        let _ = self.raft.trigger().heartbeat().await;
        let renewed = self
            .raft
            .wait(Some(timeout))
            .metrics(
                |m| fresh(m) || m.current_leader != Some(me),
                "leader lease renewed",
            )
            .await;
        match renewed {
            Ok(m) if fresh(&m) => Ok(()),
            _ => Err(BrokerError::NotLeaderOrFollower),
        }
    }

    /// Answers a retry of a batch this leader took at `base_offset`..`end_offset` (its
    /// producer state recorded it when the offsets were reserved): Ok once the batch itself,
    /// the same producer id, epoch and sequences, is committed there. The offsets alone do
    /// not tell: if the original proposal was refused, another batch may have landed at
    /// them, and the retry is then refused (NOT_LEADER_OR_FOLLOWER), so the producer sends
    /// it again and it is appended anew. Wakes on every HW move and on a change of leader.
    pub async fn wait_duplicate(
        &self,
        header: &BatchHeader,
        base_offset: i64,
        end_offset: i64,
    ) -> Result<(), BrokerError> {
        let term = self.raft.metrics().borrow_watched().current_term;
        let me = self.node_id;
        // One watch for the whole wait: it ends with a change of leader or term, the Raft
        // core stopping, or the deadline, and the wait ends with it.
        let wait = self.raft.wait(Some(COMMIT_TIMEOUT));
        let mut deposed = std::pin::pin!(wait.metrics(
            move |m| m.current_leader != Some(me) || m.current_term != term,
            "a change of leader",
        ));
        loop {
            // Registered before the look, so no HW move between the two is missed.
            let moved = self.hw_changed();
            if self.hw.get() >= end_offset {
                if unfix::offsets_confirm_duplicates() {
                    return Ok(());
                }
                // The apply hook moves the HW and records the applied batches in one step.
                let committed = self.applied_producers.borrow().check(header);
                return match committed {
                    SequenceCheck::Duplicate {
                        base_offset: at, ..
                    } if at == base_offset => Ok(()),
                    _ => Err(BrokerError::NotLeaderOrFollower),
                };
            }
            if !self.is_leader() {
                return Err(BrokerError::NotLeaderOrFollower);
            }
            match futures::future::select(moved, deposed.as_mut()).await {
                futures::future::Either::Left(_) => {}
                futures::future::Either::Right((
                    Err(openraft::metrics::WaitError::Timeout(..)),
                    _,
                )) => {
                    return Err(BrokerError::RequestTimedOut(
                        "a retried batch was not committed in time".into(),
                    ));
                }
                futures::future::Either::Right(_) => return Err(BrokerError::NotLeaderOrFollower),
            }
        }
    }

    /// Answers a batch the producer state found out of sequence (`Replication::out_of_order`):
    /// OUT_OF_ORDER_SEQUENCE_NUMBER once this leader shows a current lease, in the term it
    /// checked the batch in; else NOT_LEADER_OR_FOLLOWER.
    pub fn confirm_out_of_order(self: Rc<Self>) -> LocalBoxFuture<'static, BrokerError> {
        let term = self.raft.metrics().borrow_watched().current_term;
        async move {
            if unfix::out_of_order_without_lease() {
                return BrokerError::OutOfOrderSequence;
            }
            let lease = self.show_lease().await;
            let current = self.raft.metrics().borrow_watched().current_term;
            match lease {
                Ok(()) if current == term => BrokerError::OutOfOrderSequence,
                Ok(()) => BrokerError::NotLeaderOrFollower,
                Err(e) => e,
            }
        }
        .boxed_local()
    }

    /// The in-sync replicas as the leader sees them: itself and the followers that had its
    /// whole log as of some moment within `replica.lag.time.max.ms`. Empty on a follower.
    pub fn in_sync_replicas(&self) -> Vec<i32> {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        if m.current_leader != Some(self.node_id) {
            return Vec::new();
        }
        let now = now::<H>();
        let mut caught_up = self.caught_up.borrow_mut();
        let (term, caught_up) = &mut *caught_up;
        if *term != m.current_term {
            // A new term: every follower gets lag_max to catch up with this leader.
            *term = m.current_term;
            caught_up.clear();
            self.end_sample.set(None);
        }
        let sample = self.end_sample.get();
        let mut isr = vec![self.node_id as i32];
        for (id, matched) in m.replication.iter().flatten() {
            if *id == self.node_id {
                continue;
            }
            let matched = matched.map(|l| l.index);
            let as_of = if matched >= m.last_log_index {
                Some(now)
            } else {
                sample.filter(|(end, _)| matched >= *end).map(|(_, at)| at)
            };
            let since = caught_up.entry(*id).or_insert(now);
            if let Some(at) = as_of {
                *since = (*since).max(at);
            }
            // A quiet partition has no traffic to lag behind, so a follower whose node
            // stopped answering pings leaves too.
            if now.saturating_duration_since(*since) <= self.lag_max
                && self.transport.liveness(*id, self.group, self.lag_max).0
            {
                isr.push(*id as i32);
            }
        }
        self.sample_end(m.last_log_index, now);
        isr.sort_unstable();
        isr
    }

    /// Takes a new sample of the leader's log end for the ISR once the last one is old enough
    /// (see `end_sample`): a quarter of `replica.lag.time.max.ms`, at most `ISR_SAMPLE`.
    fn sample_end(&self, end: Option<u64>, now: At<H>) {
        let every = ISR_SAMPLE.min(self.lag_max / 4);
        if self
            .end_sample
            .get()
            .is_none_or(|(_, at)| now.saturating_duration_since(at) >= every)
        {
            self.end_sample.set(Some((end, now)));
        }
    }

    /// OffsetForLeaderEpoch: (largest epoch <= `epoch`, offset after its last batch).
    pub fn end_offset_for_epoch(&self, epoch: i32) -> Option<(i32, i64)> {
        let term = u64::try_from(epoch).ok()?;
        self.view
            .end_offset_for_term(term)
            .map(|(t, end)| (i32::try_from(t).unwrap_or(i32::MAX), end))
    }

    /// Quiescence: turns the group's ticks (openraft's heartbeats and election timer) off
    /// while it is idle and stable, and back on when anything moves, so thousands of idle
    /// partitions cost little. Called every few hundred ms; `settling` after this node stalled
    /// (what it heard is stale then), when nothing changes. Returns the group when this node
    /// leads it quietly: its node's coalesced beat must name it (`Transport::beat`).
    ///
    /// - A leader is quiet once, for `QUIET_AFTER`, nothing was appended, every answering
    ///   follower has its whole log and no follower's node went silent, came back or
    ///   reconnected; any such change makes it tick again.
    /// - A follower is quiet while its group hears from its leader (appends, or its leader
    ///   node's beats). After `LEADER_SILENT` it ticks again and, as nothing renewed its
    ///   leader's lease in the meantime, soon stands for election.
    pub fn tend(&self, settling: bool) -> Option<QuietLead> {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        let muted = self.check_quorum(&m, settling);
        let leading = m.state == openraft::ServerState::Leader
            && !muted
            && !self.transport.handing_over(self.group, m.current_term);
        let quiet = if settling {
            self.calm.set(None);
            self.quiet.get()
        } else {
            match m.current_leader {
                Some(leader) if leader != self.node_id => {
                    m.state == openraft::ServerState::Follower
                        && self
                            .transport
                            .heard(self.group)
                            .is_some_and(|t| t.elapsed() < LEADER_SILENT)
                }
                Some(_) if leading => {
                    self.sample_end(m.last_log_index, now::<H>());
                    let mut signature = DefaultHasher::new();
                    (m.current_term, m.last_log_index).hash(&mut signature);
                    let mut caught_up = true;
                    for (id, matched) in m.replication.iter().flatten() {
                        if *id == self.node_id {
                            continue;
                        }
                        let liveness = self.transport.liveness(*id, self.group, FOLLOWER_SILENT);
                        (id, liveness).hash(&mut signature);
                        caught_up &= !liveness.0 || matched.map(|l| l.index) == m.last_log_index;
                    }
                    let signature = signature.finish();
                    let now = now::<H>();
                    match self.calm.get() {
                        Some((seen, since)) if seen == signature && caught_up => {
                            now.saturating_duration_since(since) >= QUIET_AFTER
                        }
                        _ => {
                            self.calm.set(Some((signature, now)));
                            false
                        }
                    }
                }
                _ => false,
            }
        };
        self.set_quiet(quiet);
        (quiet && leading).then(|| QuietLead {
            group: self.group,
            term: m.current_term,
            followers: m
                .replication
                .iter()
                .flatten()
                .map(|(id, _)| *id)
                .filter(|id| *id != self.node_id)
                .collect(),
        })
    }

    /// Check quorum (issue 17, h; ferrolog-raft's `check_quorum`, which the simulator runs
    /// too): mutes the group's transport while a leader no majority acknowledged lately is
    /// to stay silent, so that its followers elect another. Returns whether it is muted.
    fn check_quorum(&self, m: &openraft::RaftMetrics<H::Raft>, settling: bool) -> bool {
        let leading = (m.state == openraft::ServerState::Leader
            && m.current_leader == Some(self.node_id))
        .then_some(m.current_term);
        let muted = self.check_quorum.borrow_mut().tend(
            self.group.0,
            leading,
            now::<H>(),
            || self.quorum_silent(m),
            settling,
        );
        self.transport.mute(self.group, muted);
        muted
    }

    /// Makes the group tick again at once (a proposal after a quiet spell, a follower that
    /// does not recognise this leader); it goes quiet again after `QUIET_AFTER` of calm.
    pub fn wake(&self) {
        self.calm.set(None);
        self.set_quiet(false);
    }

    fn set_quiet(&self, quiet: bool) {
        if quiet != self.quiet.get() {
            self.quiet.set(quiet);
            self.raft.runtime_config().tick(!quiet);
            tracing::debug!(
                group = self.group.0,
                quiet,
                "partition group ticks: {}",
                !quiet
            );
        }
    }

    /// The group's id on the wire.
    pub fn group(&self) -> GroupId {
        self.group
    }
}

/// Simulation only: fixes that the replica simulator can undo on its own thread
/// (`ferrolog-sim --replica --unfix c|producers|lease|reads|resync|read-start`), to show
/// that its checker finds the defects. The broker never sets them.
pub mod unfix {
    use std::cell::Cell;

    thread_local! {
        static OFFSETS_CONFIRM_DUPLICATES: Cell<bool> = const { Cell::new(false) };
        static SNAPSHOTS_WITHOUT_PRODUCERS: Cell<bool> = const { Cell::new(false) };
        static OUT_OF_ORDER_WITHOUT_LEASE: Cell<bool> = const { Cell::new(false) };
        static READS_WITHOUT_LEASE: Cell<bool> = const { Cell::new(false) };
        static RESYNC_WITH_TAIL: Cell<bool> = const { Cell::new(false) };
        static READS_BELOW_ASKED_START: Cell<bool> = const { Cell::new(false) };
        static SNAPSHOTS_WITHOUT_LOG_START: Cell<bool> = const { Cell::new(false) };
    }

    /// Snapshots carry no log start: a replica restarted from a snapshot that covers a
    /// log-start entry, before its purge moved its log there, forgets that entry and serves
    /// the records DeleteRecords deleted once it leads.
    pub fn set_snapshots_without_log_start(on: bool) {
        SNAPSHOTS_WITHOUT_LOG_START.with(|c| c.set(on));
    }

    pub(super) fn snapshots_without_log_start() -> bool {
        SNAPSHOTS_WITHOUT_LOG_START.with(Cell::get)
    }

    /// Reads see the log's own start only: a leader elected after it applied a log-start
    /// entry, before its retention moved its log there, serves the records DeleteRecords
    /// deleted.
    pub fn set_reads_below_asked_start(on: bool) {
        READS_BELOW_ASKED_START.with(|c| c.set(on));
    }

    pub(super) fn reads_below_asked_start() -> bool {
        READS_BELOW_ASKED_START.with(Cell::get)
    }

    /// A leader whose proposal was refused rebuilds its producer state from the applied one
    /// while its log still holds a batch that timed out uncommitted: that batch may still
    /// commit, and its retry is appended again.
    pub fn set_resync_with_tail(on: bool) {
        RESYNC_WITH_TAIL.with(|c| c.set(on));
    }

    pub(super) fn resync_with_tail() -> bool {
        RESYNC_WITH_TAIL.with(Cell::get)
    }

    /// Defect e of issue 17: a leader answers reads without a lease, so one cut off from its
    /// followers serves what a new leader may have changed already.
    pub fn set_reads_without_lease(on: bool) {
        READS_WITHOUT_LEASE.with(|c| c.set(on));
    }

    pub(super) fn reads_without_lease() -> bool {
        READS_WITHOUT_LEASE.with(Cell::get)
    }

    /// A leader refuses a batch out of sequence at once, lease or not, as a deposed one
    /// that does not know it yet does in Kafka.
    pub fn set_out_of_order_without_lease(on: bool) {
        OUT_OF_ORDER_WITHOUT_LEASE.with(|c| c.set(on));
    }

    pub(super) fn out_of_order_without_lease() -> bool {
        OUT_OF_ORDER_WITHOUT_LEASE.with(Cell::get)
    }

    /// Snapshots carry no producer state: a replica that restarts or installs one forgets
    /// the producers of the batches it covers, and takes their retries as new batches.
    pub fn set_snapshots_without_producers(on: bool) {
        SNAPSHOTS_WITHOUT_PRODUCERS.with(|c| c.set(on));
    }

    pub(super) fn snapshots_without_producers() -> bool {
        SNAPSHOTS_WITHOUT_PRODUCERS.with(Cell::get)
    }

    /// Defect c of issue 17: a retry is confirmed once the HW passes the offsets its
    /// original was given, whichever batch landed there.
    pub fn set_offsets_confirm_duplicates(on: bool) {
        OFFSETS_CONFIRM_DUPLICATES.with(|c| c.set(on));
    }

    pub(super) fn offsets_confirm_duplicates() -> bool {
        OFFSETS_CONFIRM_DUPLICATES.with(Cell::get)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_carries_the_log_start_asked_below_its_end() {
        let mut asked = AskedStarts::default();
        assert!(asked.raise(Some(11), 5)); // an entry at offset 10 asked for 5
        assert!(!asked.raise(Some(21), 5), "no rise");
        assert!(asked.raise(Some(31), 25)); // one at 30 asked for 25
        assert!(asked.raise(None, 27), "a rise no snapshot can place");
        assert_eq!(asked.wanted, 27);
        assert_eq!(asked.as_of(10), 0, "below the first entry");
        assert_eq!(asked.as_of(11), 5);
        assert_eq!(
            asked.as_of(30),
            5,
            "the entry at 30 is applied again after it"
        );
        assert_eq!(asked.as_of(31), 25);
        assert_eq!(
            asked.rises.len(),
            1,
            "the rise to 5 matters to no later snapshot"
        );
        assert_eq!(asked.as_of(1000), 25);
    }

    #[test]
    fn snapshot_state_keeps_the_log_start_and_reads_older_snapshots() {
        let mut producers = ProducerStates::default();
        producers.record(&BatchHeader {
            base_offset: 7,
            batch_length: 100,
            partition_leader_epoch: 0,
            magic: 2,
            crc: 0,
            attributes: 0,
            last_offset_delta: 2,
            base_timestamp: 1,
            max_timestamp: 1,
            producer_id: 42,
            producer_epoch: 0,
            base_sequence: 0,
            record_count: 3,
        });
        let aborted = vec![ferrolog_io::AbortedTxn {
            producer_id: 42,
            first_offset: 3,
            last_offset: 6,
            last_stable_offset: 7,
        }];
        let state = SnapshotState {
            log_start_wanted: 1234,
            producers,
            aborted: aborted.clone(),
        };
        let back = SnapshotState::decode(&state.encode()).unwrap();
        assert_eq!(back.log_start_wanted, 1234);
        assert_eq!(back.producers.encode(), state.producers.encode());
        assert_eq!(back.aborted, aborted);
        // Version 2: no aborted transactions.
        let mut v2 = vec![2u8];
        v2.extend_from_slice(&1234i64.to_be_bytes());
        v2.extend_from_slice(&state.producers.encode());
        let back = SnapshotState::decode(&v2).unwrap();
        assert_eq!(back.log_start_wanted, 1234);
        assert!(back.aborted.is_empty());
        // Before version 2: the producer state alone, or nothing.
        let older = SnapshotState::decode(&state.producers.encode()).unwrap();
        assert_eq!(older.log_start_wanted, 0);
        assert_eq!(older.producers.encode(), state.producers.encode());
        assert_eq!(SnapshotState::decode(&[]).unwrap().log_start_wanted, 0);
        // Damage is an error, never a panic.
        let encoded = state.encode();
        for cut in 1..encoded.len() {
            assert!(
                SnapshotState::decode(&encoded[..cut]).is_err(),
                "cut at {cut}"
            );
        }
    }

    /// A topic id other than `a` whose partition 0 has the same CRC32C key as `a`'s (CRC is
    /// linear: any combination of bit flips in the id that the CRC maps to zero keeps it).
    fn crc_twin(a: Uuid) -> Uuid {
        let key = |id: &[u8; 16]| {
            let mut k = [0u8; 20];
            k[..16].copy_from_slice(id);
            crc32c::crc32c(&k)
        };
        let zero = key(&[0; 16]);
        // Gaussian elimination over GF(2): each row is (CRC difference, the bits flipped).
        let mut rows: Vec<(u32, u128)> = Vec::new();
        for bit in 0..128 {
            let flip = 1u128 << bit;
            let mut diff = key(&flip.to_be_bytes()) ^ zero;
            let mut combo = flip;
            for (pivot_diff, pivot_combo) in &rows {
                let pivot = 31 - pivot_diff.leading_zeros();
                if diff >> pivot & 1 == 1 {
                    diff ^= pivot_diff;
                    combo ^= pivot_combo;
                }
            }
            if diff == 0 {
                let twin = u128::from_be_bytes(*a.as_bytes()) ^ combo;
                return Uuid::from_bytes(twin.to_be_bytes());
            }
            rows.push((diff, combo));
            rows.sort_by_key(|(d, _)| std::cmp::Reverse(*d));
        }
        unreachable!("128 vectors in a 32-bit space are dependent")
    }

    #[test]
    fn topics_whose_ids_hash_alike_get_distinct_groups() {
        let a = Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        let b = crc_twin(a);
        assert_ne!(a, b);
        // The hashed ids of topics created before Raft numbers collide for these two.
        assert_eq!(group_id(&a, None, 0), group_id(&b, None, 0));
        // Numbered topics never do, whatever their ids.
        assert_ne!(group_id(&a, Some(0), 0), group_id(&b, Some(1), 0));
    }

    #[test]
    fn numbered_group_ids_are_distinct_and_spread_over_shards() {
        let id = Uuid::from_u128(7);
        let mut seen = std::collections::HashSet::new();
        for number in (0..3000).chain([(1 << 30) - 1]) {
            for partition in [0, 1, 2, 63, 1000, i32::MAX] {
                let group = group_id(&id, Some(number), partition);
                assert_ne!(group.0, 0, "never the controller's group");
                assert!(seen.insert(group), "{number}/{partition} repeats {group:?}");
            }
        }
        // One-partition topics spread over a node's shards.
        for shards in [2, 3, 4] {
            let mut per_shard = vec![0; shards];
            for number in 0..120 {
                per_shard[group_id(&id, Some(number), 0).shard(shards)] += 1;
            }
            assert!(
                per_shard.iter().all(|n| *n == 120 / shards),
                "{shards} shards: {per_shard:?}"
            );
        }
    }
}
