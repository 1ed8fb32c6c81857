//! The replica simulator: ferrolog-raft's simulated world (`ferrolog_raft::sim`: three nodes,
//! simulated time, disks and network, and its fault schedule and checkers) running the
//! broker's own partition replica (`replication::Replica`) on every node, written by
//! idempotent producers that retry (`ferrolog-sim --replica`).
//!
//! What it adds to the bare world:
//! - each node hosts a `Replica` on a simulated host (`SimHost`): the Raft transport is the
//!   simulated network, the disk the node's simulated disk, the clock simulated time;
//! - a produce request takes the broker's path (`produce`, as the produce handler and
//!   `Partition::append` do once a batch is validated): the log's failure, the leader's
//!   readiness, the idempotent-producer sequence check, then a new proposal
//!   (`Replica::propose`), a retry's confirmation (`Replica::confirm_duplicate`) or an
//!   out-of-sequence refusal once the leader shows its lease
//!   (`Replica::confirm_out_of_order`); requests and answers take the network's delay, now
//!   and then seconds, so an original may arrive after its own retry;
//! - clients are idempotent producers, one batch in flight each, that retry a batch until it
//!   is acknowledged (after an error, or a timeout drawn per attempt, 0.3 to 3 s, as a client
//!   with a short `request.timeout.ms` would), so retries meet their originals in every
//!   state;
//! - consumers fetch from where they got to (`fetch`, as the Fetch handler does: the read
//!   lease, then the log up to the HW), and ask ListOffsets for the earliest offset when
//!   retention passed them, and now and then for the earliest or the latest;
//! - an admin deletes records every few seconds (`delete_records`, as the DeleteRecords
//!   handler does), and each follower moves its log start once it applies the log-start
//!   entry (`follow_log_start`, as the shard's retention loop does).
//!
//! The checkers are the bare world's, plus these: an acknowledgement names a Kafka offset,
//! and the batch must have been applied there (`Checker::acked_at`: a retry confirmed at
//! offsets that hold another batch is "misreported"); a record applied at two indexes is a
//! duplicate the producer state let through; an answer a correct broker never gives to
//! these batches and fetches (out of sequence from a leader with a lease, anything but a
//! retriable error) is "refused"; a fetch must see a HW no lower than what clients were
//! shown committed before it asked, and read only batches below it that were applied where
//! it read them (`Checker::fetched`: "stale read", "read past the HW", "read uncommitted");
//! and once DeleteRecords answered, nothing below the offset it deleted up to may be read or
//! answered as the earliest offset (`Checker::fetched`, `Checker::listed`: "read deleted",
//! "stale log start").
//!
//! With `--groups` the partition is an offsets partition, and the broker's group coordinator
//! (`crate::group`) runs on every node over it, through `group::OffsetsLog` (which `Node`
//! serves here, as `Partition` does on a shard):
//! - each node's coordinator follows its replica's leadership and loads the groups when it
//!   begins to lead (`follow_leadership`, as the shard's tick loop does);
//! - committers (the clients) commit their positions 1, 2, 3, ... one request at a time
//!   (`commit_offset`, the OffsetCommit handler's path: `group::check_coordinator`, then
//!   `group::write_offsets`), and after one commit in eight delete them before the next
//!   (`delete_offset`: DeleteGroups' path, `group::delete_group`, or OffsetDelete's,
//!   `group::delete_offsets`); two fetchers ask for them (`fetch_offset`, OffsetFetch's
//!   path);
//! - each leader rewrites the live state every few seconds and moves the log start past the
//!   older records (`rewriter`, `group::rewrite`), and expires the offsets of committers
//!   that committed nothing for 5 s (`expirer`, `group::write_expiries`); time and size
//!   retention do not run, as the topic is compact-only, and no DeleteRecords either.
//!
//! Its checkers are the world's (replicas agree and converge, commits are acknowledged again
//! once the faults heal) and `Checker::offset_fetched`: no OffsetFetch answers a state older
//! than one acknowledged or answered before it was asked (a lower offset, an offset from
//! before a deletion or expiry, or none where no deletion or expiry since explains it), nor
//! an offset never sent.
//!
//! Not simulated yet: quiescence and the coalesced beats (`Replica::tend`; leaders run check
//! quorum as the bare world does), preferred-leader handovers, long-polling fetches,
//! ListOffsets by timestamp, the controller, and in the coordinator group rebalances.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrolog_io::batch::{self, BatchHeader};
use ferrolog_raft::entry::Entry;
use ferrolog_raft::network::GroupTaken;
use ferrolog_raft::openraft::async_runtime::Instant as _;
use ferrolog_raft::openraft::impls::ProgressResponder;
use ferrolog_raft::openraft::type_config::alias::WriteResponderOf;
use ferrolog_raft::openraft::{self, AsyncRuntime};
use ferrolog_raft::sim::fs::SimFs;
use ferrolog_raft::sim::net::{Factory, Net};
use ferrolog_raft::sim::runtime::{random_u64, spawn_on, NodeId, SimInstant, SimRuntime};
use ferrolog_raft::sim::store::{batch_of, record_in, record_of};
use ferrolog_raft::sim::{
    retention, tend, Checker, ClientCtx, Mode, NodeCtx, Record, SimRaft, CLIENTS, DIR, NODES,
};
use ferrolog_raft::store::Clock;
use ferrolog_raft::wire::{GroupId, Handover};
use futures::channel::oneshot::{self, Canceled};
use futures::future::LocalBoxFuture;
use futures::FutureExt;

use crate::config::GroupConfig;
use crate::errors::BrokerError;
use crate::group::{self, GroupCoordinator, OffsetsLog};
use crate::partition::Appended;
use crate::producer_state::{ProducerStates, SequenceCheck};
use crate::replication::host::{At, Host, HostRaft, WriteReceiver};
use crate::replication::raft::unfix;
use crate::replication::{Placement, Replica};
use ferrolog_io::Log;

