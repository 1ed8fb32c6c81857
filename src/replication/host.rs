//! What a replicated partition (`raft::Replica`) needs of the node that hosts it: openraft's
//! types with the runtime its tasks and timers run on, the disk its log lives on, and the
//! Raft transport its group talks over.
//!
//! The broker's host is the shard's `Transport` on glommio, implemented here by delegation.
//! The replica simulator (`crate::sim`) hosts the same `Replica` on simulated time, disks and
//! network, so the code that answers producers is the code the simulator runs.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use ferrolog_io::{Fs, GlommioFs, Log};
use ferrolog_raft::entry::{Batch, Entry};
use ferrolog_raft::network::{GroupTaken, NetworkFactory, Transport};
use ferrolog_raft::openraft::impls::ProgressResponder;
use ferrolog_raft::openraft::network::{NetSnapshot, RaftNetworkFactory};
use ferrolog_raft::openraft::raft::ClientWriteResult;
use ferrolog_raft::openraft::type_config::alias::{OneshotReceiverOf, WriteResponderOf};
use ferrolog_raft::openraft::{self, AsyncRuntime, Raft, RaftTypeConfig};
use ferrolog_raft::state_machine::{PartitionStateMachine, SnapshotData};
use ferrolog_raft::store::{Clock, PartitionTypes};
use ferrolog_raft::wire::{GroupId, Handover};
use ferrolog_raft::PartitionRaft;
use futures::future::LocalBoxFuture;
use futures::FutureExt;

/// The runtime a host's replicas run on.
pub type Runtime<H> = <<H as Host>::Raft as RaftTypeConfig>::AsyncRuntime;
/// The instant of that runtime (`std::time::Instant` in the broker, simulated time in the
/// simulator).
pub type At<H> = <Runtime<H> as AsyncRuntime>::Instant;
/// A replica's Raft handle on host `H`.
pub type HostRaft<H> = Raft<<H as Host>::Raft, PartitionStateMachine<<H as Host>::Fs>>;

/// Where a proposal's answer arrives (`Host::write_responder`).
pub type WriteReceiver<H> =
    OneshotReceiverOf<<H as Host>::Raft, ClientWriteResult<<H as Host>::Raft>>;

/// The node-level services a replica uses; see the module doc. Each method is the
/// `Transport` method of the same name.
pub trait Host: 'static {
    type Raft: PartitionTypes<ErrorSource: Send + Sync, D = Batch, Term = u64>;
    type Fs: Fs;
    type Network: RaftNetworkFactory<
        Self::Raft,
        Network: NetSnapshot<Self::Raft, SnapshotData = SnapshotData>,
    >;

    /// The openraft config of partition groups (`ferrolog_raft::partition_config`; with
    /// Pre-Vote, a replica that missed its leader's beats or restarted does not bump the
    /// term under a live leader, as the transport refuses Pre-Votes while the group hears
    /// from its leader).
    fn raft_config(&self) -> Arc<openraft::Config> {
        ferrolog_raft::partition_config()
    }
    /// The disk partition logs are kept on.
    fn fs(&self) -> Self::Fs;
    /// Wall-clock milliseconds, for the log's timestamps.
    fn clock(&self) -> Clock;
    fn factory(self: &Rc<Self>, group: GroupId) -> Self::Network;
    fn register(
        &self,
        group: GroupId,
        raft: HostRaft<Self>,
        log: Rc<Log<Self::Fs>>,
    ) -> Result<(), GroupTaken>;
    fn unregister(&self, group: GroupId);
    fn hold_votes(&self, group: GroupId);
    fn handing_over(&self, group: GroupId, term: u64) -> bool;
    fn elect(&self, group: GroupId, to: u64) -> LocalBoxFuture<'_, Handover>;
    fn log_start(
        &self,
        node_id: u64,
        group: GroupId,
        ttl: Duration,
    ) -> LocalBoxFuture<'_, Result<i64, String>>;
    fn liveness(&self, node_id: u64, group: GroupId, within: Duration) -> (bool, u64);
    fn heard(&self, group: GroupId) -> Option<At<Self>>;
    fn followed_by(&self, group: GroupId, term: u64, followers: usize) -> Option<At<Self>>;
    fn mute(&self, group: GroupId, muted: bool);
    /// A responder for one proposal that answers only once it is applied or refused, and
    /// where that answer arrives.
    fn write_responder() -> (WriteResponderOf<Self::Raft>, WriteReceiver<Self>);
    /// Hears of each entry a replica applies, with its batch's Kafka offset in the
    /// replica's log (the simulator's checker listens here; the broker does not).
    fn applied(&self, _entry: &Entry, _base_offset: Option<i64>) {}
}

impl Host for Transport {
    type Raft = PartitionRaft;
    type Fs = GlommioFs;
    type Network = NetworkFactory;

    fn fs(&self) -> GlommioFs {
        GlommioFs
    }
    fn clock(&self) -> Clock {
        Rc::new(crate::types::now_ms)
    }
    fn factory(self: &Rc<Self>, group: GroupId) -> NetworkFactory {
        Transport::factory(self, group)
    }
    fn register(
        &self,
        group: GroupId,
        raft: HostRaft<Self>,
        log: Rc<Log>,
    ) -> Result<(), GroupTaken> {
        Transport::register(self, group, raft, log)
    }
    fn unregister(&self, group: GroupId) {
        Transport::unregister(self, group);
    }
    fn hold_votes(&self, group: GroupId) {
        Transport::hold_votes(self, group)
    }
    fn handing_over(&self, group: GroupId, term: u64) -> bool {
        Transport::handing_over(self, group, term)
    }
    fn elect(&self, group: GroupId, to: u64) -> LocalBoxFuture<'_, Handover> {
        Transport::elect(self, group, to).boxed_local()
    }
    fn log_start(
        &self,
        node_id: u64,
        group: GroupId,
        ttl: Duration,
    ) -> LocalBoxFuture<'_, Result<i64, String>> {
        Transport::log_start(self, node_id, group, ttl).boxed_local()
    }
    fn liveness(&self, node_id: u64, group: GroupId, within: Duration) -> (bool, u64) {
        Transport::liveness(self, node_id, group, within)
    }
    fn heard(&self, group: GroupId) -> Option<std::time::Instant> {
        Transport::heard(self, group)
    }
    fn followed_by(
        &self,
        group: GroupId,
        term: u64,
        followers: usize,
    ) -> Option<std::time::Instant> {
        Transport::followed_by(self, group, term, followers)
    }
    fn mute(&self, group: GroupId, muted: bool) {
        Transport::mute(self, group, muted)
    }
    fn write_responder() -> (WriteResponderOf<PartitionRaft>, WriteReceiver<Self>) {
        ProgressResponder::complete_only()
    }
}
