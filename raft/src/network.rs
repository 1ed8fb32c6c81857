//! Raft traffic between nodes: the TCP connection a shard opens to a peer shard carries its
//! RPCs for every group the two shards host, as [`wire`] frames (the peer's requests come
//! back on the one it opened).
//!
//! Each shard of a node runs its own transport and listens at the node's Raft address with
//! the port plus its shard index (shard 0 at the address `controller.quorum.voters` names). A
//! group lives on shard [`GroupId::shard`] of every node, so a transport sends a group's RPCs
//! to that shard of the peer, knowing the peer's shard count (`set_shards`; 1 until told).
//! With equal shard counts, shard s of one node talks only to shard s of the others.
//!
//! Outgoing: each peer shard has one write buffer. An RPC is encoded into it and the connection's
//! writer sends everything buffered in one write, so the heartbeats and appends that many
//! groups queue while a write is in flight leave together (coalesced per write; each group's
//! heartbeat is still its own frame). Replies are matched
//! to callers by correlation id. The buffer is bounded ([`PEER_BUFFER_BYTES_MAX`]); past it,
//! RPCs fail as `Unreachable` and openraft backs off.
//!
//! Incoming: the listener hands each frame to the group it names, through the shard's group
//! registry, in its own task (at most [`SERVER_IN_FLIGHT_MAX`] per connection), and writes
//! replies back through a buffer of the same kind.
//!
//! A connection that fails fails every RPC waiting on it; the next RPC reconnects. A
//! keepalive ping per peer shard tells which peers answer (`is_alive`, the ISR's view of idle
//! partitions) and counts reconnections (`liveness`); `heard` tells when each group last
//! took an append from its leader, or was named in its leader node's coalesced heartbeat
//! (`beat`: one message per peer per interval for all the quiet groups a node leads there),
//! which is what quiescent followers watch. `log_start` asks a peer where its replica of a
//! group starts its log (DeleteRecords waits for every live replica, as in Kafka). A quiet group has no Raft lease (no heartbeats
//! renew it), so `heard` also stands in for it: a replica that heard from the rest of its group
//! within [`PRE_VOTE_GUARD`] refuses Pre-Votes and votes, and a node that merely missed some beats
//! cannot take a live leader's partition away.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ferrolog_io::Log;
use futures::future::LocalBoxFuture;
use futures::{AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};
use openraft::async_runtime::watch::WatchReceiver;
use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::{AsyncRuntime, BasicNode, Raft, Snapshot};
use tokio::sync::{oneshot, Notify, Semaphore};

use crate::state_machine::{PartitionStateMachine, SnapshotData};
use crate::store::Vote;
use crate::wire::{self, Frame, GroupId, Handover, Message, Meta};
use crate::{GlommioRuntime, PartitionRaft};

/// A partition group's Raft handle.
pub type GroupRaft = Raft<PartitionRaft, PartitionStateMachine>;

/// Most bytes of RPCs buffered for one peer before new RPCs fail.
pub const PEER_BUFFER_BYTES_MAX: usize = 64 << 20;
/// Most requests from one connection served at once.
pub const SERVER_IN_FLIGHT_MAX: usize = 1024;
/// Most bytes of requests from one connection held at once, in KiB (permits).
const SERVER_IN_FLIGHT_KIB_MAX: usize = 256 << 10;
/// How long a connect may take before the peer counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
pub use crate::vote_guard::PRE_VOTE_GUARD;
/// How long a leader handing its group over (`Transport::elect`) waits, taking no writes,
/// for the new leader to hold its whole log.
const CATCH_UP_MAX: Duration = Duration::from_secs(1);
const CATCH_UP_POLL: Duration = Duration::from_millis(5);
/// A replica to take over whose node answered nothing for this long (it is pinged every
/// 250 ms) is taken for gone.
const TARGET_SILENT: Duration = Duration::from_millis(750);

/// A message the wire does not carry in that direction, or a reply of the wrong kind.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Protocol(String);

/// A Raft group id registered twice on one transport.
#[derive(Debug, thiserror::Error)]
#[error("Raft group {0:?} is already registered on this transport")]
pub struct GroupTaken(pub GroupId);

/// The connection tasks of a transport, so `shutdown` can close every socket at once.
#[derive(Default)]
struct TaskSet {
    tasks: RefCell<HashMap<u64, glommio::task::JoinHandle<()>>>,
    next: Cell<u64>,
    closed: Cell<bool>,
}

impl TaskSet {
    fn spawn(self: &Rc<Self>, future: impl std::future::Future<Output = ()> + 'static) {
        if self.closed.get() {
            return;
        }
        let id = self.next.get();
        self.next.set(id + 1);
        let me = self.clone();
        let handle = glommio::spawn_local(async move {
            future.await;
            me.tasks.borrow_mut().remove(&id);
        })
        .detach();
        self.tasks.borrow_mut().insert(id, handle);
    }

    fn cancel_all(&self) {
        self.closed.set(true);
        for (_, task) in self.tasks.borrow_mut().drain() {
            task.cancel();
        }
    }
}

/// Serves `Forward` requests addressed to this node.
pub type ForwardHandler = Rc<dyn Fn(Bytes) -> LocalBoxFuture<'static, Result<Bytes, String>>>;

/// A peer shard: its node id and shard index.
type PeerKey = (u64, usize);