/// The simulated partition's group id.
const GROUP: GroupId = GroupId(1 << 63 | 1);

/// A node's host: the simulated network, disk and clock.
struct SimHost {
    node: NodeId,
    config: Arc<openraft::Config>,
    net: Rc<Net>,
    disk: SimFs,
    checker: Rc<Checker>,
    /// Every running node's partition, whose log starts `log_start` asks for.
    nodes: Nodes,
    /// The partition holds coordinator records, not the clients' (`--groups`).
    groups: bool,
}

/// The running nodes' partitions.
type Nodes = Rc<RefCell<BTreeMap<NodeId, Rc<Node>>>>;

impl Host for SimHost {
    type Raft = SimRaft;
    type Fs = SimFs;
    type Network = Factory;

    fn raft_config(&self) -> Arc<openraft::Config> {
        self.config.clone()
    }
    fn fs(&self) -> SimFs {
        self.disk.clone()
    }
    fn clock(&self) -> Clock {
        Rc::new(now_ms)
    }
    fn factory(self: &Rc<Self>, _group: GroupId) -> Factory {
        Factory {
            node: self.node,
            net: self.net.clone(),
        }
    }
    fn register(
        &self,
        _group: GroupId,
        raft: HostRaft<Self>,
        _log: Rc<Log<SimFs>>,
    ) -> Result<(), GroupTaken> {
        self.net.set_raft(self.node, Some(raft));
        Ok(())
    }
    fn unregister(&self, _group: GroupId) {
        self.net.set_raft(self.node, None);
    }
    fn hold_votes(&self, _group: GroupId) {
        self.net.hold_votes(self.node);
    }
    fn handing_over(&self, _group: GroupId, _term: u64) -> bool {
        false
    }
    fn elect(&self, _group: GroupId, _to: u64) -> LocalBoxFuture<'_, Handover> {
        async { Handover::NotLeader }.boxed_local()
    }
    fn log_start(
        &self,
        node_id: u64,
        _group: GroupId,
        ttl: Duration,
    ) -> LocalBoxFuture<'_, Result<i64, String>> {
        let nodes = self.nodes.clone();
        let ask = move |_, ()| {
            let start = nodes.borrow().get(&node_id).map(|n| n.log.start_offset());
            async move { start }
        };
        let answer = self.net.call(self.node, node_id, ttl, (), ask);
        async move { answer.await.map_err(|e| e.to_string()) }.boxed_local()
    }
    fn liveness(&self, _node_id: u64, _group: GroupId, _within: Duration) -> (bool, u64) {
        (true, 0)
    }
    fn heard(&self, _group: GroupId) -> Option<At<Self>> {
        None
    }
    fn followed_by(&self, _group: GroupId, _term: u64, _followers: usize) -> Option<At<Self>> {
        None
    }
    fn mute(&self, _group: GroupId, muted: bool) {
        self.net.mute(self.node, muted);
    }
    fn write_responder() -> (WriteResponderOf<SimRaft>, WriteReceiver<Self>) {
        ProgressResponder::complete_only()
    }
    fn applied(&self, entry: &Entry, base_offset: Option<i64>) {
        let (node, index) = (self.node, entry.log_id.index);
        let record = record_of(entry).filter(|_| !self.groups);
        match base_offset {
            Some(offset) => self.checker.applied(node, entry.log_id, record, offset),
            None => self
                .checker
                .violation(format!("node {node} applied entry {index}, not in its log")),
        }
    }
}

/// A running node's partition: its replica, log, and the leader's producer state (what
/// `Partition` holds), and the node's group coordinator (what `Shard::groups` holds).
struct Node {
    replica: Rc<Replica<SimHost>>,
    log: Rc<Log<SimFs>>,
    producers: RefCell<ProducerStates>,
    groups: RefCell<GroupCoordinator>,
    group_config: GroupConfig,
}

/// The partition as the group coordinator sees its offsets partition, as `Partition` serves
/// it: reads are the loader's (the leader's committed batches), and an append takes the
/// produce path of a batch without a producer id (`produce`).
impl OffsetsLog for Node {
    fn is_leader(&self) -> bool {
        self.replica.is_leader()
    }
    fn leader_epoch(&self) -> i32 {
        self.replica.leader_epoch()
    }
    fn read_lease(&self) -> LocalBoxFuture<'_, Result<(), BrokerError>> {
        self.replica.read_lease().boxed_local()
    }
    fn high_watermark(&self) -> i64 {
        self.replica.high_watermark()
    }
    fn log_start(&self) -> i64 {
        self.replica.log_start(&self.log)
    }
    fn stored_start(&self) -> i64 {
        self.log.start_offset()
    }
    fn log_end(&self) -> i64 {
        self.log.end_offset()
    }
    /// `Replication::move_log_start`: a log-start entry, then this replica's retention.
    fn move_log_start(
        &self,
        offset: i64,
        now_ms: i64,
    ) -> LocalBoxFuture<'_, Result<i64, BrokerError>> {
        let (replica, log) = (&self.replica, &self.log);
        async move {
            if !replica.log_start_proposed(offset) {
                replica
                    .propose_log_start(&self.producers, log.end_offset(), offset, now_ms)
                    .await?;
            }
            if log.start_offset() < offset {
                replica
                    .apply_retention(log, now_ms, None, true)
                    .await
                    .map_err(|e| BrokerError::RequestTimedOut(e.to_string()))?;
            }
            Ok(log.start_offset())
        }
        .boxed_local()
    }
    fn read_committed(
        &self,
        offset: i64,
        max_bytes: usize,
    ) -> LocalBoxFuture<'_, Result<Bytes, BrokerError>> {
        async move {
            if !self.replica.is_leader() {
                return Err(BrokerError::NotLeaderOrFollower);
            }
            let high_watermark = self.replica.high_watermark();
            if offset < self.replica.log_start(&self.log) {
                return Err(BrokerError::OffsetOutOfRange);
            }
            self.log
                .read(offset, max_bytes, high_watermark, true)
                .await
                .map_err(BrokerError::from_log)
        }
        .boxed_local()
    }
    fn append_batch(
        self: &Rc<Self>,
        batch: &Bytes,
        _now_ms: i64,
    ) -> LocalBoxFuture<'static, Result<Appended, BrokerError>> {
        if let Some(e) = self.log.failure() {
            let e = BrokerError::Storage(e.to_string());
            return async { Err(e) }.boxed_local();
        }
        if let Err(e) = self.replica.ready(&self.producers, self.log.end_offset()) {
            return async { Err(e) }.boxed_local();
        }
        let header = batch::verify(batch).expect("the coordinator writes valid batches");
        let (_, _, commit) = self
            .replica
            .propose(&self.producers, batch.clone(), &header, -1);
        commit
    }
}

