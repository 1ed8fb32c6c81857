//! ferrolog-raft: replication for ferrolog. One Raft group per partition, driven by openraft
//! (pinned to one exact 0.10 alpha, `single-threaded`) on the glommio executor of the shard
//! that owns the partition; nothing here crosses threads.
//!
//! - [`runtime`]: `GlommioRuntime`, openraft's `AsyncRuntime` on glommio; passes openraft's
//!   runtime suite.
//! - [`entry`]: Raft entries as Kafka record batches (producer batches as they are, Raft's own
//!   entries as control batches), so the partition log is the Raft log with no second copy.
//! - [`store`]: `LogStore`, openraft's log storage over io/'s `Log`; passes openraft's
//!   log-store suite (`openraft::testing::log::Suite`).
//! - [`state_machine`]: the commit point of a partition, which becomes its high watermark,
//!   and its snapshots (the offset a purged log goes on at).
//! - [`check_quorum`]: when a leader no majority answers mutes itself, so that its
//!   followers elect another (run by the broker's replicas and by the simulator alike).
//! - [`vote_guard`]: when a replica refuses votes because it heard from its group lately
//!   (asked by the transport and by the simulator alike).
//! - [`wire`] and [`network`]: Raft traffic between nodes, every group of a shard over one
//!   connection per peer, with writes coalesced.
//! - [`sim`]: a deterministic simulator of one partition group under network, disk and
//!   process faults, seeded and shrinking (run by the broker crate's binary `ferrolog-sim`,
//!   `scripts/simulate.sh`, which can also put the broker's whole replica in it).
//!
//! Choices forced by openraft, and what they mean for Kafka semantics:
//! - Leader ids are openraft's "standard" ones (one leader per term), so an entry's id is
//!   (term, index) and the term alone fits in Kafka's `partitionLeaderEpoch`.
//! - Raft indexes are dense (one per entry) while Kafka offsets advance by the records in a
//!   batch, so the store keeps an index -> offset list in memory (16 bytes per batch), rebuilt
//!   on open by walking batch headers. A per-segment sidecar would make opening O(1).
//! - openraft requires appended entries to be readable before they are fsynced; io/ reads
//!   stop at the durable offset, so the store keeps not-yet-durable entries in memory.
//!
//! - openraft heartbeats and ticks each group separately, and takes writes only within a
//!   leader's quorum-acknowledged lease (`election_timeout_max`). The broker quiesces idle
//!   groups instead (ticks off, no Raft heartbeats): a node names every quiet group it leads
//!   on a peer in one coalesced [`wire::Message::Beat`] per interval, which the peer's
//!   transport counts as hearing from each group's leader (see `ferrolog::replica`). A quiet
//!   leader's lease runs out, so its first proposal after a quiet spell waits for one
//!   heartbeat round to renew it; the lease cannot be fed from the coalesced beat.
//! - A snapshot carries no records, only the Kafka offset after its last entry and the
//!   partition's idempotent-producer state below it: the partition log is the state. Retention purges a log prefix through openraft (snapshot, then
//!   `purge_log`); a follower that needs a purged entry takes the snapshot and restarts its
//!   log empty at that offset, as a Kafka follower behind its leader's log start does.
pub mod check_quorum;
pub mod entry;
pub mod network;
pub mod runtime;
pub mod sim;
pub mod state_machine;
pub mod store;
pub mod vote_guard;
pub mod wire;

#[cfg(test)]
mod cluster_tests;

pub use openraft;
pub use openraft::async_runtime;
pub use runtime::GlommioRuntime;

/// The openraft config of every ferrolog group, partition or controller: the caller's timing
/// and policies, with the settings safety rests on forced here, so no group can go without
/// them.
///
/// - No leader restore: a restarted leader stands for election like any node. Restoring its
///   leadership of the old term lets a leader whose unsynced tail was lost in the crash
///   (while its followers fsynced it, so it committed and was acknowledged) write another
///   entry under the same log id, which the followers take for the one they hold: an
///   acknowledged write gone, and replicas that differ at the same offsets for good.
///   (Partition stores do not persist the commit index; openraft's docs on
///   `enable_leader_restore` describe the case.)
/// - Pre-Vote: a replica stands only once a majority would vote for it, so one back from a
///   network cut or a restart does not depose a live leader.
pub fn group_config(timing: openraft::Config) -> std::sync::Arc<openraft::Config> {
    let config = openraft::Config {
        enable_leader_restore: Some(false),
        enable_pre_vote: Some(true),
        ..timing
    };
    std::sync::Arc::new(config.validate().expect("a valid Raft config"))
}

/// The config of every partition group (the simulator runs groups with exactly this one).
///
/// A group ticks (heartbeats, election timer) only while it is busy or something changed; an
/// idle group is quiescent (see `ferrolog::replica`). 500 ms heartbeats keep a failover of a
/// busy partition within ~3-4 s. Retention takes snapshots and purges; openraft purges
/// nothing on its own.
pub fn partition_config() -> std::sync::Arc<openraft::Config> {
    group_config(openraft::Config {
        cluster_name: "ferrolog-partition".into(),
        heartbeat_interval: 500,
        election_timeout_min: 2000,
        election_timeout_max: 3500,
        snapshot_policy: openraft::SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: u64::MAX,
        ..openraft::Config::default()
    })
}

/// The config of the controller's group (group 0): faster than a partition's, as metadata
/// changes are few and wait on it. Snapshots carry no data (the log is the state), so its log
/// is never purged. Pre-Vote and no leader restore, as for partitions (`group_config`).
pub fn controller_config() -> std::sync::Arc<openraft::Config> {
    group_config(openraft::Config {
        cluster_name: "ferrolog".into(),
        heartbeat_interval: 150,
        election_timeout_min: 1000,
        election_timeout_max: 2000,
        snapshot_policy: openraft::SnapshotPolicy::Never,
        ..openraft::Config::default()
    })
}

/// The id of a leader once its entries are committed: the term alone (one leader per term).
pub type CommittedLeaderId = openraft::vote::leader_id_std::CommittedLeaderId<u64>;

openraft::declare_raft_types!(
    /// The types of a partition's Raft group.
    pub PartitionRaft:
        D = entry::Batch,
        R = (),
        NodeId = u64,
        Node = openraft::BasicNode,
        Term = u64,
        LeaderId = openraft::impls::leader_id_std::LeaderId<u64, u64>,
        AsyncRuntime = GlommioRuntime,
);