/// A quiet group's term, and per follower node when it was sent the last beat of that term
/// it answered as a follower.
type Followed = (u64, HashMap<u64, std::time::Instant>);

/// This shard's Raft transport: its peers (client side) and its groups (server side).
pub struct Transport {
    peers: RefCell<HashMap<PeerKey, Rc<Peer>>>,
    /// How many shards each peer node runs (1 until `set_shards` says otherwise).
    shards: RefCell<HashMap<u64, usize>>,
    /// How often every peer is pinged, once `keepalive` was called.
    keepalive: Cell<Option<Duration>>,
    /// Peer nodes' Raft addresses, where known (`set_address`).
    addresses: RefCell<HashMap<u64, String>>,
    groups: RefCell<HashMap<GroupId, GroupRaft>>,
    /// The log of each registered group, for `LogStart` requests.
    logs: RefCell<HashMap<GroupId, Rc<Log>>>,
    /// When each group last took an append (entries or a heartbeat) from its leader, or was
    /// in its leader node's coalesced heartbeat.
    heard: RefCell<HashMap<GroupId, std::time::Instant>>,
    /// Per quiet group this node leads: the term, and per follower node when the last beat
    /// of that term it answered as a follower of this node was sent.
    followed: RefCell<HashMap<GroupId, Followed>>,
    /// When each group with a log was registered after a restart (`hold_votes`).
    restarted: RefCell<HashMap<GroupId, std::time::Instant>>,
    /// Groups whose leader here sends its followers nothing (`mute`).
    muted: RefCell<std::collections::HashSet<GroupId>>,
    /// Groups this node's leader is handing to another replica (`elect`), with the term.
    handing_over: RefCell<HashMap<GroupId, u64>>,
    forward: RefCell<Option<ForwardHandler>>,
    tasks: Rc<TaskSet>,
}

impl Transport {
    pub fn new() -> Rc<Transport> {
        Rc::new(Transport {
            peers: RefCell::new(HashMap::new()),
            shards: RefCell::new(HashMap::new()),
            keepalive: Cell::new(None),
            addresses: RefCell::new(HashMap::new()),
            groups: RefCell::new(HashMap::new()),
            logs: RefCell::new(HashMap::new()),
            heard: RefCell::new(HashMap::new()),
            followed: RefCell::new(HashMap::new()),
            restarted: RefCell::new(HashMap::new()),
            muted: RefCell::new(std::collections::HashSet::new()),
            handing_over: RefCell::new(HashMap::new()),
            forward: RefCell::new(None),
            tasks: Rc::new(TaskSet::default()),
        })
    }

    /// Installs what serves `Forward` requests from peers.
    pub fn set_forward_handler(&self, handler: ForwardHandler) {
        *self.forward.borrow_mut() = Some(handler);
    }