/// The fixes `--replica` can undo (`raft::unfix`), to show the checker finds each defect:
/// `c`, issue 17's defect c (a retry confirmed by its original's offsets alone);
/// `producers`, snapshots without the producer state; `lease`, a refusal out of sequence
/// without the leader's lease; `reads`, issue 17's defect e (reads answered without a
/// lease); `resync`, a leader's producer state rebuilt while a batch that timed out
/// uncommitted is still in its log; `read-start`, reads that see the log's own start, so a
/// leader elected before it moved its log start to a log-start entry's serves deleted
/// records; `snapshot-start`, snapshots without the log start that log-start entries asked
/// for, so a replica restarted from one before its purge moved its log start forgets it;
/// `f` (with `--groups`), issue 17's defect f (offsets shown before their write is durable);
/// `load-start` (with `--groups`), loads that replay from the log's own start, so a leader
/// that applied a rewrite's log-start entry before its log moved there fails to load;
/// `group-delete` (with `--groups`), DeleteGroups shown before its tombstones are durable;
/// `expire` (with `--groups`), expired offsets gone before their tombstones are durable.
pub const UNFIXES: [&str; 11] = [
    "c",
    "producers",
    "lease",
    "reads",
    "resync",
    "read-start",
    "snapshot-start",
    "f",
    "load-start",
    "group-delete",
    "expire",
];

/// The fixes of `UNFIXES` that only `--groups` runs.
pub const GROUPS_UNFIXES: [&str; 4] = ["f", "load-start", "group-delete", "expire"];

/// The broker's replica on every node (see the module doc).
pub struct ReplicaMode {
    /// Which of `UNFIXES` are undone.
    unfixed: Vec<&'static str>,
    nodes: Nodes,
    /// The partition is an offsets partition, written by the group coordinator for
    /// consumers that commit (`--groups`), instead of a partition of idempotent producers.
    groups: bool,
}

impl ReplicaMode {
    /// Undoes the fixes named in `unfix` (each one of `UNFIXES`, else None); `groups`: the
    /// partition is an offsets partition (`ReplicaMode::groups`).
    pub fn new(unfix: &[&str], groups: bool) -> Option<ReplicaMode> {
        let unfixed = unfix
            .iter()
            .map(|u| UNFIXES.iter().copied().find(|k| k == u))
            .collect::<Option<Vec<_>>>()?;
        Some(ReplicaMode {
            unfixed,
            nodes: Rc::default(),
            groups,
        })
    }
}

impl std::fmt::Debug for ReplicaMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.flags())
    }
}

