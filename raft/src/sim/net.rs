//! The simulated network: every RPC is a message that may be dropped, delayed (so messages
//! reorder), duplicated, or cut by a partition, each way separately. The handler runs as a
//! task of the receiving node, so a crash or a pause of it stops the RPC as it would a real
//! one; a request or reply that is lost leaves the caller waiting until its deadline, while a
//! crashed peer fails it at once (a reset connection).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use openraft::async_runtime::watch::WatchReceiver;
use openraft::async_runtime::Instant as _;
use openraft::error::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{AsyncRuntime, BasicNode, Snapshot};

use super::fs::SimFs;
use super::runtime::{random_u64, spawn_on, NodeId, SimInstant, SimRuntime};
use super::SimRaft;
use crate::state_machine::{PartitionStateMachine, SnapshotData};
use crate::store::Vote;

pub type NodeRaft = openraft::Raft<SimRaft, PartitionStateMachine<SimFs>>;

/// How the network misbehaves in one run.
#[derive(Debug, Clone, Copy)]
pub struct Weather {
    /// Chance in a million that a message is lost.
    pub drop_ppm: u64,
    /// Chance in a million that a request is delivered twice.
    pub dup_ppm: u64,
    /// Each message takes up to this long.
    pub delay_max: Duration,
}

pub struct Net {
    pub weather: Weather,
    /// Directed links that carry nothing, (from, to), with how many faults cut each.
    cut: RefCell<BTreeMap<(NodeId, NodeId), u32>>,
    /// Nodes whose leader muted itself (check quorum): they send no appends.
    muted: RefCell<BTreeSet<NodeId>>,
    /// When each node last took an append from its leader, and when it restarted with a
    /// log, for the vote guard (`crate::vote_guard`), as the broker's transport keeps them.
    heard: RefCell<BTreeMap<NodeId, SimInstant>>,
    /// Snapshots a follower installed from its leader (answered by it).
    pub snapshots_installed: std::cell::Cell<u64>,
    restarted: RefCell<BTreeMap<NodeId, SimInstant>>,
    rafts: RefCell<BTreeMap<NodeId, NodeRaft>>,
}

fn chance(ppm: u64) -> bool {
    random_u64() % 1_000_000 < ppm
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Lost(&'static str);

impl Net {
    pub fn new(weather: Weather) -> Rc<Net> {
        Rc::new(Net {
            weather,
            cut: RefCell::default(),
            muted: RefCell::default(),
            heard: RefCell::default(),
            snapshots_installed: Default::default(),
            restarted: RefCell::default(),
            rafts: RefCell::default(),
        })
    }

    /// Routes RPCs to `node`'s new Raft, or (`None`: it crashed) to nothing, forgetting
    /// what its transport knew.
    pub fn set_raft(&self, node: NodeId, raft: Option<NodeRaft>) {
        match raft {
            Some(r) => self.rafts.borrow_mut().insert(node, r),
            None => {
                self.muted.borrow_mut().remove(&node);
                self.heard.borrow_mut().remove(&node);
                self.restarted.borrow_mut().remove(&node);
                self.rafts.borrow_mut().remove(&node)
            }
        };
    }

    /// `node` restarted with a log: it refuses votes for a while (the broker's
    /// `Transport::hold_votes`).
    pub fn hold_votes(&self, node: NodeId) {
        self.restarted.borrow_mut().insert(node, SimInstant::now());
    }

    /// Whether `node` refuses a Pre-Vote or a vote (other than a leadership transfer) now,
    /// as the broker's transport decides it. The simulation sends no coalesced beats, so a
    /// leader's followers never answer one.
    fn refuses_vote(&self, node: NodeId, raft: &NodeRaft) -> bool {
        let m = raft.metrics();
        let m = m.borrow_watched();
        crate::vote_guard::refuses_vote(
            m.state,
            m.current_leader.is_some(),
            self.heard.borrow().get(&node).copied(),
            None,
            self.restarted.borrow().get(&node).copied(),
            SimInstant::now(),
        )
    }

    pub fn raft(&self, node: NodeId) -> Option<NodeRaft> {
        self.rafts.borrow().get(&node).cloned()
    }

    /// Cuts `from -> to` (once more, if another fault already cut it).
    pub fn cut(&self, from: NodeId, to: NodeId) {
        *self.cut.borrow_mut().entry((from, to)).or_default() += 1;
    }

    /// Undoes one `cut(from, to)`.
    pub fn uncut(&self, from: NodeId, to: NodeId) {
        let mut cut = self.cut.borrow_mut();
        if let Some(n) = cut.get_mut(&(from, to)) {
            *n -= 1;
            if *n == 0 {
                cut.remove(&(from, to));
            }
        }
    }

    /// Mutes `node`'s appends or lets them go again, as the broker's transport does for a
    /// group whose leader no majority acknowledged lately (`crate::check_quorum`).
    pub fn mute(&self, node: NodeId, muted: bool) {
        if muted {
            self.muted.borrow_mut().insert(node);
        } else {
            self.muted.borrow_mut().remove(&node);
        }
    }

    /// Heals every cut.
    pub fn heal_all(&self) {
        self.cut.borrow_mut().clear();
    }

    fn passes(&self, from: NodeId, to: NodeId) -> bool {
        !self.cut.borrow().contains_key(&(from, to)) && !chance(self.weather.drop_ppm)
    }

    fn delay(&self) -> Duration {
        let max = self.weather.delay_max.as_nanos() as u64;
        Duration::from_nanos(random_u64() % max.max(1))
    }

    /// Sends `request` from `from` to `to`'s `handler` and waits up to `ttl` for the reply.
    pub async fn call<Req, Resp, F, Fut>(
        self: &Rc<Self>,
        from: NodeId,
        to: NodeId,
        ttl: Duration,
        request: Req,
        handler: F,
    ) -> Result<Resp, Unreachable<SimRaft>>
    where
        Req: Clone + 'static,
        Resp: 'static,
        F: Fn(NodeRaft, Req) -> Fut + Clone + 'static,
        Fut: Future<Output = Option<Resp>> + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let copies = if chance(self.weather.dup_ppm) { 2 } else { 1 };
        let mut reply = Some(tx);
        for copy in 0..copies {
            let net = self.clone();
            let (handler, request, reply) = (handler.clone(), request.clone(), reply.take());
            // A duplicate arrives later than the original, as a retransmission would.
            let extra = if copy == 0 { Duration::ZERO } else { ttl / 2 };
            spawn_on(to, async move {
                // A message lost on the way leaves the caller waiting to its deadline (the
                // reply slot stays open that long); a crashed peer fails it at once, as a
                // reset connection does.
                let lost = |reply| async move {
                    SimRuntime::sleep(ttl).await;
                    drop(reply);
                };
                if !net.passes(from, to) {
                    return lost(reply).await;
                }
                SimRuntime::sleep(net.delay() + extra).await;
                let Some(raft) = net.raft(to) else { return };
                let Some(answer) = handler(raft, request).await else {
                    return;
                };
                if !net.passes(to, from) {
                    return lost(reply).await;
                }
                SimRuntime::sleep(net.delay()).await;
                if let Some(tx) = reply {
                    let _ = tx.send(answer);
                }
            });
        }
        match SimRuntime::timeout(ttl, rx).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => Err(Unreachable::new(&Lost("the peer went away"))),
            Err(_) => Err(Unreachable::new(&Lost("no reply in time"))),
        }
    }
}