    /// Sends `payload` to node `node_id` at `addr` for its forward handler.
    pub async fn forward(
        self: &Rc<Self>,
        node_id: u64,
        addr: &str,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<Bytes, String> {
        let peer = self.peer(node_id, addr, GroupId(0));
        match peer.call(GroupId(0), Message::Forward(payload), ttl).await {
            Ok(Message::ForwardReply(reply)) => reply,
            Ok(Message::Failed(why)) => Err(why),
            Ok(other) => Err(format!("unexpected reply {other:?}")),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Closes the listener and every connection, as a process exit would; RPCs in flight
    /// fail and later ones find no connection.
    pub fn shutdown(&self) {
        self.tasks.cancel_all();
        for (_, peer) in self.peers.borrow_mut().drain() {
            peer.retire();
        }
    }

    /// Serves incoming RPCs for `group`, whose entries `log` holds, until it is
    /// unregistered. A group id that is already registered is refused: two groups under one
    /// id would take each other's AppendEntries and votes.
    pub fn register(
        &self,
        group: GroupId,
        raft: GroupRaft,
        log: Rc<Log>,
    ) -> Result<(), GroupTaken> {
        let mut groups = self.groups.borrow_mut();
        if groups.contains_key(&group) {
            return Err(GroupTaken(group));
        }
        groups.insert(group, raft);
        self.logs.borrow_mut().insert(group, log);
        Ok(())
    }

    /// Stops routing RPCs to `group` (it is being shut down or moved).
    pub fn unregister(&self, group: GroupId) -> Option<GroupRaft> {
        self.heard.borrow_mut().remove(&group);
        self.followed.borrow_mut().remove(&group);
        self.restarted.borrow_mut().remove(&group);
        self.muted.borrow_mut().remove(&group);
        self.handing_over.borrow_mut().remove(&group);
        self.logs.borrow_mut().remove(&group);
        self.groups.borrow_mut().remove(&group)
    }

    /// The network factory openraft uses for `group`.
    pub fn factory(self: &Rc<Self>, group: GroupId) -> NetworkFactory {
        NetworkFactory {
            transport: self.clone(),
            group,
        }
    }

    /// Tells the transport that node `node_id` runs `shards` shards: its groups' traffic
    /// goes to their shard there from now on ([`GroupId::shard`]).
    pub fn set_shards(&self, node_id: u64, shards: usize) {
        let shards = shards.max(1);
        if self
            .shards
            .borrow_mut()
            .insert(node_id, shards)
            .unwrap_or(1)
            == shards
        {
            return;
        }
        let mut peers = self.peers.borrow_mut();
        peers.retain(|(node, shard), peer| {
            let keep = *node != node_id || *shard < shards;
            if !keep {
                peer.retire();
            }
            keep
        });
    }

    /// The shard of node `node_id` that hosts `group`.
    pub fn peer_shard(&self, node_id: u64, group: GroupId) -> usize {
        let shards = self.shards.borrow().get(&node_id).copied().unwrap_or(1);
        group.shard(shards)
    }

    /// Where node `node_id`'s shard 0 listens, overriding the address a group's membership
    /// recorded when it was created (which an edited voter list leaves behind): every
    /// caller then agrees on one peer per node and shard.
    pub fn set_address(&self, node_id: u64, addr: String) {
        self.addresses.borrow_mut().insert(node_id, addr);
    }

    /// The peer shard hosting `group` on node `node_id`, whose shard 0 listens at `addr`
    /// unless `set_address` said otherwise.
    fn peer(self: &Rc<Self>, node_id: u64, addr: &str, group: GroupId) -> Rc<Peer> {
        let known = self.addresses.borrow().get(&node_id).cloned();
        let addr = known.as_deref().unwrap_or(addr);
        let key = (node_id, self.peer_shard(node_id, group));
        if let Some(peer) = self.peers.borrow().get(&key) {
            if peer.node_addr == addr {
                return peer.clone();
            }
        }
        let peer = Peer::new(addr, key.1, self.tasks.clone());
        if let Some(old) = self.peers.borrow_mut().insert(key, peer.clone()) {
            // The node moved: the old connection closes.
            old.retire();
        }
        if let Some(interval) = self.keepalive.get() {
            self.ping(&peer, interval);
        }
        peer
    }

    /// Pings every peer shard each `interval` (those of `nodes` at once, the others from
    /// their first RPC), so `is_alive` knows which answer: one small frame per peer shard
    /// per interval, however many groups the two share (an idle partition's leader uses it
    /// to see a dead follower leave the ISR).
    pub fn keepalive(self: &Rc<Self>, nodes: Vec<(u64, String)>, interval: Duration) {
        self.keepalive.set(Some(interval));
        let known: Vec<Rc<Peer>> = self.peers.borrow().values().cloned().collect();
        for peer in &known {
            self.ping(peer, interval);
        }
        for (node_id, addr) in nodes {
            self.peer(node_id, &addr, GroupId(0));
        }
    }

    fn ping(&self, peer: &Rc<Peer>, interval: Duration) {
        let peer = peer.clone();
        self.tasks.spawn(async move {
            while !peer.retired.get() {
                let _ = peer.call(GroupId(0), Message::Ping, interval * 4).await;
                glommio::timer::sleep(interval).await;
            }
        });
    }

    /// Sends shard `shard` of node `node_id` (a peer already known) the coalesced heartbeat
    /// of the quiet groups this node, `leader`, leads there; returns the groups it does not
    /// follow this node in.
    pub async fn beat(
        &self,
        (node_id, shard): (u64, usize),
        leader: u64,
        groups: Vec<(GroupId, u64)>,
        ttl: Duration,
    ) -> Result<Vec<GroupId>, String> {
        let peer = self.peers.borrow().get(&(node_id, shard)).cloned();
        let Some(peer) = peer else {
            return Err(format!(
                "shard {shard} of node {node_id} is not a known peer"
            ));
        };
        let ids = groups.clone();
        let sent = std::time::Instant::now();
        match peer
            .call(GroupId(0), Message::Beat { leader, groups }, ttl)
            .await
        {
            Ok(Message::BeatReply(stale)) => {
                let mut followed = self.followed.borrow_mut();
                for (group, term) in ids.into_iter().filter(|(g, _)| !stale.contains(g)) {
                    let (at_term, by) = followed.entry(group).or_default();
                    if *at_term != term {
                        *at_term = term;
                        by.clear();
                    }
                    by.insert(node_id, sent);
                }
                Ok(stale)
            }
            Ok(other) => Err(format!("unexpected reply {other:?}")),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Has this node's replica of `group`, if it leads, hand leadership to node `to`. First
    /// it stops taking writes (`handing_over`) and waits up to `CATCH_UP_MAX` for `to` to
    /// hold its whole log, its node answering; only then does openraft's transfer start,
    /// which cannot be undone for the term (openraft refuses writes and sends no heartbeats
    /// from then on, and `to` stands for election with a vote the others grant although
    /// the lease runs). A `to`
    /// still behind by then is `Behind`, and this leader takes writes again: handing over to
    /// a replica that cannot campaign at once would leave the group unwritable until the
    /// followers' election timeout.
    pub async fn elect(&self, group: GroupId, to: u64) -> Handover {
        let raft = self.groups.borrow().get(&group).cloned();
        let Some(raft) = raft else {
            return Handover::NotLeader;
        };
        let leading = |raft: &GroupRaft| {
            let m = raft.metrics();
            let m = m.borrow_watched();
            (m.state == openraft::ServerState::Leader).then_some(m.current_term)
        };
        let Some(term) = leading(&raft) else {
            return Handover::NotLeader;
        };
        if self.handing_over(group, term) {
            return Handover::Started;
        }
        self.handing_over.borrow_mut().insert(group, term);
        let deadline = std::time::Instant::now() + CATCH_UP_MAX;
        loop {
            if leading(&raft) != Some(term) {
                return Handover::NotLeader;
            }
            let (matched, last) = {
                let m = raft.metrics();
                let m = m.borrow_watched();
                let matched = m.replication.as_ref().and_then(|r| r.get(&to)).cloned();
                (matched.flatten().map(|l| l.index), m.last_log_index)
            };
            // A replica that holds the log but whose node went silent (killed, stopped)
            // would not campaign either.
            let answers = self.liveness(to, group, TARGET_SILENT).0;
            if matched == last && answers {
                break;
            }
            if std::time::Instant::now() >= deadline {
                self.handing_over.borrow_mut().remove(&group);
                tracing::info!(
                    group = group.0,
                    term,
                    to,
                    ?matched,
                    ?last,
                    answers,
                    "handover abandoned: the new leader did not catch up, or its node does not answer"
                );
                return Handover::Behind;
            }
            glommio::timer::sleep(CATCH_UP_POLL).await;
        }
        tracing::info!(group = group.0, term, to, "handing leadership over");
        match raft.trigger().transfer_leader(to).await {
            Ok(()) => Handover::Started,
            Err(_) => Handover::NotLeader, // the core stopped
        }
    }

    /// Whether this node's leader of `group` in `term` is handing its leadership over
    /// (`elect`): it takes no writes and serves no reads for the rest of the term, unless
    /// the handover is abandoned first; once openraft's transfer started, should `to` not
    /// take over, the followers hear nothing more from it and elect another.
    pub fn handing_over(&self, group: GroupId, term: u64) -> bool {
        self.handing_over.borrow().get(&group) == Some(&term)
    }

    /// Asks node `node_id` at `addr` to hand its leadership of `group` to node `to`
    /// (`elect` on that node).
    pub async fn elect_on(
        self: &Rc<Self>,
        node_id: u64,
        addr: &str,
        group: GroupId,
        to: u64,
        ttl: Duration,
    ) -> Result<Handover, String> {
        let peer = self.peer(node_id, addr, group);
        match peer.call(group, Message::Elect { to }, ttl).await {
            Ok(Message::ElectReply(handover)) => Ok(handover),
            Ok(Message::Failed(why)) => Err(why),
            Ok(other) => Err(format!("unexpected reply {other:?}")),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Where the replica of `group` on node `node_id` (a peer already known) starts its log.
    pub async fn log_start(
        &self,
        node_id: u64,
        group: GroupId,
        ttl: Duration,
    ) -> Result<i64, String> {
        let key = (node_id, self.peer_shard(node_id, group));
        let peer = self.peers.borrow().get(&key).cloned();
        let Some(peer) = peer else {
            return Err(format!(
                "node {node_id} is not a known peer of group {}",
                group.0
            ));
        };
        match peer.call(group, Message::LogStart, ttl).await {
            Ok(Message::LogStartReply(offset)) => Ok(offset),
            Ok(Message::Failed(why)) => Err(why),
            Ok(other) => Err(format!("unexpected reply {other:?}")),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Whether the shard of `node_id` hosting `group` answered anything within `within` (a
    /// peer gets the benefit of the doubt for `within` after it is first contacted; a
    /// connection alone is no answer).
    pub fn is_alive(&self, node_id: u64, group: GroupId, within: Duration) -> bool {
        self.liveness(node_id, group, within).0
    }

    /// For a quiet `group` this node leads in `term`: the latest time by which `followers`
    /// of its followers had each been sent a beat of that term they answered as its
    /// followers (a quorum's worth of them is the leader's lease for reads while the group
    /// sends no heartbeats).
    pub fn followed_by(
        &self,
        group: GroupId,
        term: u64,
        followers: usize,
    ) -> Option<std::time::Instant> {
        if followers == 0 {
            return Some(std::time::Instant::now());
        }
        let followed = self.followed.borrow();
        let (at_term, by) = followed.get(&group)?;
        if *at_term != term {
            return None;
        }
        let mut sent: Vec<std::time::Instant> = by.values().copied().collect();
        sent.sort_unstable_by(|a, b| b.cmp(a));
        sent.get(followers - 1).copied()
    }

    /// Stops (or resumes) sending appends and snapshots of `group` from this node: a leader
    /// that no majority acknowledged for long goes silent so that its followers elect
    /// another (the broker's `Replica::check_quorum`). Votes still go out and are answered.
    pub fn mute(&self, group: GroupId, muted: bool) {
        let mut set = self.muted.borrow_mut();
        if muted {
            set.insert(group);
        } else {
            set.remove(&group);
        }
    }

    /// Whether `group` is muted here (`mute`).
    pub fn is_muted(&self, group: GroupId) -> bool {
        self.muted.borrow().contains(&group)
    }

    /// Refuses votes in `group` for `PRE_VOTE_GUARD` from now: its replica restarted with a
    /// log, and may have acknowledged a leader just before, whose lease for reads still runs
    /// (openraft's own vote lease starts empty after a restart).
    pub fn hold_votes(&self, group: GroupId) {
        self.restarted
            .borrow_mut()
            .insert(group, std::time::Instant::now());
    }

    /// When `group` last heard from its leader here (an append, or its node's `beat`).
    pub fn heard(&self, group: GroupId) -> Option<std::time::Instant> {
        self.heard.borrow().get(&group).copied()
    }

    /// `is_alive`, and how many connections to that peer shard were made so far (a change
    /// means the link broke or the node restarted).
    pub fn liveness(&self, node_id: u64, group: GroupId, within: Duration) -> (bool, u64) {
        let key = (node_id, self.peer_shard(node_id, group));
        self.peers.borrow().get(&key).map_or((true, 0), |p| {
            (p.last_reply.get().elapsed() < within, p.connects.get())
        })
    }

    /// Accepts peers' connections and serves them until the listener fails or `shutdown`.
    pub fn serve(self: &Rc<Self>, listener: TcpListener) {
        let me = self.clone();
        self.tasks.spawn(async move {
            loop {
                match listener.accept().await {
                    Ok(stream) => {
                        let conn = me.clone();
                        me.tasks.spawn(async move {
                            if let Err(e) = conn.serve_connection(stream).await {
                                tracing::debug!(error = %e, "raft connection closed");
                            }
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "raft listener failed");
                        return;
                    }
                }
            }
        });
    }

    async fn serve_connection(self: Rc<Self>, stream: TcpStream) -> std::io::Result<()> {
        stream.set_nodelay(true)?;
        let (mut reader, writer) = stream.split();
        let out = Rc::new(Outbox::default());
        let writer_task = glommio::spawn_local(write_loop(writer, out.clone()));
        let in_flight = std::sync::Arc::new(Semaphore::new(SERVER_IN_FLIGHT_MAX));
        let in_flight_kib = std::sync::Arc::new(Semaphore::new(SERVER_IN_FLIGHT_KIB_MAX));
        let result = async {
            loop {
                let Some((frame, bytes)) = read_frame(&mut reader).await? else {
                    return Ok(());
                };
                let permit = in_flight
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("never closed");
                // Waiting here stops reading from the peer: backpressure by bytes as well.
                let kib = (bytes / 1024).clamp(1, SERVER_IN_FLIGHT_KIB_MAX) as u32;
                let memory = in_flight_kib
                    .clone()
                    .acquire_many_owned(kib)
                    .await
                    .expect("never closed");
                let me = self.clone();
                let out = out.clone();
                glommio::spawn_local(async move {
                    let reply = me.handle(frame.group, frame.message).await;
                    out.push(&Frame {
                        correlation: frame.correlation,
                        group: frame.group,
                        message: reply,
                    });
                    drop((permit, memory));
                })
                .detach();
            }
        }
        .await;
        out.close();
        let _ = writer_task.await;
        result
    }

    /// Takes a coalesced heartbeat from node `leader`: each group this node follows it in,
    /// at the term given, counts as heard from its leader; the others are returned.
    fn take_beat(&self, leader: u64, groups: &[(GroupId, u64)]) -> Vec<GroupId> {
        let now = std::time::Instant::now();
        let rafts = self.groups.borrow();
        let mut heard = self.heard.borrow_mut();
        groups
            .iter()
            .filter_map(|&(group, term)| {
                let follows = rafts.get(&group).is_some_and(|raft| {
                    let m = raft.metrics();
                    let m = m.borrow_watched();
                    m.state == openraft::ServerState::Follower
                        && m.current_leader == Some(leader)
                        && m.current_term == term
                });
                if follows {
                    heard.insert(group, now);
                    None
                } else {
                    Some(group)
                }
            })
            .collect()
    }

    /// Whether to refuse a Pre-Vote or a vote (other than a leadership transfer) in `group`
    /// ([`crate::vote_guard`]): as a follower of a live leader it heard that leader lately,
    /// as a leader a follower answered its beat lately, or it restarted lately
    /// (`hold_votes`).
    fn refuses_vote(&self, group: GroupId, raft: &GroupRaft) -> bool {
        let m = raft.metrics();
        let m = m.borrow_watched();
        let followers_heard = match m.state {
            openraft::ServerState::Leader => self.followed_by(group, m.current_term, 1),
            _ => None,
        };
        let restarted = self.restarted.borrow().get(&group).copied();
        crate::vote_guard::refuses_vote(
            m.state,
            m.current_leader.is_some(),
            self.heard(group),
            followers_heard,
            restarted,
            std::time::Instant::now(),
        )
    }

    async fn handle(&self, group: GroupId, message: Message) -> Message {
        if let Message::Ping = message {
            return Message::Pong;
        }
        if let Message::Beat { leader, groups } = message {
            return Message::BeatReply(self.take_beat(leader, &groups));
        }
        if let Message::LogStart = message {
            return match self.logs.borrow().get(&group) {
                Some(log) => Message::LogStartReply(log.start_offset()),
                None => Message::Failed(format!("no group {} on this node", group.0)),
            };
        }
        if let Message::Elect { to } = message {
            return Message::ElectReply(self.elect(group, to).await);
        }
        if let Message::Forward(payload) = message {
            let handler = self.forward.borrow().clone();
            return match handler {
                Some(h) => Message::ForwardReply(h(payload).await),
                None => Message::Failed("this node takes no forwarded requests".into()),
            };
        }
        let raft = self.groups.borrow().get(&group).cloned();
        let Some(raft) = raft else {
            return Message::Failed(format!("no group {} on this node", group.0));
        };
        // A core stopped by a storage error (it logged why) takes nothing until the node
        // restarts: answer its peers here rather than have openraft log every message.
        if let Err(fatal) = &raft.metrics().borrow_watched().running_state {
            return Message::Failed(format!("group {} stopped on this node: {fatal}", group.0));
        }
        match message {
            Message::Append(rpc) => match raft.append_entries(rpc).await {
                Ok(reply) => {
                    // Not from a deposed leader whose term this replica has moved past.
                    if !matches!(reply, AppendEntriesResponse::HigherVote(_)) {
                        self.heard
                            .borrow_mut()
                            .insert(group, std::time::Instant::now());
                    }
                    Message::AppendReply(reply)
                }
                Err(e) => Message::Failed(e.to_string()),
            },
            Message::Vote(rpc) if !rpc.leadership_transfer && self.refuses_vote(group, &raft) => {
                // Answered as a Pre-Vote would be (this replica's vote and log, unchanged),
                // and not granted.
                match raft.pre_vote(rpc).await {
                    Ok(mut reply) => {
                        reply.vote_granted = false;
                        Message::VoteReply(reply)
                    }
                    Err(e) => Message::Failed(e.to_string()),
                }
            }
            Message::TransferLeader(rpc) => match raft.handle_transfer_leader(rpc).await {
                Ok(reply) => Message::TransferLeaderReply(reply),
                Err(e) => Message::Failed(e.to_string()),
            },
            Message::Vote(rpc) => match raft.vote(rpc).await {
                Ok(reply) => Message::VoteReply(reply),
                Err(e) => Message::Failed(e.to_string()),
            },
            Message::PreVote(rpc) => {
                let refuse = self.refuses_vote(group, &raft);
                match raft.pre_vote(rpc).await {
                    // openraft's answer carries this replica's log, which a lagging
                    // candidate backs off on; only the grant is overruled.
                    Ok(mut reply) => {
                        reply.vote_granted &= !refuse;
                        Message::VoteReply(reply)
                    }
                    Err(e) => Message::Failed(e.to_string()),
                }
            }
            Message::Snapshot { vote, meta, data } => {
                let snapshot = Snapshot {
                    meta,
                    snapshot: data,
                };
                match raft.install_full_snapshot(vote, snapshot).await {
                    Ok(reply) => Message::SnapshotReply(reply),
                    Err(e) => Message::Failed(e.to_string()),
                }
            }
            other => Message::Failed(format!("not a request: {other:?}")),
        }
    }
}

/// Frames waiting to be written to one connection.
#[derive(Default)]
struct Outbox {
    buf: RefCell<BytesMut>,
    ready: Notify,
    closing: Notify,
    closed: Cell<bool>,
}

impl Outbox {
    /// Queues `frame`; false when the connection is closed or its buffer full.
    fn push(&self, frame: &Frame) -> bool {
        if self.closed.get() || self.buf.borrow().len() >= PEER_BUFFER_BYTES_MAX {
            return false;
        }
        if let Err(e) = wire::encode(frame, &mut self.buf.borrow_mut()) {
            tracing::warn!(error = %e, group = frame.group.0, "raft frame not sent");
            return false;
        }
        self.ready.notify_one();
        true
    }

    fn close(&self) {
        self.closed.set(true);
        self.ready.notify_one();
        self.closing.notify_waiters();
    }

    /// Resolves once the outbox is closed.
    async fn closed_signal(&self) {
        while !self.closed.get() {
            self.closing.notified().await;
        }
    }
}

/// Writes whatever the outbox holds, all of it in one write, until it is closed.
async fn write_loop(
    mut writer: futures::io::WriteHalf<TcpStream>,
    out: Rc<Outbox>,
) -> std::io::Result<()> {
    loop {
        let chunk = std::mem::take(&mut *out.buf.borrow_mut());
        if chunk.is_empty() {
            if out.closed.get() {
                return Ok(());
            }
            out.ready.notified().await;
            continue;
        }
        if let Err(e) = writer.write_all(&chunk).await {
            out.close();
            return Err(e);
        }
    }
}

/// The next frame and its size in bytes, or `None` at a clean end of stream.
async fn read_frame(
    reader: &mut futures::io::ReadHalf<TcpStream>,
) -> std::io::Result<Option<(Frame, usize)>> {
    let mut prefix = [0u8; 4];
    match reader.read_exact(&mut prefix).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let invalid = |e: wire::WireError| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
    let total = wire::frame_len(&prefix)
        .map_err(invalid)?
        .expect("4-byte prefix");
    let mut body = vec![0u8; total - 4];
    reader.read_exact(&mut body).await?;
    wire::decode(Bytes::from(body))
        .map(|f| Some((f, total)))
        .map_err(invalid)
}

/// One peer shard: its address, the connection to it and the RPCs waiting for replies.
struct Peer {
    /// The node's Raft address (its shard 0), as the group membership names it.
    node_addr: String,
    /// This shard's address: the node's, with the shard index added to the port.
    addr: String,
    /// Replaced or shut down: no more connections or pings.
    retired: Cell<bool>,
    tasks: Rc<TaskSet>,
    out: RefCell<Rc<Outbox>>,
    /// When the current connection last delivered a reply.
    last_reply: Cell<std::time::Instant>,
    /// Connections made so far: a change means the link broke or the peer restarted.
    connects: Cell<u64>,
    /// RPCs waiting for replies, by correlation id, with the connection (its number in
    /// `connects`) that carries them.
    waiting: RefCell<HashMap<u64, (u64, oneshot::Sender<Message>)>>,
    next_correlation: Cell<u64>,
    /// Held while a connection is being made. An async lock, so a caller that gives up
    /// (openraft drops an RPC past its deadline) lets the next one try.
    connecting: tokio::sync::Mutex<()>,
}

impl Peer {
    fn new(node_addr: &str, shard: usize, tasks: Rc<TaskSet>) -> Rc<Peer> {
        let out = Outbox::default();
        out.closed.set(true);
        Rc::new(Peer {
            node_addr: node_addr.to_string(),
            addr: shard_addr(node_addr, shard),
            retired: Cell::new(false),
            tasks,
            out: RefCell::new(Rc::new(out)),
            last_reply: Cell::new(std::time::Instant::now()),
            connects: Cell::new(0),
            waiting: RefCell::new(HashMap::new()),
            next_correlation: Cell::new(1),
            connecting: tokio::sync::Mutex::new(()),
        })
    }

    /// Closes the connection for good (the peer was replaced or the transport shut down).
    fn retire(&self) {
        self.retired.set(true);
        self.out.borrow().close();
    }

    /// Sends `message` for `group` and waits up to `ttl` for the reply.
    async fn call(
        self: &Rc<Self>,
        group: GroupId,
        message: Message,
        ttl: Duration,
    ) -> Result<Message, Unreachable<PartitionRaft>> {
        let unreachable = |why: String| Unreachable::new(&Protocol(why));
        if self.retired.get() {
            return Err(unreachable(format!("connection to {} retired", self.addr)));
        }
        if self.out.borrow().closed.get() {
            self.connect()
                .await
                .map_err(|e| unreachable(format!("connecting to {}: {e}", self.addr)))?;
        }
        let correlation = self.next_correlation.get();
        self.next_correlation.set(correlation + 1);
        let (tx, rx) = oneshot::channel();
        let connection = self.connects.get();
        self.waiting
            .borrow_mut()
            .insert(correlation, (connection, tx));
        let frame = Frame {
            correlation,
            group,
            message,
        };
        let out = self.out.borrow().clone();
        let sent_at = std::time::Instant::now();
        if !out.push(&frame) {
            self.waiting.borrow_mut().remove(&correlation);
            return Err(unreachable(format!(
                "connection to {} closed or backlogged",
                self.addr
            )));
        }
        match GlommioRuntime::timeout(ttl, rx).await {
            Ok(Ok(message)) => Ok(message),
            Ok(Err(_)) => Err(unreachable(format!("connection to {} failed", self.addr))),
            Err(_) => {
                self.waiting.borrow_mut().remove(&correlation);
                if self.last_reply.get() < sent_at {
                    // Nothing at all came back while this RPC waited: the peer may be gone
                    // without a FIN (power loss, a cut network). Reconnect on the next RPC
                    // rather than write into a connection nobody reads.
                    out.close();
                }
                Err(unreachable(format!(
                    "no reply from {} within {ttl:?}",
                    self.addr
                )))
            }
        }
    }

    /// Opens the connection (one at a time; concurrent callers wait for it).
    async fn connect(self: &Rc<Self>) -> std::io::Result<()> {
        let _turn = self.connecting.lock().await;
        if !self.out.borrow().closed.get() {
            return Ok(());
        }
        let stream =
            GlommioRuntime::timeout(CONNECT_TIMEOUT, TcpStream::connect(self.addr.as_str())).await;
        let stream = stream
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))?
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        if self.retired.get() {
            // Replaced or shut down while connecting: nobody would ever close this one.
            return Err(std::io::Error::other("peer retired"));
        }
        stream.set_nodelay(true)?;
        let (mut reader, writer) = stream.split();
        let out = Rc::new(Outbox::default());
        *self.out.borrow_mut() = out.clone();
        // Not a reply: a stopped process still completes TCP handshakes (its backlog does).
        let connection = self.connects.get() + 1;
        self.connects.set(connection);
        let writer_out = out.clone();
        self.tasks.spawn(async move {
            let _ = write_loop(writer, writer_out).await;
        });
        let me = self.clone();
        self.tasks.spawn(async move {
            loop {
                // A closed outbox (write failure, silent peer) ends the read side too.
                let next =
                    GlommioRuntime::select2(read_frame(&mut reader), out.closed_signal()).await;
                let openraft::async_runtime::Select2::First(next) = next else {
                    break;
                };
                match next {
                    Ok(Some((frame, _))) => {
                        me.last_reply.set(std::time::Instant::now());
                        let waiting = me.waiting.borrow_mut().remove(&frame.correlation);
                        if let Some((_, tx)) = waiting {
                            let _ = tx.send(frame.message);
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(peer = %me.addr, error = %e, "raft connection failed");
                        break;
                    }
                }
            }
            out.close();
            // Dropping the senders fails every RPC still waiting on this connection (not
            // those a newer connection carries).
            me.waiting
                .borrow_mut()
                .retain(|_, (on, _)| *on != connection);
        });
        Ok(())
    }
}

/// The address of shard `shard` of a node whose shard 0 listens at `node_addr`
/// (`host:port`): the same host, the port plus the shard index.
fn shard_addr(node_addr: &str, shard: usize) -> String {
    let port = node_addr
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)));
    match port {
        Some((host, port)) if shard > 0 => {
            let port = u16::try_from(shard)
                .ok()
                .and_then(|s| port.checked_add(s))
                .unwrap_or(port);
            format!("{host}:{port}")
        }
        _ => node_addr.to_string(),
    }
}

/// openraft's network factory for one group: clients share the transport's peers.
pub struct NetworkFactory {
    transport: Rc<Transport>,
    group: GroupId,
}

impl RaftNetworkFactory<PartitionRaft> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> PeerClient {
        PeerClient {
            transport: self.transport.clone(),
            target,
            addr: node.addr.clone(),
            group: self.group,
        }
    }
}

/// One group's view of one peer node. The peer shard is looked up for every RPC, so a node
/// that restarts with another shard count is found at its group's new shard.
pub struct PeerClient {
    transport: Rc<Transport>,
    target: u64,
    addr: String,
    group: GroupId,
}

impl PeerClient {
    fn peer(&self) -> Rc<Peer> {
        self.transport.peer(self.target, &self.addr, self.group)
    }

    /// Fails while the group is muted here (`Transport::mute`).
    fn not_muted(&self) -> Result<(), Unreachable<PartitionRaft>> {
        if self.transport.is_muted(self.group) {
            return Err(Unreachable::new(&Protocol(format!(
                "group {} is muted: no majority acknowledged its leader lately",
                self.group.0
            ))));
        }
        Ok(())
    }

    /// A `Vote` or `PreVote`, answered by a `VoteReply`.
    async fn ask_vote(
        &self,
        message: Message,
        option: RPCOption,
    ) -> Result<VoteResponse<PartitionRaft>, RPCError<PartitionRaft>> {
        match self.rpc(message, option.hard_ttl()).await? {
            Message::VoteReply(reply) => Ok(reply),
            other => Err(wrong_reply(other).into()),
        }
    }

    async fn rpc(
        &self,
        message: Message,
        ttl: Duration,
    ) -> Result<Message, RPCError<PartitionRaft>> {
        match self.peer().call(self.group, message, ttl).await? {
            Message::Failed(why) => Err(RPCError::Unreachable(Unreachable::new(&Protocol(why)))),
            reply => Ok(reply),
        }
    }
}

/// Bytes of entries one append request carries at most (well under `FRAME_BYTES_MAX`).
const APPEND_BYTES_MAX: usize = 16 << 20;

fn entry_bytes(e: &crate::entry::Entry) -> usize {
    match &e.payload {
        openraft::EntryPayload::Normal(b) => b.0.len(),
        _ => 256,
    }
}

fn wrong_reply(reply: Message) -> NetworkError<PartitionRaft> {
    NetworkError::new(&Protocol(format!("unexpected reply {reply:?}")))
}

impl RaftNetworkV2<PartitionRaft> for PeerClient {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<PartitionRaft>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<PartitionRaft>, RPCError<PartitionRaft>> {
        // A frame holds at most APPEND_BYTES_MAX of entries (at least one): the rest goes
        // in the next request, and openraft learns how far this one got.
        let mut bytes = 0;
        let fits = rpc
            .entries
            .iter()
            .take_while(|e| {
                bytes += entry_bytes(e);
                bytes <= APPEND_BYTES_MAX
            })
            .count()
            .max(1);
        let cut = fits < rpc.entries.len();
        if cut {
            rpc.entries.truncate(fits);
        }
        let last = rpc.entries.last().map(|e| e.log_id);
        self.not_muted()?;
        match self.rpc(Message::Append(rpc), option.hard_ttl()).await? {
            Message::AppendReply(AppendEntriesResponse::Success) if cut => {
                Ok(AppendEntriesResponse::PartialSuccess(last))
            }
            Message::AppendReply(reply) => Ok(reply),
            other => Err(wrong_reply(other).into()),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<PartitionRaft>,
        option: RPCOption,
    ) -> Result<VoteResponse<PartitionRaft>, RPCError<PartitionRaft>> {
        self.ask_vote(Message::Vote(rpc), option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<PartitionRaft>,
        option: RPCOption,
    ) -> Result<VoteResponse<PartitionRaft>, RPCError<PartitionRaft>> {
        self.ask_vote(Message::PreVote(rpc), option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot<crate::CommittedLeaderId, u64, BasicNode, SnapshotData>,
        _cancel: impl std::future::Future<Output = ReplicationClosed> + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<PartitionRaft>, StreamingError<PartitionRaft>> {
        self.not_muted()?;
        let meta: Meta = snapshot.meta;
        let reply = self
            .peer()
            .call(
                self.group,
                Message::Snapshot {
                    vote,
                    meta,
                    data: snapshot.snapshot,
                },
                option.hard_ttl(),
            )
            .await?;
        match reply {
            Message::SnapshotReply(reply) => Ok(reply),
            Message::Failed(why) => Err(Unreachable::new(&Protocol(why)).into()),
            other => Err(wrong_reply(other).into()),
        }
    }

    async fn transfer_leader(
        &mut self,
        rpc: TransferLeaderRequest<PartitionRaft>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<PartitionRaft>, RPCError<PartitionRaft>> {
        match self
            .rpc(Message::TransferLeader(rpc), option.hard_ttl())
            .await?
        {
            Message::TransferLeaderReply(reply) => Ok(reply),
            other => Err(wrong_reply(other).into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::shard_addr;

    #[test]
    fn shard_addresses_add_the_shard_to_the_port() {
        assert_eq!(shard_addr("127.0.0.1:9093", 0), "127.0.0.1:9093");
        assert_eq!(shard_addr("127.0.0.1:9093", 3), "127.0.0.1:9096");
        assert_eq!(shard_addr("[::1]:9093", 1), "[::1]:9094");
        assert_eq!(shard_addr("raft.example:9093", 1), "raft.example:9094");
    }
}