impl Mode for ReplicaMode {
    fn start(&self, ctx: NodeCtx) -> LocalBoxFuture<'static, ()> {
        let nodes = self.nodes.clone();
        let undone = |fix| self.unfixed.contains(&fix);
        unfix::set_offsets_confirm_duplicates(undone("c"));
        unfix::set_snapshots_without_producers(undone("producers"));
        unfix::set_out_of_order_without_lease(undone("lease"));
        unfix::set_reads_without_lease(undone("reads"));
        unfix::set_resync_with_tail(undone("resync"));
        unfix::set_reads_below_asked_start(undone("read-start"));
        unfix::set_snapshots_without_log_start(undone("snapshot-start"));
        group::unfix::set_offsets_shown_at_append(undone("f"));
        group::unfix::set_loads_from_the_stored_start(undone("load-start"));
        group::unfix::set_groups_deleted_at_append(undone("group-delete"));
        group::unfix::set_expiries_shown_at_append(undone("expire"));
        let groups = self.groups;
        async move {
            let NodeCtx {
                node,
                disk,
                net,
                checker,
                stores,
                config,
                check_quorum,
                ..
            } = ctx;
            let host = Rc::new(SimHost {
                node,
                config,
                net: net.clone(),
                disk: disk.clone(),
                checker: checker.clone(),
                nodes: nodes.clone(),
                groups,
            });
            let log_start_asked = Rc::new(tokio::sync::Notify::new());
            let replicas: Vec<i32> = NODES.iter().map(|&n| n as i32).collect();
            let placement = Placement {
                node_id: node as i32,
                replicas: &replicas,
                addrs: &BTreeMap::new(),
                group: GROUP,
                lag_max: Duration::from_secs(10),
                log_start_asked: log_start_asked.clone(),
                transport: &host,
            };
            let opened = Replica::open(Path::new(DIR), ferrolog_raft::sim::log_config(), placement);
            let (log, replica) = match opened.await {
                Ok(opened) => opened,
                // A disk that failed meanwhile fails the open; the node stays down until the
                // disk is mended.
                Err(_) if disk.failed() => return,
                Err(e) => {
                    checker.violation(format!("unopenable: node {node}'s replica: {e}"));
                    return;
                }
            };
            let replica = Rc::new(replica);
            stores
                .borrow_mut()
                .insert(node, (replica.view.reader(), replica.view.clone()));
            let raft = replica.raft.clone();
            let view = replica.view.clone();
            // An offsets partition is compact-only: no time or size retention trims it.
            if !groups {
                spawn_on(
                    node,
                    retention(raft.clone(), view, log.clone(), checker.clone()),
                );
            }
            let this = Rc::new(Node {
                replica,
                log,
                producers: RefCell::default(),
                groups: RefCell::default(),
                group_config: GroupConfig::default(),
            });
            spawn_on(node, follow_log_start(this.clone(), log_start_asked));
            if groups {
                spawn_on(node, follow_leadership(node, this.clone()));
                spawn_on(node, rewriter(node, this.clone(), checker.clone()));
                spawn_on(node, expirer(this.clone(), checker.clone()));
            }
            nodes.borrow_mut().insert(node, this);
            if check_quorum {
                tend(node, raft, net).await;
            }
        }
        .boxed_local()
    }

    fn client(&self, id: u32, ctx: ClientCtx) -> LocalBoxFuture<'static, ()> {
        let nodes = self.nodes.clone();
        match self.groups {
            true => committer(id, ctx, nodes).boxed_local(),
            false => producer(id, ctx, nodes).boxed_local(),
        }
    }

    fn others(&self, ctx: ClientCtx) -> Vec<LocalBoxFuture<'static, ()>> {
        let nodes = &self.nodes;
        if self.groups {
            return (0..2)
                .map(|_| offset_fetcher(ctx.clone(), nodes.clone()).boxed_local())
                .collect();
        }
        vec![
            consumer(0, ctx.clone(), nodes.clone()).boxed_local(),
            consumer(1, ctx.clone(), nodes.clone()).boxed_local(),
            deleter(ctx, nodes.clone()).boxed_local(),
        ]
    }

    fn crashed(&self, node: NodeId) {
        self.nodes.borrow_mut().remove(&node);
    }

    fn self_initializing(&self) -> bool {
        // The first replica of a new partition initializes its group (`Replica::open`).
        true
    }

    /// With `--groups`: every committed offset a client was shown survived the power loss,
    /// read on the node that leads and has loaded the groups since (as an OffsetFetch would
    /// be answered, without the request's faults).
    fn settled(&self, checker: &Checker) {
        if !self.groups {
            return;
        }
        let nodes = self.nodes.borrow();
        let coordinator = nodes.iter().find(|(_, n)| {
            n.replica.is_leader() && n.groups.borrow().is_loaded_in(0, n.replica.leader_epoch())
        });
        let Some((&id, node)) = coordinator else {
            checker
                .violation("unrecovered: no node coordinates the groups after a power loss".into());
            return;
        };
        for committer in checker.committers() {
            let shown = checker.offset_shown(committer);
            checker.offset_fetched(id, committer, shown, committed_offset(node, committer));
        }
    }

    fn flags(&self) -> String {
        let groups = if self.groups { " --groups" } else { "" };
        let unfix: String = self
            .unfixed
            .iter()
            .map(|u| format!(" --unfix {u}"))
            .collect();
        format!("--replica{groups}{unfix}")
    }
}

/// A produce request for one validated batch, on the node, with acks=all: the produce
/// handler's and `Partition::append`'s path once the batch is validated (the log's failure,
/// the leader's readiness, the sequence check, then a new proposal, a retry's confirmation,
/// or a refusal that waits for the leader's lease).
async fn produce(
    node: Rc<Node>,
    bytes: Bytes,
    header: BatchHeader,
) -> Result<Appended, BrokerError> {
    if let Some(e) = node.log.failure() {
        return Err(BrokerError::Storage(e.to_string()));
    }
    node.replica.ready(&node.producers, node.log.end_offset())?;
    let check = node.producers.borrow().check(&header);
    match check {
        SequenceCheck::Accept => {
            let (_, _, commit) = node.replica.propose(&node.producers, bytes, &header, -1);
            commit.await
        }
        SequenceCheck::Duplicate {
            base_offset,
            timestamp,
        } => {
            let appended = Appended::duplicate(&header, base_offset, timestamp);
            let replica = node.replica.clone();
            replica.confirm_duplicate(header, appended).await
        }
        SequenceCheck::OutOfOrder => Err(node.replica.clone().confirm_out_of_order().await),
        SequenceCheck::StaleEpoch => Err(BrokerError::InvalidProducerEpoch),
        SequenceCheck::TxnOpen => Err(BrokerError::InvalidTxnState),
    }
}

/// How long a produce request or its answer takes on the way: the network's delay, and now
/// and then (1 in 20) up to 4 s, so an original may reach its leader after its own retry.
fn network_delay(net: &Net) -> Duration {
    let max = match random_u64() % 20 {
        0 => Duration::from_secs(4),
        _ => net.weather.delay_max,
    };
    Duration::from_nanos(random_u64() % (max.as_nanos() as u64 + 1))
}

/// Any node.
fn random_node() -> NodeId {
    NODES[(random_u64() % NODES.len() as u64) as usize]
}

/// Where a client goes after NOT_LEADER_OR_FOLLOWER from `target`: it refreshes its
/// metadata, and the node names the leader it knows (else any node).
fn redirect(node: Option<Rc<Node>>, target: NodeId) -> NodeId {
    let hint = node.and_then(|n| n.replica.leader()).map(|l| l as NodeId);
    hint.filter(|&l| l != target).unwrap_or_else(random_node)
}