/// The network of one node.
#[derive(Clone)]
pub struct Factory {
    pub node: NodeId,
    pub net: Rc<Net>,
}

impl RaftNetworkFactory<SimRaft> for Factory {
    type Network = Client;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> Client {
        Client {
            from: self.node,
            to: target,
            net: self.net.clone(),
        }
    }
}

pub struct Client {
    from: NodeId,
    to: NodeId,
    net: Rc<Net>,
}

impl Client {
    /// A leader that muted itself (check quorum) sends no appends and no snapshots.
    fn not_muted(&self) -> Result<(), Unreachable<SimRaft>> {
        match self.net.muted.borrow().contains(&self.from) {
            true => Err(Unreachable::new(&Lost(
                "muted: no majority acknowledged this leader",
            ))),
            false => Ok(()),
        }
    }
}

impl RaftNetworkV2<SimRaft> for Client {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<SimRaft>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<SimRaft>, RPCError<SimRaft>> {
        self.not_muted()?;
        let (net, to) = (self.net.clone(), self.to);
        let answer = self
            .net
            .call(
                self.from,
                self.to,
                option.hard_ttl(),
                rpc,
                move |raft, rpc| {
                    let net = net.clone();
                    async move {
                        let reply = raft.append_entries(rpc).await.ok()?;
                        // Not from a deposed leader whose term this node has moved past.
                        if !matches!(reply, AppendEntriesResponse::HigherVote(_)) {
                            net.heard.borrow_mut().insert(to, SimInstant::now());
                        }
                        Some(reply)
                    }
                },
            )
            .await?;
        Ok(answer)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<SimRaft>,
        option: RPCOption,
    ) -> Result<VoteResponse<SimRaft>, RPCError<SimRaft>> {
        let (net, to) = (self.net.clone(), self.to);
        let answer = self
            .net
            .call(
                self.from,
                self.to,
                option.hard_ttl(),
                rpc,
                move |raft, rpc| {
                    let net = net.clone();
                    async move {
                        if !rpc.leadership_transfer && net.refuses_vote(to, &raft) {
                            // Answered as a Pre-Vote would be, and not granted.
                            let mut reply = raft.pre_vote(rpc).await.ok()?;
                            reply.vote_granted = false;
                            return Some(reply);
                        }
                        raft.vote(rpc).await.ok()
                    }
                },
            )
            .await?;
        Ok(answer)
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<SimRaft>,
        option: RPCOption,
    ) -> Result<VoteResponse<SimRaft>, RPCError<SimRaft>> {
        let (net, to) = (self.net.clone(), self.to);
        let answer = self
            .net
            .call(
                self.from,
                self.to,
                option.hard_ttl(),
                rpc,
                move |raft, rpc| {
                    let net = net.clone();
                    async move {
                        let refuse = net.refuses_vote(to, &raft);
                        let mut reply = raft.pre_vote(rpc).await.ok()?;
                        reply.vote_granted &= !refuse;
                        Some(reply)
                    }
                },
            )
            .await?;
        Ok(answer)
    }

    /// A snapshot carries only the Kafka offset its follower's log goes on at and the
    /// partition's producer state, so it travels in one message, as the broker's transport
    /// sends it (here as it is, not encoded).
    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot<crate::CommittedLeaderId, u64, BasicNode, SnapshotData>,
        _cancel: impl Future<Output = ReplicationClosed> + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<SimRaft>, StreamingError<SimRaft>> {
        self.not_muted()?;
        let request = (vote, snapshot.meta, snapshot.snapshot);
        let answer = self
            .net
            .call(
                self.from,
                self.to,
                option.hard_ttl(),
                request,
                |raft, (vote, meta, next)| async move {
                    let snapshot = Snapshot {
                        meta,
                        snapshot: next,
                    };
                    raft.install_full_snapshot(vote, snapshot).await.ok()
                },
            )
            .await?;
        let installed = &self.net.snapshots_installed;
        installed.set(installed.get() + 1);
        Ok(answer)
    }
}
