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

use openraft::error::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{AsyncRuntime, BasicNode, Snapshot};

use super::runtime::{random_u64, spawn_on, NodeId, SimRuntime};
use super::store::{StateMachine, Vote};
use super::SimRaft;

pub type NodeRaft = openraft::Raft<SimRaft, StateMachine>;

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
            rafts: RefCell::default(),
        })
    }

    pub fn set_raft(&self, node: NodeId, raft: Option<NodeRaft>) {
        match raft {
            Some(r) => self.rafts.borrow_mut().insert(node, r),
            None => self.rafts.borrow_mut().remove(&node),
        };
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
    async fn call<Req, Resp, F, Fut>(
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

impl RaftNetworkV2<SimRaft> for Client {
    type SnapshotData = ();

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<SimRaft>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<SimRaft>, RPCError<SimRaft>> {
        if self.net.muted.borrow().contains(&self.from) {
            return Err(
                Unreachable::new(&Lost("muted: no majority acknowledged this leader")).into(),
            );
        }
        let answer = self
            .net
            .call(
                self.from,
                self.to,
                option.hard_ttl(),
                rpc,
                |raft, rpc| async move { raft.append_entries(rpc).await.ok() },
            )
            .await?;
        Ok(answer)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<SimRaft>,
        option: RPCOption,
    ) -> Result<VoteResponse<SimRaft>, RPCError<SimRaft>> {
        let answer = self
            .net
            .call(
                self.from,
                self.to,
                option.hard_ttl(),
                rpc,
                |raft, rpc| async move { raft.vote(rpc).await.ok() },
            )
            .await?;
        Ok(answer)
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<SimRaft>,
        option: RPCOption,
    ) -> Result<VoteResponse<SimRaft>, RPCError<SimRaft>> {
        let answer = self
            .net
            .call(
                self.from,
                self.to,
                option.hard_ttl(),
                rpc,
                |raft, rpc| async move { raft.pre_vote(rpc).await.ok() },
            )
            .await?;
        Ok(answer)
    }

    async fn full_snapshot(
        &mut self,
        _vote: Vote,
        _snapshot: Snapshot<crate::CommittedLeaderId, u64, BasicNode, ()>,
        _cancel: impl Future<Output = ReplicationClosed> + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<SimRaft>, StreamingError<SimRaft>> {
        // Nothing is purged in a simulation, so no follower ever needs a snapshot.
        Err(Unreachable::new(&Lost("the simulation sends no snapshots")).into())
    }
}