/// Sends a request to node `target`, whose running partition is `node` (None: not running,
/// so nothing ever answers): it reaches the node after the network's delay and runs there
/// (`handle`), and its answer takes another delay back. A crash of the node meanwhile drops
/// the request, and the answer is Err.
fn request<T, F>(
    net: &Rc<Net>,
    target: NodeId,
    node: Option<Rc<Node>>,
    handle: impl FnOnce(Rc<Node>) -> F + 'static,
) -> LocalBoxFuture<'static, Result<T, Canceled>>
where
    T: 'static,
    F: Future<Output = T> + 'static,
{
    let Some(node) = node else {
        return futures::future::pending().boxed_local();
    };
    let (tx, rx) = oneshot::channel();
    let net = net.clone();
    spawn_on(target, async move {
        SimRuntime::sleep(network_delay(&net)).await;
        let answer = handle(node).await;
        SimRuntime::sleep(network_delay(&net)).await;
        let _ = tx.send(answer);
    });
    rx.boxed_local()
}

/// The batch of `record` as idempotent producer `producer_id` (epoch 0) sends it, starting at
/// sequence `sequence`; the record's identity is in its timestamp (`batch_of`).
fn idempotent_batch(record: Record, producer_id: i64, sequence: i32) -> (Bytes, BatchHeader) {
    let mut bytes = batch_of(record).0.to_vec();
    bytes[43..51].copy_from_slice(&producer_id.to_be_bytes());
    bytes[51..53].copy_from_slice(&0i16.to_be_bytes());
    bytes[53..57].copy_from_slice(&sequence.to_be_bytes());
    let crc = batch::compute_crc(&bytes);
    bytes[17..21].copy_from_slice(&crc.to_be_bytes());
    let header = batch::verify(&bytes).expect("a valid batch");
    (Bytes::from(bytes), header)
}

/// An idempotent producer: sends its batches one at a time to the node it believes leads,
/// and retries each, unchanged, until it is acknowledged. What a Kafka producer retries
/// (NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT, KAFKA_STORAGE_ERROR, no answer) it retries;
/// any other answer is a violation (a correct broker gives none to these batches).
async fn producer(id: u32, ctx: ClientCtx, nodes: Nodes) {
    let ClientCtx {
        net,
        checker,
        stop,
        last_ack,
    } = ctx;
    let producer_id = 1000 + i64::from(id);
    let mut target = NODES[id as usize % NODES.len()];
    let (mut seq, mut sequence) = (0u32, 0i32);
    while !stop.get() {
        let record = Record { client: id, seq };
        let (bytes, header) = idempotent_batch(record, producer_id, sequence);
        while !stop.get() {
            let node = nodes.borrow().get(&target).cloned();
            let bytes = bytes.clone();
            let rx = request(&net, target, node.clone(), move |n| {
                produce(n, bytes, header)
            });
            let timeout = Duration::from_millis(300 + random_u64() % 2700);
            let answer = SimRuntime::timeout(timeout, rx).await;
            match answer {
                Ok(Ok(Ok(appended))) => {
                    checker.acked_at(record, appended.base_offset);
                    checker.shown(appended.end_offset);
                    last_ack.set(SimInstant::now());
                    break;
                }
                Ok(Ok(Err(BrokerError::NotLeaderOrFollower))) => {
                    target = redirect(node, target);
                    SimRuntime::sleep(Duration::from_millis(10)).await;
                }
                Ok(Ok(Err(BrokerError::RequestTimedOut(_) | BrokerError::Storage(_))))
                | Ok(Err(_))
                | Err(_) => {
                    target = random_node();
                    SimRuntime::sleep(Duration::from_millis(50)).await;
                }
                Ok(Ok(Err(e))) => {
                    checker.violation(format!(
                        "refused: {record} (sequence {sequence}) refused by node {target}: {e}"
                    ));
                    return;
                }
            }
        }
        seq += 1;
        sequence += header.record_count;
        SimRuntime::sleep(Duration::from_millis(random_u64() % 20)).await;
    }
}

/// A fetch's answer: the HW and the client batches read (base offset, end offset, record).
struct Fetched {
    high_watermark: i64,
    batches: Vec<(i64, i64, Record)>,
}

/// A fetch from `offset` on the node: what the Fetch handler does (`Partition::check_read`,
/// then `Partition::read`): the leader's lease, then the log up to the HW. Control batches
/// (Raft's own entries) are skipped, as consumers skip them.
async fn fetch(node: Rc<Node>, offset: i64) -> Result<Fetched, BrokerError> {
    if !node.replica.is_leader() {
        return Err(BrokerError::NotLeaderOrFollower);
    }
    node.replica.read_lease().await?;
    if !node.replica.is_leader() {
        return Err(BrokerError::NotLeaderOrFollower);
    }
    let high_watermark = node.replica.high_watermark();
    if offset < node.replica.log_start(&node.log) {
        return Err(BrokerError::OffsetOutOfRange);
    }
    let bytes = node
        .log
        .read(offset, 2000, high_watermark, true)
        .await
        .map_err(BrokerError::from_log)?;
    let mut batches = Vec::new();
    let mut rest = &bytes[..];
    while !rest.is_empty() {
        let bad = |e| BrokerError::Storage(format!("a fetch read a bad batch: {e}"));
        let len = BatchHeader::parse(rest).map_err(bad)?.total_bytes();
        let batch = rest.get(..len).ok_or_else(|| {
            BrokerError::Storage(format!("a fetch read a batch cut at {}", rest.len()))
        })?;
        let header = batch::verify(batch).map_err(bad)?;
        if !header.is_control() {
            batches.push((header.base_offset, header.next_offset(), record_in(&header)));
        }
        rest = &rest[len..];
    }
    Ok(Fetched {
        high_watermark,
        batches,
    })
}

/// What a consumer asks a node: a fetch from an offset, or ListOffsets for the earliest or
/// the latest offset.
#[derive(Clone, Copy)]
enum Ask {
    Fetch(i64),
    Earliest,
    Latest,
}

/// A node's answer to an `Ask`.
enum Answer {
    Fetched(Fetched),
    Offset(i64),
}

/// ListOffsets on the node, as its handler answers earliest (-2) and latest (-1): the
/// leader's lease, then the log start or the HW.
async fn list_offset(node: Rc<Node>, earliest: bool) -> Result<i64, BrokerError> {
    if !node.replica.is_leader() {
        return Err(BrokerError::NotLeaderOrFollower);
    }
    node.replica.read_lease().await?;
    Ok(match earliest {
        true => node.replica.log_start(&node.log),
        false => node.replica.high_watermark(),
    })
}

/// A consumer: fetches from where it got to, from the node it believes leads, and reports
/// every answer to the checker (`Checker::fetched`, `Checker::listed`) with what clients had
/// been shown when it asked. It starts at the earliest offset, goes there again when its
/// position fell below the log start (`auto.offset.reset=earliest`), and now and then seeks
/// to the beginning or the end.
async fn consumer(id: u32, ctx: ClientCtx, nodes: Nodes) {
    let ClientCtx {
        net, checker, stop, ..
    } = ctx;
    let mut target = NODES[id as usize % NODES.len()];
    let mut ask = Ask::Earliest;
    while !stop.get() {
        let node = nodes.borrow().get(&target).cloned();
        let visible = checker.visible();
        let rx = request(&net, target, node.clone(), move |node| async move {
            match ask {
                Ask::Fetch(offset) => fetch(node, offset).await.map(Answer::Fetched),
                Ask::Earliest => list_offset(node, true).await.map(Answer::Offset),
                Ask::Latest => list_offset(node, false).await.map(Answer::Offset),
            }
        });
        let pause = match SimRuntime::timeout(Duration::from_secs(3), rx).await {
            Ok(Ok(Ok(Answer::Fetched(fetched)))) => {
                let Ask::Fetch(from) = ask else {
                    unreachable!("a fetch answers a fetch")
                };
                let (hw, batches) = (fetched.high_watermark, &fetched.batches);
                checker.fetched(target, visible, from, hw, batches);
                let read = batches.last().map(|&(_, end, _)| end);
                if let Some(end) = read {
                    ask = Ask::Fetch(end);
                }
                ask = match random_u64() % 20 {
                    0 => Ask::Earliest,
                    1 => Ask::Latest,
                    _ => ask,
                };
                Duration::from_millis(if read.is_some() { 5 } else { 50 })
            }
            Ok(Ok(Ok(Answer::Offset(offset)))) => {
                checker.listed(target, visible, matches!(ask, Ask::Earliest), offset);
                ask = Ask::Fetch(offset);
                Duration::ZERO
            }
            Ok(Ok(Err(BrokerError::OffsetOutOfRange))) => {
                ask = Ask::Earliest;
                Duration::ZERO
            }
            Ok(Ok(Err(BrokerError::NotLeaderOrFollower))) => {
                target = redirect(node, target);
                Duration::from_millis(10)
            }
            Ok(Ok(Err(BrokerError::Storage(_)))) | Ok(Err(_)) | Err(_) => {
                target = random_node();
                Duration::from_millis(50)
            }
            Ok(Ok(Err(e))) => {
                checker.violation(format!(
                    "refused: consumer {id}'s request refused by node {target}: {e}"
                ));
                return;
            }
        };
        SimRuntime::sleep(pause).await;
    }
}

/// The simulated clock in milliseconds, as the broker's `now_ms`.
fn now_ms() -> i64 {
    SimInstant::now().since_start().as_millis() as i64
}

/// What the shard's retention loop does for a follower once it applies a log-start entry
/// (`Replication::apply_retention`, not full): moves its log start there. The loop serves
/// every partition of the shard one after another, and waits on each one's snapshot and
/// purge, so it comes to this one up to seconds later.
async fn follow_log_start(node: Rc<Node>, asked: Rc<tokio::sync::Notify>) {
    loop {
        asked.notified().await;
        SimRuntime::sleep(Duration::from_millis(random_u64() % 3000)).await;
        let replica = &node.replica;
        if replica.log_start_asked(&node.log) && !replica.is_leader() {
            let _ = replica
                .apply_retention(&node.log, now_ms(), None, true)
                .await;
        }
    }
}

/// A DeleteRecords request on the node, up to a random offset between the log start and the
/// HW: what the DeleteRecords handler does (`Replication::move_log_start`, then
/// `wait_low_watermark` over the nodes `live` holds, within 5 s). Returns the offset asked
/// for and the low watermark.
async fn delete_records(node: Rc<Node>, live: Vec<NodeId>) -> Result<(i64, i64), BrokerError> {
    if !node.replica.is_leader() {
        return Err(BrokerError::NotLeaderOrFollower);
    }
    let (start, hw) = (node.log.start_offset(), node.replica.high_watermark());
    let target = start + (random_u64() % (hw - start + 1).max(1) as u64) as i64;
    node.move_log_start(target, now_ms()).await?;
    let deadline = SimInstant::now() + Duration::from_secs(5);
    let live = |id| live.contains(&(id as NodeId));
    let log = &node.log;
    node.replica
        .wait_low_watermark(log, target, live, deadline)
        .await
        .map(|low| (target, low))
}

/// An admin that now and then deletes records (`delete_records`) through the node it
/// believes leads, and reports each deletion answered (`Checker::deleted`): no fetch asked
/// later may return a batch wholly below the offset it asked for.
async fn deleter(ctx: ClientCtx, nodes: Nodes) {
    let ClientCtx {
        net, checker, stop, ..
    } = ctx;
    let mut target = random_node();
    while !stop.get() {
        SimRuntime::sleep(Duration::from_millis(1000 + random_u64() % 4000)).await;
        let node = nodes.borrow().get(&target).cloned();
        let live: Vec<NodeId> = nodes.borrow().keys().copied().collect();
        let rx = request(&net, target, node.clone(), move |n| delete_records(n, live));
        match SimRuntime::timeout(Duration::from_secs(10), rx).await {
            Ok(Ok(Ok((offset, low)))) => checker.deleted(target, offset, low),
            Ok(Ok(Err(BrokerError::NotLeaderOrFollower))) => {
                target = redirect(node, target);
            }
            Ok(Ok(Err(BrokerError::RequestTimedOut(_) | BrokerError::Storage(_))))
            | Ok(Err(_))
            | Err(_) => target = random_node(),
            Ok(Ok(Err(e))) => {
                checker.violation(format!("refused: a DeleteRecords on node {target}: {e}"));
                return;
            }
        }
    }
}

/// The topic whose offsets the committers commit (`--groups`); committer `c` commits its
/// position in partition `c`, in group `g{c}`.
const TOPIC: &str = "t";

/// What the shard's tick loop does for an offsets partition (`group::follow_leadership`):
/// every 100 ms the node's coordinator follows the replica's leadership, and loads the
/// partition's groups (`group::load`) when it begins to lead.
async fn follow_leadership(id: NodeId, node: Rc<Node>) {
    loop {
        let (leads, epoch) = (node.replica.is_leader(), node.replica.leader_epoch());
        let load = node.groups.borrow_mut().follow(0, leads, epoch);
        if let Some(load) = load {
            let node = node.clone();
            spawn_on(id, async move {
                let cfg = &node.group_config;
                group::load(&node.groups, cfg, 0, &*node, load, now_ms).await;
            });
        }
        SimRuntime::sleep(Duration::from_millis(100)).await;
    }
}

/// Records an offsets partition may hold beyond twice its live records before the rewrite
/// (the broker's is 10,000; this one makes rewrites happen every few seconds).
const REWRITE_SLACK_RECORDS: i64 = 30;

/// What the shard's tick loop does for an offsets partition it coordinates
/// (`group::rewrite`): every 1 to 4 s (the broker: 30 s) the live state is rewritten once
/// the log holds enough more, and the log start moved to it; a rewrite put off for an
/// offset write in flight is tried again each tick.
async fn rewriter(id: NodeId, node: Rc<Node>, checker: Rc<Checker>) {
    let mut pause = Duration::ZERO;
    loop {
        SimRuntime::sleep(pause).await;
        pause = Duration::from_millis(1000 + random_u64() % 3000);
        match group::rewrite(&node.groups, 0, &node, REWRITE_SLACK_RECORDS, now_ms()) {
            group::Rewrite::Unneeded => {}
            group::Rewrite::PutOff => pause = Duration::from_millis(100),
            group::Rewrite::Started(done) => {
                let checker = checker.clone();
                spawn_on(id, async move {
                    if done.await {
                        checker.rewrote();
                    }
                });
            }
        }
    }
}

/// `offsets.retention.minutes` here: a committer's offset expires once it committed nothing
/// for this long (the broker's default is 7 days), which faults make it do now and then.
const RETENTION_MS: i64 = 5000;

/// What the shard's tick loop does every `offsets.retention.check.interval.ms` (here 1 s):
/// a coordinator writes the tombstones of the offsets that expired
/// (`GroupCoordinator::expiries`, `group::write_expiries`), each told to the checker first,
/// as a deletion the committer did not send. It stops with the clients.
async fn expirer(node: Rc<Node>, checker: Rc<Checker>) {
    loop {
        SimRuntime::sleep(Duration::from_secs(1)).await;
        if checker.retention_stopped() {
            return;
        }
        let now = now_ms();
        let epoch = node.replica.leader_epoch();
        let due = node.groups.borrow().expiries(0, epoch, RETENTION_MS, now);
        for e in &due {
            let committer = e.group[1..].parse().expect("a committer's group");
            checker.offset_expiring(committer);
        }
        group::write_expiries(&node.groups, 0, &node, &due, now).await;
    }
}

/// An OffsetCommit of committer `committer`'s position `offset`, as a consumer that uses
/// `assign` sends it (generation -1, no member): what the OffsetCommit handler does
/// (`group::on_group`, then `group::write_offsets`).
async fn commit_offset(node: Rc<Node>, committer: u32, offset: i64) -> Result<(), BrokerError> {
    group::check_coordinator(&node.groups, 0, &*node).await?;
    let now = now_ms();
    let group_id = format!("g{committer}");
    node.groups
        .borrow_mut()
        .groups
        .entry(group_id.clone())
        .or_insert_with(|| group::Group::offsets_only(0, &node.group_config, now))
        .validate_offset_commit("", None, -1, 8, now)?;
    let value = group::codec::OffsetValue {
        offset,
        leader_epoch: -1,
        metadata: String::new(),
        commit_timestamp_ms: now,
    };
    let change = ((TOPIC.to_string(), committer as i32), Some(value));
    group::write_offsets(&node.groups, 0, &node, &group_id, vec![change], now).await
}

/// An OffsetFetch of committer `committer`'s position (-1: none): what the OffsetFetch
/// handler does (`group::on_group`, then the group's offsets).
async fn fetch_offset(node: Rc<Node>, committer: u32) -> Result<i64, BrokerError> {
    group::check_coordinator(&node.groups, 0, &*node).await?;
    Ok(committed_offset(&node, committer))
}

/// Committer `committer`'s position as the node's coordinator holds it (-1: none).
fn committed_offset(node: &Node, committer: u32) -> i64 {
    let groups = node.groups.borrow();
    let key = (TOPIC.to_string(), committer as i32);
    let group = groups.groups.get(&format!("g{committer}"));
    group
        .and_then(|g| g.offsets.get(&key))
        .map_or(-1, |v| v.offset)
}

/// A deletion of committer `committer`'s offset, as an admin sends it:
/// DeleteGroups of its group when `whole_group`, else OffsetDelete of its partition, each
/// through its handler's path (`group::on_group`'s checks, then `group::delete_group` or
/// `group::delete_offsets`).
async fn delete_offset(
    node: Rc<Node>,
    committer: u32,
    whole_group: bool,
) -> Result<(), BrokerError> {
    group::check_coordinator(&node.groups, 0, &*node).await?;
    let (group_id, now) = (format!("g{committer}"), now_ms());
    if whole_group {
        return group::delete_group(&node.groups, 0, &node, &group_id, now).await;
    }
    let wanted = vec![(TOPIC.to_string(), vec![committer as i32])];
    group::delete_offsets(&node.groups, 0, &node, &group_id, wanted, now)
        .await
        .map(drop)
}

/// A consumer that commits its position (`--groups`): committer `id` commits offsets 1, 2,
/// 3, ... of its partition in its own group, through the node it believes coordinates,
/// moving on once a commit is acknowledged, as a consumer's `commitSync` does. It sends
/// a commit again only once the last request was answered or was lost with its node: a
/// commit still on its way could land after the next one and move the offset back, as in
/// Kafka. After one commit in eight it deletes its offset (DeleteGroups or OffsetDelete,
/// `delete_offset`) the same way before it commits the next: GROUP_ID_NOT_FOUND says the
/// group is gone, a deletion done.
async fn committer(id: u32, ctx: ClientCtx, nodes: Nodes) {
    let ClientCtx {
        net,
        checker,
        stop,
        last_ack,
    } = ctx;
    let mut target = NODES[id as usize % NODES.len()];
    let mut offset = 1i64;
    // A deletion to send before the next commit: of the whole group, or of the offset.
    let mut deleting: Option<bool> = None;
    while !stop.get() {
        let node = nodes.borrow().get(&target).cloned();
        match deleting {
            Some(_) => checker.offset_deletion_sent(id),
            None => checker.offset_sent(id, offset),
        }
        // Waits for the answer itself (see above), but not for a node that is not running.
        let answer = match node.clone() {
            Some(running) => {
                let send = move |n| match deleting {
                    Some(whole_group) => delete_offset(n, id, whole_group).boxed_local(),
                    None => commit_offset(n, id, offset).boxed_local(),
                };
                request(&net, target, Some(running), send).await
            }
            None => Err(Canceled),
        };
        let pause = match answer {
            Ok(Err(BrokerError::GroupIdNotFound(_))) if deleting.is_some() => {
                checker.offset_deleted(id, offset - 1);
                deleting = None;
                random_u64() % 20
            }
            Ok(Ok(())) if deleting.is_some() => {
                checker.offset_deleted(id, offset - 1);
                last_ack.set(SimInstant::now());
                deleting = None;
                random_u64() % 20
            }
            Ok(Ok(())) => {
                checker.offset_committed(id, offset);
                last_ack.set(SimInstant::now());
                offset += 1;
                if random_u64().is_multiple_of(8) {
                    deleting = Some(random_u64().is_multiple_of(2));
                }
                random_u64() % 20
            }
            Ok(Err(BrokerError::NotCoordinator)) => {
                target = redirect(node, target);
                10
            }
            Ok(Err(BrokerError::CoordinatorLoadInProgress)) => 50,
            Ok(Err(e)) => {
                let what = match deleting {
                    Some(true) => "DeleteGroups".to_string(),
                    Some(false) => "OffsetDelete".to_string(),
                    None => format!("commit of {offset}"),
                };
                checker.violation(format!(
                    "refused: g{id}'s {what} refused by node {target}: {e}"
                ));
                return;
            }
            Err(_) => {
                target = random_node();
                50
            }
        };
        SimRuntime::sleep(Duration::from_millis(pause)).await;
    }
}

/// A consumer that asks for a committer's position (`--groups`): an OffsetFetch of a random
/// committer's group, through the node it believes coordinates, each answer checked
/// (`Offsets::fetched`) against what clients had been shown when it asked.
async fn offset_fetcher(ctx: ClientCtx, nodes: Nodes) {
    let ClientCtx {
        net, checker, stop, ..
    } = ctx;
    let mut target = random_node();
    while !stop.get() {
        let committer = (random_u64() % u64::from(CLIENTS)) as u32;
        let shown = checker.offset_shown(committer);
        let node = nodes.borrow().get(&target).cloned();
        let rx = request(&net, target, node.clone(), move |n| {
            fetch_offset(n, committer)
        });
        let pause = match SimRuntime::timeout(Duration::from_secs(3), rx).await {
            Ok(Ok(Ok(offset))) => {
                checker.offset_fetched(target, committer, shown, offset);
                5
            }
            Ok(Ok(Err(BrokerError::NotCoordinator))) => {
                target = redirect(node, target);
                10
            }
            Ok(Ok(Err(BrokerError::CoordinatorLoadInProgress))) => 50,
            Ok(Ok(Err(e))) => {
                checker.violation(format!(
                    "refused: an OffsetFetch of g{committer} refused by node {target}: {e}"
                ));
                return;
            }
            Ok(Err(_)) | Err(_) => {
                target = random_node();
                50
            }
        };
        SimRuntime::sleep(Duration::from_millis(pause)).await;
    }
}
