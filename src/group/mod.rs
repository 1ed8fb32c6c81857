//! The group coordinator: consumer groups and their committed offsets.
//!
//! Groups live in the internal topic `__consumer_offsets` (`offsets.topic.num.partitions`
//! partitions, compacted). A group belongs to partition `abs(javaHash(group id)) % partitions`,
//! as in Kafka, and is served by the shard that owns that partition: its state is shard-local
//! (`Shard::groups`), and every request for the group hops there (`on_group`). Each change
//! that must survive a restart — a committed offset, a classic group's generation and
//! assignments, a KIP-848 group's epoch, a deletion — is appended to that partition as a
//! coordinator record in Kafka's key and value layouts (`codec`), and the request is answered
//! once the append is durable. When a shard opens an offsets partition it replays it (`load`)
//! and answers COORDINATOR_LOAD_IN_PROGRESS until it is done.
//!
//! In a cluster `__consumer_offsets` is replicated like any partition
//! (`offsets.topic.replication.factor`, default 3, capped at the number of nodes): the
//! coordinator's appends go through the partition's Raft group and are answered once
//! committed, and a partition's groups are served by the node leading it. A node loads a
//! partition's groups once it is a ready leader and drops them when it stops leading
//! (`follow_leadership`); requests elsewhere get NOT_COORDINATOR, and clients look the
//! coordinator up again.
//!
//! Two group types share the offsets store: classic groups (`classic`, JoinGroup/SyncGroup)
//! and KIP-848 consumer groups (`consumer`, ConsumerGroupHeartbeat). A group that only has
//! offsets (a consumer using `assign` and committing) is an empty classic group without a
//! protocol type, as in Kafka.
//!
//! Time reaches the state machines as a parameter; the shard's `tick_loop` drives their
//! timeouts (sessions, rebalances) and offset expiry (`offsets.retention.minutes`).
//!
//! `__consumer_offsets` is compact-only, so time and size retention never trim it; as there
//! is no log compaction yet, the coordinator rewrites a partition's live state and drops the
//! older segments once the partition holds more than twice its live records
//! (`snapshot_partitions`), which bounds both the disk and the replay.
//!
//! A KIP-848 group is persisted as its epoch and, per member, its metadata and
//! reconciliation state (epochs, owned partitions, partitions pending revocation), so members
//! carry on after a restart. Its target assignment is not written: after a restart it is
//! recomputed, with the members' current partitions as the starting point.

pub mod classic;
pub mod codec;
pub mod consumer;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use futures::channel::oneshot;
use futures::future::LocalBoxFuture;
use futures::FutureExt;

use crate::config::GroupConfig;
use crate::errors::BrokerError;
use crate::group::classic::{ClassicGroup, ClassicState, Effects};
use crate::group::codec::{CoordinatorRecord, OffsetValue};
use crate::group::consumer::ConsumerGroup;
use crate::partition::{Appended, Partition};
use crate::producer_state::marker_of;
use crate::shard::Shard;
use crate::types::{now_ms, TopicPartition};

/// Kafka's internal topic for group metadata and committed offsets.
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// Whether a topic is internal: flagged in Metadata, written only by the broker, its records
/// never deleted by clients, never matched by a subscription's regular expression.
pub fn is_internal_topic(name: &str) -> bool {
    name == OFFSETS_TOPIC || name == crate::txn::TRANSACTION_TOPIC
}
/// What the coordinator needs of an offsets partition. `Partition` serves it on a shard, and
/// the simulator's replica serves it in the simulated world (`crate::sim`), so that loads,
/// offset writes and the coordinator's checks run the same code in both.
pub trait OffsetsLog {
    /// Whether this replica leads the partition, and so coordinates its groups.
    fn is_leader(&self) -> bool;
    /// The leader epoch this replica knows (0 with one replica).
    fn leader_epoch(&self) -> i32;
    /// Waits for a current lease: no other replica leads while it holds.
    fn read_lease(&self) -> LocalBoxFuture<'_, Result<(), BrokerError>>;
    /// The offset after the last committed batch.
    fn high_watermark(&self) -> i64;
    /// The log start reads see.
    fn log_start(&self) -> i64;
    /// The first offset this replica's log still holds: at or below `log_start`, which it
    /// follows once it has applied a log-start entry.
    fn stored_start(&self) -> i64;
    /// The offset after the last batch this replica's log holds.
    fn log_end(&self) -> i64;
    /// Moves the log start to `offset` (at or below the HW) on every replica, and answers
    /// this replica's log start once it moved there.
    fn move_log_start(
        &self,
        offset: i64,
        now_ms: i64,
    ) -> LocalBoxFuture<'_, Result<i64, BrokerError>>;
    /// Committed batches from `offset`: at least the first whole one, up to `max_bytes`.
    fn read_committed(
        &self,
        offset: i64,
        max_bytes: usize,
    ) -> LocalBoxFuture<'_, Result<Bytes, BrokerError>>;
    /// Appends one batch of coordinator records now, and answers where it landed once it is
    /// durable (committed, when replicated).
    fn append_batch(
        self: &Rc<Self>,
        batch: &Bytes,
        now_ms: i64,
    ) -> LocalBoxFuture<'static, Result<Appended, BrokerError>>;
}

/// How often a shard checks its groups' session and rebalance timeouts.
const TICK_MS: u64 = 100;
/// Bytes read per round while loading an offsets partition.
const LOAD_READ_BYTES: usize = 1 << 20;
/// How often a shard checks whether an offsets partition needs its live state rewritten.
const SNAPSHOT_CHECK_MS: i64 = 30_000;
/// Records an offsets partition may hold beyond twice its live records before the rewrite.
const SNAPSHOT_SLACK_RECORDS: i64 = 10_000;
/// Bytes of keys and values per batch in a rewrite (well under the topic's
/// max.message.bytes, 1 MiB by default).
const SNAPSHOT_BATCH_BYTES: usize = 256 << 10;

/// The offsets partition of a group: Kafka's `Utils.abs(groupId.hashCode()) % partitions`,
/// with Java's String hash over UTF-16 code units, so a group has the same partition here as
/// in Apache Kafka.
pub fn partition_for(group_id: &str, partitions: i32) -> i32 {
    assert!(partitions > 0, "the offsets topic has partitions");
    let mut h: i32 = 0;
    for unit in group_id.encode_utf16() {
        h = h.wrapping_mul(31).wrapping_add(i32::from(unit));
    }
    let abs = if h == i32::MIN { 0 } else { h.abs() };
    abs % partitions
}

thread_local! {
    static NEXT_INCARNATION: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn next_incarnation() -> u64 {
    NEXT_INCARNATION.with(|n| {
        n.set(n.get() + 1);
        n.get()
    })
}

pub enum GroupKind {
    Classic(ClassicGroup),
    Consumer(ConsumerGroup),
}

pub struct Group {
    /// The offsets partition that stores this group.
    pub partition: i32,
    pub kind: GroupKind,
    /// Committed offsets by (topic, partition): only changes whose write is durable
    /// (committed, when replicated), see `write_offsets`.
    pub offsets: BTreeMap<(String, i32), OffsetValue>,
    /// Per (topic, partition), where the write of the change applied last landed in the
    /// offsets partition: two writes of one offset may be confirmed out of order, and the
    /// later one in the log must win, as in a replay.
    offsets_landed_at: HashMap<(String, i32), i64>,
    /// The offsets of this group with writes appended but not yet confirmed, and how many
    /// each: they do not expire meanwhile (the tombstone would land after the pending
    /// value), the group is not dropped as vacant, and deleting the group tombstones them.
    pending_offsets: HashMap<(String, i32), u32>,
    /// Tells this group apart from one of the same id deleted or unloaded before: a write
    /// confirmed after that applies to neither.
    incarnation: u64,
    /// The group's metadata record as last written: a classic group is persisted only when a
    /// rebalance completes, and a rewrite of the partition must keep that, not a state in
    /// the middle of a rebalance.
    pub persisted: Option<CoordinatorRecord>,
    /// How many times the group changed between classic and KIP-848: a KIP-848 group's
    /// epoch starts again from 0 (see `metadata_written`).
    conversions: u64,
}

impl Group {
    /// A group that only has offsets (a standalone consumer's commits, or a group whose
    /// metadata was deleted): an empty classic group without a protocol type, as in Kafka.
    pub fn offsets_only(partition: i32, cfg: &GroupConfig, now_ms: i64) -> Group {
        Group {
            partition,
            kind: GroupKind::Classic(ClassicGroup::new(now_ms, cfg.initial_rebalance_delay_ms)),
            offsets: BTreeMap::new(),
            offsets_landed_at: HashMap::new(),
            pending_offsets: HashMap::new(),
            incarnation: next_incarnation(),
            persisted: None,
            conversions: 0,
        }
    }

    /// Changes the group between classic and KIP-848 (an empty group that a member of the
    /// other protocol joins); what it had persisted is not its metadata any more.
    fn convert(&mut self, kind: GroupKind) {
        self.kind = kind;
        self.persisted = None;
        self.conversions += 1;
    }

    /// The offsets a write is pending for (see `pending_offsets`).
    pub fn pending_offsets(&self) -> impl Iterator<Item = &(String, i32)> {
        self.pending_offsets.keys()
    }

    /// Applies offset changes whose write landed at `landed_at` and is now durable; a change
    /// of the same offset that landed later and was applied first stays.
    fn apply_offsets(&mut self, changes: Vec<OffsetChange>, landed_at: i64) {
        for (key, value) in changes {
            if self
                .offsets_landed_at
                .get(&key)
                .is_some_and(|at| *at > landed_at)
            {
                continue;
            }
            self.offsets_landed_at.insert(key.clone(), landed_at);
            match value {
                Some(value) => self.offsets.insert(key, value),
                None => self.offsets.remove(&key),
            };
        }
    }

    /// What of the group's metadata was last written to its offsets partition: a classic
    /// group's record as persisted, a KIP-848 group's epoch (each change of its members
    /// moves it), and how many times it changed protocol (which writes nothing, and after
    /// which both start again).
    fn metadata_written(&self) -> (Option<CoordinatorRecord>, Option<i32>, u64) {
        match &self.kind {
            GroupKind::Classic(_) => (self.persisted.clone(), None, self.conversions),
            GroupKind::Consumer(cg) => (None, Some(cg.epoch), self.conversions),
        }
    }

    /// Shows offset changes whose write is not durable yet, never to be taken back: what
    /// issue 17's defect f did, for `unfix::set_offsets_shown_at_append` only.
    fn show_uncommitted(&mut self, changes: &[OffsetChange]) {
        for (key, value) in changes {
            match value {
                Some(value) => self.offsets.insert(key.clone(), value.clone()),
                None => self.offsets.remove(key),
            };
        }
    }

    /// Kafka's state name for DescribeGroups / ListGroups.
    pub fn state_name(&self) -> &'static str {
        match &self.kind {
            GroupKind::Classic(g) => g.state.name(),
            GroupKind::Consumer(g) => g.state_name(),
        }
    }

    /// "classic" or "consumer" (ListGroups v5 `group_type`).
    pub fn type_name(&self) -> &'static str {
        match &self.kind {
            GroupKind::Classic(_) => "classic",
            GroupKind::Consumer(_) => "consumer",
        }
    }

    pub fn protocol_type(&self) -> String {
        match &self.kind {
            GroupKind::Classic(g) => g.protocol_type.clone().unwrap_or_default(),
            GroupKind::Consumer(_) => "consumer".into(),
        }
    }

    /// No members: offsets may expire and the group may be deleted.
    pub fn has_no_members(&self) -> bool {
        match &self.kind {
            GroupKind::Classic(g) => g.is_empty(),
            GroupKind::Consumer(g) => g.members.is_empty(),
        }
    }

    /// Validates an OffsetCommit against the group (Kafka's `validateOffsetCommit`).
    pub fn validate_offset_commit(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation_or_epoch: i32,
        version: i16,
        now_ms: i64,
    ) -> Result<(), BrokerError> {
        match &mut self.kind {
            GroupKind::Classic(g) => {
                g.validate_offset_commit(member_id, instance_id, generation_or_epoch, now_ms)
            }
            GroupKind::Consumer(g) => {
                if generation_or_epoch < 0 && g.members.is_empty() {
                    return Ok(());
                }
                match g.check_member_epoch(member_id, generation_or_epoch) {
                    // KIP-848 members use OffsetCommit v9+; Kafka answers older versions so.
                    Err(BrokerError::StaleMemberEpoch) if version < 9 => {
                        Err(BrokerError::UnsupportedVersion)
                    }
                    r => r,
                }
            }
        }
    }

    /// The record that persists the group's metadata (None for a group with offsets only).
    pub fn metadata_record(&self, group_id: &str) -> Option<CoordinatorRecord> {
        match &self.kind {
            GroupKind::Classic(g) if g.protocol_type.is_none() && g.generation == 0 => None,
            GroupKind::Classic(g) => Some(CoordinatorRecord::Group {
                group: group_id.to_string(),
                value: Some(g.to_value()),
            }),
            GroupKind::Consumer(g) => Some(CoordinatorRecord::ConsumerGroup {
                group: group_id.to_string(),
                value: Some(g.epoch),
            }),
        }
    }
}

/// The groups of the offsets partitions one shard owns.
#[derive(Default)]
pub struct GroupCoordinator {
    /// By id, in order, so that what walks them (expiries, rewrites) does the same on every
    /// run (the simulator replays seeds).
    pub groups: BTreeMap<String, Group>,
    /// Offsets partitions this shard coordinates: false while loading.
    partitions: HashMap<i32, bool>,
    /// Which `load` of each partition is the current one (a replicated partition is unloaded
    /// when its leadership moves away, and may be loaded again before the old load ends).
    loads: HashMap<i32, u64>,
    next_load: u64,
    /// The leader epoch each offsets partition was loaded in (0 with one replica): a node
    /// that lost and regained the lead between two looks may have missed another leader's
    /// writes.
    loaded_epochs: HashMap<i32, i32>,
    /// Offset writes appended but not yet confirmed, per offsets partition: the partition's
    /// live state is not rewritten meanwhile (`snapshot_partitions`), as the rewrite would
    /// put the older value after the pending one in the log.
    offset_writes: HashMap<i32, u32>,
    /// Per offsets partition and producer id, the offsets of its open transaction
    /// (TxnOffsetCommit, KIP-447), durable but shown only once its commit marker is written
    /// there (`complete_txn`), dropped at its abort. The partition is not rewritten while
    /// any are pending: the rewrite would move the log start past them.
    txn_offsets: HashMap<i32, BTreeMap<i64, Vec<TxnOffset>>>,
}

/// One offset of an open transaction: its group, the change, and where it landed.
#[derive(Debug, Clone)]
pub struct TxnOffset {
    group: String,
    change: OffsetChange,
    landed_at: i64,
}

impl GroupCoordinator {
    /// Called before `load` runs for an offsets partition this shard now coordinates (it
    /// leads it, see `follow_leadership`); returns the load's number.
    pub fn start_loading(&mut self, partition: i32) -> u64 {
        self.next_load += 1;
        self.partitions.insert(partition, false);
        self.loads.insert(partition, self.next_load);
        self.next_load
    }

    /// Whether load `load` of `partition` is still the current one.
    fn is_current_load(&self, partition: i32, load: u64) -> bool {
        self.loads.get(&partition) == Some(&load)
    }

    pub fn is_loaded(&self, partition: i32) -> bool {
        self.partitions.get(&partition).copied().unwrap_or(false)
    }

    /// Whether `partition`'s groups are loaded, and were loaded in leader epoch `epoch`: a
    /// replica that lost and regained the lead since its load (between two looks of
    /// `follow`) may have missed another leader's writes, and waits for its next load.
    pub fn is_loaded_in(&self, partition: i32, epoch: i32) -> bool {
        self.is_loaded(partition) && self.loaded_epochs.get(&partition) == Some(&epoch)
    }

    /// Whether any partition is still loading (ListGroups reports it).
    pub fn loading(&self) -> bool {
        self.partitions.values().any(|loaded| !loaded)
    }

    /// Follows this replica's leadership of offsets partition `index` (`leads`, in leader
    /// epoch `epoch`): a leader coordinates the partition's groups, loading them once per
    /// epoch it leads in (one that lost and regained the lead between two looks may have
    /// missed another leader's writes), and a replica that stops leading drops them, so
    /// clients find the new coordinator. Returns the number of the load to run now
    /// (`load`), if one is to start.
    pub fn follow(&mut self, index: i32, leads: bool, epoch: i32) -> Option<u64> {
        if leads && self.loaded_epochs.get(&index).is_some_and(|e| *e != epoch) {
            self.unload(index); // led again in a later term: load afresh
        }
        let coordinated = self.partitions.contains_key(&index);
        if leads && !coordinated {
            tracing::info!(
                partition = index,
                "leading an offsets partition: loading its groups"
            );
            self.loaded_epochs.insert(index, epoch);
            return Some(self.start_loading(index));
        }
        if !leads && coordinated {
            tracing::info!(
                partition = index,
                "no longer leading an offsets partition: its groups move"
            );
            self.unload(index);
        }
        None
    }

    /// Stops coordinating offsets partition `index` (topic deleted, or its leadership moved
    /// to another node): its groups are dropped.
    pub fn unload(&mut self, index: i32) {
        self.partitions.remove(&index);
        self.loads.remove(&index);
        self.loaded_epochs.remove(&index);
        self.txn_offsets.remove(&index);
        self.groups.retain(|_, g| g.partition != index);
    }

    /// Applies one record read back from the log.
    fn replay(&mut self, partition: i32, record: CoordinatorRecord, cfg: &GroupConfig, now: i64) {
        fn entry(
            groups: &mut BTreeMap<String, Group>,
            group: String,
            new: impl FnOnce() -> Group,
        ) -> &mut Group {
            groups.entry(group).or_insert_with(new)
        }
        let new = || Group::offsets_only(partition, cfg, now);
        match record {
            CoordinatorRecord::Offset {
                group,
                topic,
                partition: p,
                value,
            } => match value {
                Some(v) => {
                    entry(&mut self.groups, group, new)
                        .offsets
                        .insert((topic, p), v);
                }
                None => {
                    if let Some(g) = self.groups.get_mut(&group) {
                        g.offsets.remove(&(topic, p));
                    }
                }
            },
            CoordinatorRecord::Group {
                group,
                value: Some(v),
            } => {
                let g = entry(&mut self.groups, group.clone(), new);
                g.persisted = Some(CoordinatorRecord::Group {
                    group,
                    value: Some(v.clone()),
                });
                g.kind = GroupKind::Classic(ClassicGroup::from_value(
                    v,
                    now,
                    cfg.initial_rebalance_delay_ms,
                ));
            }
            CoordinatorRecord::ConsumerGroup {
                group,
                value: Some(epoch),
            } => {
                let assignor = cfg.consumer_assignors[0].clone();
                entry(&mut self.groups, group, new).kind =
                    GroupKind::Consumer(ConsumerGroup::new(epoch, &assignor, now));
            }
            CoordinatorRecord::Group { group, value: None }
            | CoordinatorRecord::ConsumerGroup { group, value: None } => {
                if let Some(g) = self.groups.get_mut(&group) {
                    g.kind = Group::offsets_only(partition, cfg, now).kind;
                    g.persisted = None;
                }
            }
            CoordinatorRecord::ConsumerMember {
                group,
                member,
                value,
            } => {
                let g = entry(&mut self.groups, group, new);
                if !matches!(g.kind, GroupKind::Consumer(_)) {
                    let assignor = cfg.consumer_assignors[0].clone();
                    g.kind = GroupKind::Consumer(ConsumerGroup::new(0, &assignor, now));
                }
                if let GroupKind::Consumer(cg) = &mut g.kind {
                    cg.restore_member(&member, value, cfg.consumer_session_timeout_ms, now);
                }
            }
            CoordinatorRecord::ConsumerAssignment {
                group,
                member,
                value: Some(v),
            } => {
                if let Some(GroupKind::Consumer(cg)) =
                    self.groups.get_mut(&group).map(|g| &mut g.kind)
                {
                    cg.restore_assignment(&member, v);
                }
            }
            CoordinatorRecord::ConsumerAssignment { value: None, .. }
            | CoordinatorRecord::Other { .. } => {}
        }
    }

    /// `offsets.retention.minutes` for offsets partition `index`: the offsets of a group
    /// without members expire that long after the group emptied (or, for a group that only
    /// commits offsets, after each commit); a group left with neither members nor offsets is
    /// deleted. Only for a partition loaded in leader epoch `epoch`, the current one (memory
    /// from an earlier epoch may lack another leader's commits). Changes nothing:
    /// `write_expiries` writes what it finds.
    pub fn expiries(&self, index: i32, epoch: i32, retention_ms: i64, now: i64) -> Vec<Expiry> {
        if !self.is_loaded_in(index, epoch) {
            return Vec::new();
        }
        let mut due = Vec::new();
        for (id, g) in self.groups.iter().filter(|(_, g)| g.partition == index) {
            if !g.has_no_members() || !g.pending_offsets.is_empty() {
                continue;
            }
            let emptied_at = match &g.kind {
                GroupKind::Classic(cg) if cg.protocol_type.is_some() => Some(cg.state_timestamp_ms),
                GroupKind::Classic(_) => None,
                GroupKind::Consumer(cg) => Some(cg.state_timestamp_ms),
            };
            let offsets: Vec<(String, i32)> = g
                .offsets
                .iter()
                .filter(|(_, v)| emptied_at.unwrap_or(v.commit_timestamp_ms) + retention_ms <= now)
                .map(|(k, _)| k.clone())
                .collect();
            let deletes_group = offsets.len() == g.offsets.len() && g.metadata_record(id).is_some();
            if offsets.is_empty() && !deletes_group {
                continue;
            }
            due.push(Expiry {
                group: id.clone(),
                offsets,
                metadata: deletes_group.then(|| tombstone(id, g)),
            });
        }
        due
    }

    /// Every record that describes the live state of one offsets partition: its groups'
    /// metadata and committed offsets.
    fn live_records(&self, partition: i32) -> Vec<CoordinatorRecord> {
        let mut out = Vec::new();
        for (id, g) in self.groups.iter().filter(|(_, g)| g.partition == partition) {
            match &g.kind {
                GroupKind::Classic(_) => out.extend(g.persisted.clone()),
                GroupKind::Consumer(cg) => {
                    out.extend(g.metadata_record(id));
                    for member in cg.members.keys() {
                        out.extend(cg.member_records(id, member));
                    }
                }
            }
            out.extend(
                g.offsets
                    .iter()
                    .map(|((topic, p), v)| CoordinatorRecord::Offset {
                        group: id.clone(),
                        topic: topic.clone(),
                        partition: *p,
                        value: Some(v.clone()),
                    }),
            );
        }
        out
    }

    fn live_record_count(&self, partition: i32) -> usize {
        self.groups
            .iter()
            .filter(|(_, g)| g.partition == partition)
            .map(|(id, g)| {
                let members = match &g.kind {
                    GroupKind::Consumer(cg) => 2 * cg.members.len(),
                    GroupKind::Classic(_) => 0,
                };
                g.offsets.len() + usize::from(g.metadata_record(id).is_some()) + members
            })
            .sum()
    }

    /// Shows or drops the offsets producer `producer_id`'s transaction wrote to partition
    /// `index`, at its marker (`commit` or abort).
    fn close_txn(
        &mut self,
        index: i32,
        producer_id: i64,
        commit: bool,
        cfg: &GroupConfig,
        now: i64,
    ) {
        let Some(offsets) = self
            .txn_offsets
            .get_mut(&index)
            .and_then(|p| p.remove(&producer_id))
        else {
            return;
        };
        if !commit {
            return;
        }
        for o in offsets {
            self.groups
                .entry(o.group)
                .or_insert_with(|| Group::offsets_only(index, cfg, now))
                .apply_offsets(vec![o.change], o.landed_at);
        }
    }

    /// Whether an open transaction wrote an offset of `group_id` for `key` (OffsetFetch with
    /// `require_stable` answers UNSTABLE_OFFSET_COMMIT for it).
    pub fn has_txn_offset(&self, index: i32, group_id: &str, key: &(String, i32)) -> bool {
        self.txn_offsets.get(&index).is_some_and(|p| {
            p.values()
                .flatten()
                .any(|o| o.group == group_id && &o.change.0 == key)
        })
    }

    /// Groups left with neither metadata nor offsets after a replay or a deletion.
    fn drop_vacant(&mut self) {
        self.groups.retain(|_, g| {
            !(g.offsets.is_empty()
                && g.pending_offsets.is_empty()
                && matches!(&g.kind, GroupKind::Classic(c) if c.protocol_type.is_none() && c.is_empty()))
        });
    }
}

/// Replays offsets partition `index` (read from `log`) into the coordinator `groups` (load
/// number `load`, see `start_loading`), up to its HW; stops as soon as another load or an
/// unload replaces it. `now` is the clock.
pub async fn load<L: OffsetsLog>(
    groups: &RefCell<GroupCoordinator>,
    cfg: &GroupConfig,
    index: i32,
    log: &L,
    load: u64,
    now: fn() -> i64,
) {
    let started = std::time::Instant::now();
    // The log start reads see: a replica that applied a rewrite's log start may not have
    // moved its own log there yet, and reads below it are out of range.
    let start = |log: &L| match unfix::loads_from_the_stored_start() {
        true => log.stored_start(),
        false => log.log_start(),
    };
    let mut offset = start(log);
    let mut records = 0usize;
    // Up to the HW as it is when the load ends: a transaction's marker written meanwhile is
    // read here, as `complete_txn` leaves a partition still loading alone.
    while offset < log.high_watermark() {
        let bytes = match log.read_committed(offset, LOAD_READ_BYTES).await {
            Ok(bytes) => bytes,
            Err(_) if start(log) > offset => {
                // The log start moved under the load (replicated: this replica applied a
                // rewrite's log start): replay again from there, where the live state is
                // whole, so nothing dropped before it comes back.
                let mut coordinator = groups.borrow_mut();
                if !coordinator.is_current_load(index, load) {
                    return;
                }
                coordinator.groups.retain(|_, g| g.partition != index);
                offset = log.log_start();
                records = 0;
                continue;
            }
            Err(e) => {
                tracing::error!(partition = index, offset, error = %e,
                    "cannot read the offsets partition; its groups stay unavailable");
                return;
            }
        };
        if bytes.is_empty() {
            break;
        }
        let mut rest = &bytes[..];
        let now = now();
        while !rest.is_empty() {
            let header = match ferrolog_io::batch::verify(rest) {
                Ok(h) => h,
                Err(e) => {
                    tracing::error!(partition = index, offset, error = %e,
                        "damaged batch in the offsets partition; its groups stay unavailable");
                    return;
                }
            };
            let mut coordinator = groups.borrow_mut();
            if !coordinator.is_current_load(index, load) {
                return; // unloaded (leadership moved, topic deleted) or loading again
            }
            let decoded = if let Some(marker) = marker_of(&header, rest) {
                coordinator.close_txn(index, header.producer_id, marker.commit, cfg, now);
                Ok(())
            } else if header.is_transactional() {
                // A transaction's offsets: pending until its marker.
                let mut pending = Vec::new();
                let decoded = codec::decode_batch(&header, rest, |r| {
                    records += 1;
                    if let CoordinatorRecord::Offset {
                        group,
                        topic,
                        partition,
                        value,
                    } = r
                    {
                        pending.push(TxnOffset {
                            group,
                            change: ((topic, partition), value),
                            landed_at: header.base_offset,
                        });
                    }
                });
                coordinator
                    .txn_offsets
                    .entry(index)
                    .or_default()
                    .entry(header.producer_id)
                    .or_default()
                    .extend(pending);
                decoded
            } else {
                codec::decode_batch(&header, rest, |r| {
                    records += 1;
                    coordinator.replay(index, r, cfg, now);
                })
            };
            if let Err(e) = decoded {
                tracing::warn!(partition = index, offset = header.base_offset, error = %e,
                    "skipping a batch of the offsets partition that does not decode");
            }
            offset = header.next_offset();
            rest = &rest[header.total_bytes()..];
        }
    }
    let mut coordinator = groups.borrow_mut();
    if !coordinator.is_current_load(index, load) {
        return;
    }
    coordinator.drop_vacant();
    for g in coordinator
        .groups
        .values_mut()
        .filter(|g| g.partition == index)
    {
        if let GroupKind::Consumer(cg) = &mut g.kind {
            cg.finish_restore();
        }
    }
    coordinator.partitions.insert(index, true);
    let loaded = coordinator
        .groups
        .values()
        .filter(|g| g.partition == index)
        .count();
    tracing::info!(
        partition = index,
        records,
        groups = loaded,
        ms = started.elapsed().as_millis() as u64,
        "loaded offsets partition"
    );
}

/// TxnOffsetCommit (KIP-447): writes `changes` to group `group_id`'s offsets partition
/// `index` as a transactional batch of producer `producer_id` (epoch `epoch`), and keeps
/// them pending, once durable, until the transaction's marker shows or drops them
/// (`complete_txn`).
#[allow(clippy::too_many_arguments)]
pub async fn write_txn_offsets(
    groups: &RefCell<GroupCoordinator>,
    index: i32,
    partition: &Rc<Partition>,
    group_id: &str,
    producer_id: i64,
    epoch: i16,
    guard: Option<u64>,
    changes: Vec<OffsetChange>,
    now_ms: i64,
) -> Result<(), BrokerError> {
    if changes.is_empty() {
        return Ok(());
    }
    let records: Vec<CoordinatorRecord> = changes
        .iter()
        .map(|((topic, p), value)| CoordinatorRecord::Offset {
            group: group_id.to_string(),
            topic: topic.clone(),
            partition: *p,
            value: value.clone(),
        })
        .collect();
    let encoded: Vec<(Bytes, Option<Bytes>)> = records.iter().map(|r| r.encode()).collect();
    let pairs: Vec<(&[u8], Option<&[u8]>)> = encoded
        .iter()
        .map(|(k, v)| (&k[..], v.as_deref()))
        .collect();
    let batch = codec::encode_key_value_batch_of(&pairs, now_ms, Some((producer_id, epoch)));
    let load = groups.borrow().loads.get(&index).copied();
    // Counted as in flight until it settles: the partition is not rewritten meanwhile (the
    // rewrite would move the log start past it before it shows as pending).
    *groups.borrow_mut().offset_writes.entry(index).or_default() += 1;
    let _in_flight = PendingOffsetWrite {
        groups,
        index,
        group_id,
        incarnation: None,
        keys: Vec::new(),
    };
    let landed = match partition.append_txn_records(&batch, guard, now_ms) {
        Ok(step) => step.finish(&partition.log, true).await,
        Err(e) => Err(e),
    };
    let landed = landed.map_err(|e| match e {
        BrokerError::InvalidProducerEpoch | BrokerError::InvalidTxnState => e,
        e => write_error(e),
    })?;
    let mut c = groups.borrow_mut();
    if !load.is_some_and(|load| c.is_current_load(index, load)) {
        // Loaded again since: the load found these in the log.
        return Ok(());
    }
    c.txn_offsets
        .entry(index)
        .or_default()
        .entry(producer_id)
        .or_default()
        .extend(changes.into_iter().map(|change| TxnOffset {
            group: group_id.to_string(),
            change,
            landed_at: landed.base_offset,
        }));
    Ok(())
}

/// A transaction's marker is durable in offsets partition `index`: its offsets show
/// (`commit`) or are dropped. A partition still loading finds the marker itself.
pub fn complete_txn(
    groups: &RefCell<GroupCoordinator>,
    cfg: &GroupConfig,
    index: i32,
    producer_id: i64,
    commit: bool,
) {
    let mut c = groups.borrow_mut();
    if c.is_loaded(index) {
        c.close_txn(index, producer_id, commit, cfg, now_ms());
    }
}

/// Offsets partitions: this shard coordinates a partition's groups while it leads it (always,
/// with one replica), loading them once it is a ready leader (it has applied everything
/// committed before), and drops them when it stops leading; clients then find the new
/// coordinator. Until a load is done, the partition's groups answer
/// COORDINATOR_LOAD_IN_PROGRESS.
pub fn follow_leadership(shard: &Rc<Shard>) {
    let Some(partitions) = shard.image().topic(OFFSETS_TOPIC).map(|t| t.partitions) else {
        return;
    };
    for index in 0..partitions {
        let Some(p) = offsets_partition(shard, index) else {
            continue; // another shard's or another node's
        };
        let (leads, epoch) = (p.is_leader(), p.leader_epoch());
        let Some(load_id) = shard.groups.borrow_mut().follow(index, leads, epoch) else {
            continue;
        };
        let shard = shard.clone();
        glommio::spawn_local(async move {
            let cfg = &shard.config.group;
            load(&shard.groups, cfg, index, &*p, load_id, now_ms).await
        })
        .detach();
    }
}

/// Runs `f` on the shard that coordinates `group_id`, with its offsets partition. Fails with
/// NOT_COORDINATOR when `__consumer_offsets` does not exist (FindCoordinator creates it) and
/// COORDINATOR_LOAD_IN_PROGRESS while the partition loads.
pub async fn on_group<T, F>(shard: &Rc<Shard>, group_id: &str, f: F) -> Result<T, BrokerError>
where
    T: Send + 'static,
    F: FnOnce(Rc<Shard>, Rc<Partition>) -> LocalBoxFuture<'static, Result<T, BrokerError>>
        + Send
        + 'static,
{
    let image = shard.image();
    let topic = image
        .topic(OFFSETS_TOPIC)
        .ok_or(BrokerError::NotCoordinator)?;
    let tp = TopicPartition {
        topic: OFFSETS_TOPIC.to_string(),
        partition: partition_for(group_id, topic.partitions),
    };
    // Another node's partition, or a replica this node does not lead: the client looks the
    // coordinator up again.
    let owner = shard
        .owner_of(&image, &tp)
        .map_err(|_| BrokerError::NotCoordinator)?;
    shard
        .invoke_on(owner, move |s| {
            let s = s.clone();
            let Some(partition) = s.partition(&tp) else {
                return async { Err(BrokerError::NotCoordinator) }.boxed_local();
            };
            async move {
                check_coordinator(&s.groups, tp.partition, &*partition).await?;
                f(s, partition).await
            }
            .boxed_local()
        })
        .await
}

/// Whether this replica may serve the groups of offsets partition `index` (read from `log`)
/// now: it leads the partition, has loaded its groups, and holds a lease, without which
/// another node may coordinate them already. NOT_COORDINATOR sends the client to look the
/// coordinator up again; COORDINATOR_LOAD_IN_PROGRESS makes it retry.
pub async fn check_coordinator<L: OffsetsLog>(
    groups: &RefCell<GroupCoordinator>,
    index: i32,
    log: &L,
) -> Result<(), BrokerError> {
    let loaded = || groups.borrow().is_loaded_in(index, log.leader_epoch());
    let serves = || match (log.is_leader(), loaded()) {
        (false, _) => Err(BrokerError::NotCoordinator),
        (true, false) => Err(BrokerError::CoordinatorLoadInProgress),
        (true, true) => Ok(()),
    };
    serves()?;
    log.read_lease()
        .await
        .map_err(|_| BrokerError::NotCoordinator)?;
    // The lease may have waited: the lead may have moved, or a load begun.
    serves()
}

/// Runs `f` on every shard and collects the results (ListGroups).
pub async fn on_every_shard<T, F>(shard: &Rc<Shard>, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(&Rc<Shard>) -> T + Send + Clone + 'static,
{
    let mut out = Vec::with_capacity(shard.count);
    for s in 0..shard.count {
        let f = f.clone();
        out.push(
            shard
                .invoke_on(crate::types::ShardId(s), move |s| {
                    let r = f(s);
                    async move { r }.boxed_local()
                })
                .await,
        );
    }
    out
}

/// Appends coordinator records to the offsets partition now (so the log has them in the
/// order the state changed) and returns a future that resolves once they are durable.
pub fn append<L: OffsetsLog>(
    log: &Rc<L>,
    records: &[CoordinatorRecord],
    now_ms: i64,
) -> LocalBoxFuture<'static, Result<(), BrokerError>> {
    let landed = append_landed(log, records, now_ms);
    async move { landed.await.map(drop) }.boxed_local()
}

/// A change to one committed offset, by (topic, partition): a new value, or a deletion.
pub type OffsetChange = ((String, i32), Option<OffsetValue>);

/// Writes offset changes (commits, deletions) of group `group_id` to its offsets partition
/// `index` (`log`) now, and applies them to the group in `groups` once the write is durable
/// (committed, when replicated). So OffsetFetch shows only offsets a failover keeps: a write
/// that fails leaves the group as it was, and one that times out shows up only if a later
/// load finds it committed. (Kafka's coordinator, too, reads offsets as of the last
/// committed offset.)
pub async fn write_offsets<L: OffsetsLog>(
    groups: &RefCell<GroupCoordinator>,
    index: i32,
    log: &Rc<L>,
    group_id: &str,
    changes: Vec<OffsetChange>,
    now_ms: i64,
) -> Result<(), BrokerError> {
    write_group(groups, index, log, group_id, changes, None, now_ms).await
}

/// DeleteGroups of `group_id`, on offsets partition `index` (`log`): refused while the group
/// has members (NON_EMPTY_GROUP); otherwise tombstones for all its offsets, those with a write
/// pending too (the tombstones land after them), and for its metadata. Like a commit, the
/// deletion shows once it is durable (`write_offsets`): until then the group is there as it
/// was, and a write that fails leaves it there, as Kafka reads groups as of the last
/// committed offset.
pub async fn delete_group<L: OffsetsLog>(
    groups: &RefCell<GroupCoordinator>,
    index: i32,
    log: &Rc<L>,
    group_id: &str,
    now_ms: i64,
) -> Result<(), BrokerError> {
    let (changes, metadata) = {
        let c = groups.borrow();
        let g = c
            .groups
            .get(group_id)
            .ok_or_else(|| BrokerError::GroupIdNotFound(String::new()))?;
        if !g.has_no_members() {
            return Err(BrokerError::NonEmptyGroup);
        }
        let keys: BTreeSet<&(String, i32)> = g.offsets.keys().chain(g.pending_offsets()).collect();
        let changes: Vec<OffsetChange> = keys.into_iter().map(|k| (k.clone(), None)).collect();
        let metadata = g.metadata_record(group_id).map(|_| tombstone(group_id, g));
        (changes, metadata)
    };
    if unfix::groups_deleted_at_append() {
        let mut records: Vec<CoordinatorRecord> = changes
            .into_iter()
            .map(|((topic, partition), _)| CoordinatorRecord::Offset {
                group: group_id.to_string(),
                topic,
                partition,
                value: None,
            })
            .collect();
        records.extend(metadata);
        groups.borrow_mut().groups.remove(group_id);
        return append(log, &records, now_ms).await;
    }
    write_group(
        groups,
        index,
        log,
        group_id,
        changes,
        Some(metadata),
        now_ms,
    )
    .await?;
    groups.borrow_mut().drop_vacant();
    Ok(())
}

/// OffsetDelete of some offsets of `group_id`, on offsets partition `index` (`log`): per
/// topic of `wanted`, whether the group is subscribed to it, in which case its offsets stay
/// (GROUP_SUBSCRIBED_TO_TOPIC); the others' tombstones show once durable (`write_offsets`).
/// A classic group in the middle of a rebalance is refused with NON_EMPTY_GROUP, as its
/// subscriptions are not known.
pub async fn delete_offsets<L: OffsetsLog>(
    groups: &RefCell<GroupCoordinator>,
    index: i32,
    log: &Rc<L>,
    group_id: &str,
    wanted: Vec<(String, Vec<i32>)>,
    now_ms: i64,
) -> Result<Vec<bool>, BrokerError> {
    let mut changes = Vec::new();
    let mut subscribed_flags = Vec::with_capacity(wanted.len());
    {
        let c = groups.borrow();
        let g = c
            .groups
            .get(group_id)
            .ok_or_else(|| BrokerError::GroupIdNotFound(String::new()))?;
        let subscribed = match &g.kind {
            GroupKind::Classic(cg) if cg.state == ClassicState::Empty => Default::default(),
            GroupKind::Classic(cg) => cg.subscribed_topics().ok_or(BrokerError::NonEmptyGroup)?,
            GroupKind::Consumer(cg) => cg.subscribed_topics(),
        };
        for (topic, partitions) in wanted {
            let is_subscribed = subscribed.contains(&topic);
            subscribed_flags.push(is_subscribed);
            if is_subscribed {
                continue;
            }
            for p in partitions {
                let key = (topic.clone(), p);
                if g.offsets.contains_key(&key) {
                    changes.push((key, None));
                }
            }
        }
    }
    write_offsets(groups, index, log, group_id, changes, now_ms).await?;
    Ok(subscribed_flags)
}

/// `write_offsets`, and with `metadata` (DeleteGroups, an expiry of all of a group) the
/// group's metadata tombstone too (none for a group with offsets only). Once that is
/// durable, and unless the group's metadata was written again since (members joined, and
/// maybe left: their records lie after the tombstone), the group forgets its metadata, and
/// one that has no members goes back to one with offsets only, as a replay leaves it.
async fn write_group<L: OffsetsLog>(
    groups: &RefCell<GroupCoordinator>,
    index: i32,
    log: &Rc<L>,
    group_id: &str,
    changes: Vec<OffsetChange>,
    metadata: Option<Option<CoordinatorRecord>>,
    now_ms: i64,
) -> Result<(), BrokerError> {
    let mut records: Vec<CoordinatorRecord> = changes
        .iter()
        .map(|((topic, p), value)| CoordinatorRecord::Offset {
            group: group_id.to_string(),
            topic: topic.clone(),
            partition: *p,
            value: value.clone(),
        })
        .collect();
    let deletes_group = metadata.is_some();
    records.extend(metadata.flatten());
    let keys: Vec<(String, i32)> = changes.iter().map(|(key, _)| key.clone()).collect();
    let (load, incarnation, written) = {
        let mut c = groups.borrow_mut();
        *c.offset_writes.entry(index).or_default() += 1;
        let group = c.groups.get_mut(group_id);
        let written = group.as_ref().map(|g| g.metadata_written());
        let incarnation = group.map(|g| {
            for key in &keys {
                *g.pending_offsets.entry(key.clone()).or_default() += 1;
            }
            g.incarnation
        });
        (c.loads.get(&index).copied(), incarnation, written)
    };
    // Counts the write as pending until it settles, also when the request is dropped.
    let _pending = PendingOffsetWrite {
        groups,
        index,
        group_id,
        incarnation,
        keys,
    };
    let landed = append_landed(log, &records, now_ms);
    if unfix::offsets_shown_at_append() {
        if let Some(g) = groups.borrow_mut().groups.get_mut(group_id) {
            g.show_uncommitted(&changes);
        }
    }
    // A write that fails, or times out and commits later, is not applied: the client was
    // told it failed, and memory catches up at the next load.
    let landed = landed.await?;
    let mut c = groups.borrow_mut();
    // A load since (the lead moved away and back) replayed the log, this write included;
    // a group deleted since has the tombstones after it.
    let current = load.is_some_and(|load| c.is_current_load(index, load));
    if let (Some(landed), true) = (landed, current) {
        if let Some(g) = c.groups.get_mut(group_id) {
            if Some(g.incarnation) == incarnation {
                g.apply_offsets(changes, landed.base_offset);
                if deletes_group && written == Some(g.metadata_written()) {
                    g.persisted = None;
                    if g.has_no_members() {
                        g.kind = GroupKind::Classic(ClassicGroup::new(now_ms, 0));
                    }
                }
            }
        }
    }
    Ok(())
}

/// An offset write in flight: `write_offsets` counts it in the group and the partition.
struct PendingOffsetWrite<'a> {
    groups: &'a RefCell<GroupCoordinator>,
    index: i32,
    group_id: &'a str,
    incarnation: Option<u64>,
    keys: Vec<(String, i32)>,
}

impl Drop for PendingOffsetWrite<'_> {
    fn drop(&mut self) {
        let mut c = self.groups.borrow_mut();
        let n = c.offset_writes.get_mut(&self.index).expect("counted");
        assert!(*n > 0, "an offset write settles once");
        *n -= 1;
        // A group deleted or loaded anew since has its own count.
        let Some(g) = c.groups.get_mut(self.group_id) else {
            return;
        };
        if Some(g.incarnation) != self.incarnation {
            return;
        }
        for key in &self.keys {
            let pending = g.pending_offsets.get_mut(key).expect("counted");
            *pending -= 1;
            if *pending == 0 {
                g.pending_offsets.remove(key);
            }
        }
    }
}

/// `append`, answering where the batch landed (`None`: nothing to write).
fn append_landed<L: OffsetsLog>(
    log: &Rc<L>,
    records: &[CoordinatorRecord],
    now_ms: i64,
) -> LocalBoxFuture<'static, Result<Option<Appended>, BrokerError>> {
    if records.is_empty() {
        return async { Ok(None) }.boxed_local();
    }
    let bytes = codec::encode_batch(records, now_ms);
    let landed = log.append_batch(&bytes, now_ms);
    async move { landed.await.map(Some).map_err(write_error) }.boxed_local()
}

/// Kafka's answers when the coordinator cannot write: a batch over max.message.bytes is
/// INVALID_COMMIT_OFFSET_SIZE, anything else NOT_COORDINATOR (the client looks the
/// coordinator up again and retries).
fn write_error(e: BrokerError) -> BrokerError {
    tracing::warn!(error = %e, "writing to {OFFSETS_TOPIC} failed");
    match e {
        BrokerError::MessageTooLarge(_) => BrokerError::InvalidCommitOffsetSize,
        _ => BrokerError::NotCoordinator,
    }
}

/// Persists what a classic group's state change requires and then answers the requests it
/// completed. The append happens now; the answers go out from a task once it is durable.
/// The returned receiver says when (and whether) the group's state is durable.
pub fn finish_classic(
    shard: &Rc<Shard>,
    partition: &Rc<Partition>,
    group_id: &str,
    fx: Effects,
    now_ms: i64,
) -> oneshot::Receiver<Result<(), BrokerError>> {
    let (done_tx, done) = oneshot::channel();
    if fx.joins.is_empty() && fx.syncs.is_empty() && !fx.persist {
        let _ = done_tx.send(Ok(()));
        return done;
    }
    let record = if fx.persist {
        let mut c = shard.groups.borrow_mut();
        c.groups.get_mut(group_id).and_then(|g| {
            g.persisted = g.metadata_record(group_id);
            g.persisted.clone()
        })
    } else {
        None
    };
    let durable = append(partition, record.as_slice(), now_ms);
    glommio::spawn_local(async move {
        let written = durable.await;
        for (tx, r) in fx.joins {
            let _ = tx.send(r);
        }
        for (tx, r) in fx.syncs {
            let r = match &written {
                Ok(()) => r,
                Err(e) => Err(e.clone()),
            };
            let _ = tx.send(r);
        }
        let _ = done_tx.send(written);
    })
    .detach();
    done
}

/// Switches that undo one of the coordinator's fixes, for the simulator only
/// (`ferrolog-sim --replica --groups --unfix f`), to show that its checker finds the defect.
pub mod unfix {
    use std::cell::Cell;

    thread_local! {
        static OFFSETS_SHOWN_AT_APPEND: Cell<bool> = const { Cell::new(false) };
        static LOADS_FROM_THE_STORED_START: Cell<bool> = const { Cell::new(false) };
        static GROUPS_DELETED_AT_APPEND: Cell<bool> = const { Cell::new(false) };
        static EXPIRIES_SHOWN_AT_APPEND: Cell<bool> = const { Cell::new(false) };
    }

    /// Expired offsets go from memory as soon as their tombstones are appended, before they
    /// are durable, and nothing brings them back if the write is lost.
    pub fn set_expiries_shown_at_append(on: bool) {
        EXPIRIES_SHOWN_AT_APPEND.with(|c| c.set(on));
    }

    pub(super) fn expiries_shown_at_append() -> bool {
        EXPIRIES_SHOWN_AT_APPEND.with(Cell::get)
    }

    /// DeleteGroups removes the group as soon as its tombstones are appended, before they
    /// are durable, and nothing brings it back if the write is lost: OffsetFetch answers
    /// that its offsets are gone, and after a failover they are there again.
    pub fn set_groups_deleted_at_append(on: bool) {
        GROUPS_DELETED_AT_APPEND.with(|c| c.set(on));
    }

    pub(super) fn groups_deleted_at_append() -> bool {
        GROUPS_DELETED_AT_APPEND.with(Cell::get)
    }

    /// A load replays from the first offset the replica's log holds, not from the log start
    /// reads see: a leader that applied a rewrite's log-start entry but has not moved its
    /// log there yet fails the load, and its groups stay unavailable.
    pub fn set_loads_from_the_stored_start(on: bool) {
        LOADS_FROM_THE_STORED_START.with(|c| c.set(on));
    }

    pub(super) fn loads_from_the_stored_start() -> bool {
        LOADS_FROM_THE_STORED_START.with(Cell::get)
    }

    /// Issue 17's defect f: OffsetFetch shows a committed offset as soon as its write is
    /// appended, before it is durable, and nothing takes it back if the write is lost.
    pub fn set_offsets_shown_at_append(on: bool) {
        OFFSETS_SHOWN_AT_APPEND.with(|c| c.set(on));
    }

    pub(super) fn offsets_shown_at_append() -> bool {
        OFFSETS_SHOWN_AT_APPEND.with(Cell::get)
    }
}

/// Longest string a coordinator record can hold (Kafka writes them with an int16 length).
pub const STRING_BYTES_MAX: usize = i16::MAX as usize;

/// Refuses strings that the group's records could not store.
pub fn check_string(s: &str) -> Result<(), BrokerError> {
    if s.len() > STRING_BYTES_MAX {
        return Err(BrokerError::InvalidRequest(format!(
            "a string of {} bytes is longer than {STRING_BYTES_MAX}",
            s.len()
        )));
    }
    Ok(())
}

/// A new member id: the client id (or instance id) and a random UUID, as Kafka makes them.
/// The prefix is cut so the id fits a record's string.
pub fn new_member_id(prefix: &str) -> String {
    let mut end = prefix.len().min(STRING_BYTES_MAX - 40);
    while !prefix.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}-{}", &prefix[..end], uuid::Uuid::new_v4())
}

/// Drives the timeouts of this shard's groups and the expiry of offsets.
pub async fn tick_loop(shard: Rc<Shard>) {
    let cfg = shard.config.group.clone();
    let mut next_expiry = now_ms() + cfg.offsets_retention_check_interval_ms;
    let mut next_snapshot_check = now_ms() + SNAPSHOT_CHECK_MS;
    let mut put_off: Vec<i32> = Vec::new();
    loop {
        glommio::timer::sleep(Duration::from_millis(TICK_MS)).await;
        follow_leadership(&shard);
        let now = now_ms();
        let mut classic = Vec::new();
        let mut epochs = Vec::new();
        {
            let mut c = shard.groups.borrow_mut();
            let c = &mut *c;
            for (id, g) in c.groups.iter_mut() {
                // Groups of a partition still loading are not complete yet.
                if !c.partitions.get(&g.partition).copied().unwrap_or(false) {
                    continue;
                }
                match &mut g.kind {
                    GroupKind::Classic(cg) => {
                        let mut fx = Effects::default();
                        cg.tick(now, &mut fx);
                        if fx.persist || !fx.joins.is_empty() || !fx.syncs.is_empty() {
                            classic.push((id.clone(), g.partition, fx));
                        }
                    }
                    GroupKind::Consumer(cg) => {
                        let gone = cg.tick(now);
                        if !gone.is_empty() {
                            let mut records = vec![CoordinatorRecord::ConsumerGroup {
                                group: id.clone(),
                                value: Some(cg.epoch),
                            }];
                            for member in &gone {
                                records.extend(cg.member_records(id, member));
                            }
                            epochs.push((g.partition, records));
                        }
                    }
                }
            }
        }
        for (id, index, fx) in classic {
            if let Some(p) = offsets_partition(&shard, index) {
                drop(finish_classic(&shard, &p, &id, fx, now));
            }
        }
        for (index, records) in epochs {
            if let Some(p) = offsets_partition(&shard, index) {
                detach_write(append(&p, &records, now));
            }
        }
        if now >= next_expiry {
            next_expiry = now + cfg.offsets_retention_check_interval_ms;
            expire_offsets(&shard, cfg.offsets_retention_ms, now);
        }
        if now >= next_snapshot_check {
            next_snapshot_check = now + SNAPSHOT_CHECK_MS;
            put_off = snapshot_partitions(&shard, now, None);
        } else if !put_off.is_empty() {
            // Put off for an offset write in flight: looked at again each tick.
            put_off = snapshot_partitions(&shard, now, Some(&put_off));
        }
    }
}

/// Rewrites the live state of this shard's offsets partitions that need it (`rewrite`);
/// `only`: look at these partitions alone. Returns the partitions put off for an offset
/// write in flight.
fn snapshot_partitions(shard: &Rc<Shard>, now: i64, only: Option<&[i32]>) -> Vec<i32> {
    let mut put_off = Vec::new();
    let indexes: Vec<i32> = shard
        .groups
        .borrow()
        .partitions
        .iter()
        .filter(|(i, loaded)| **loaded && only.is_none_or(|only| only.contains(i)))
        .map(|(i, _)| *i)
        .collect();
    for index in indexes {
        let Some(partition) = offsets_partition(shard, index) else {
            continue;
        };
        match rewrite(
            &shard.groups,
            index,
            &partition,
            SNAPSHOT_SLACK_RECORDS,
            now,
        ) {
            Rewrite::Unneeded => {}
            Rewrite::PutOff => put_off.push(index),
            Rewrite::Started(done) => drop(glommio::spawn_local(done).detach()),
        }
    }
    put_off
}

/// What `rewrite` did.
pub enum Rewrite {
    /// The partition holds no more than twice its live records, plus the slack.
    Unneeded,
    /// Put off: an offset write of the partition is in flight, and its value would land
    /// before the older one in the copy.
    PutOff,
    /// The live state is appended again; run this to move the log start to it once it is
    /// durable. It answers whether the log start moved.
    Started(LocalBoxFuture<'static, bool>),
}

/// `__consumer_offsets` is compacted in Kafka; ferrolog has no log compaction yet, so the
/// coordinator bounds its partitions itself: once offsets partition `index` (read from `log`)
/// holds more than twice its live records plus `slack`, it appends all live records again
/// and, once they are durable (committed, when replicated), moves the log start to them,
/// which deletes the older segments (on every replica, through a Raft entry, see
/// `Partition::move_log_start`). A load then replays the live state and what came after it.
pub fn rewrite<L: OffsetsLog + 'static>(
    groups: &RefCell<GroupCoordinator>,
    index: i32,
    log: &Rc<L>,
    slack: i64,
    now: i64,
) -> Rewrite {
    // Memory loaded in an earlier epoch may lack another leader's writes: it is not the
    // live state to copy.
    if !groups.borrow().is_loaded_in(index, log.leader_epoch()) {
        return Rewrite::Unneeded;
    }
    let logged = log.log_end() - log.stored_start();
    let live = groups.borrow().live_record_count(index);
    if logged <= 2 * live as i64 + slack {
        return Rewrite::Unneeded;
    }
    if groups.borrow().offset_writes.get(&index) > Some(&0)
        || groups
            .borrow()
            .txn_offsets
            .get(&index)
            .is_some_and(|p| !p.is_empty())
    {
        return Rewrite::PutOff;
    }
    let records = groups.borrow().live_records(index);
    let mut writes = Vec::new();
    let mut batch: Vec<CoordinatorRecord> = Vec::new();
    let mut batch_bytes = 0;
    for r in records {
        let (k, v) = r.encode();
        let size = k.len() + v.map_or(0, |v| v.len());
        if !batch.is_empty() && batch_bytes + size > SNAPSHOT_BATCH_BYTES {
            writes.push(append_landed(log, &batch, now));
            batch.clear();
            batch_bytes = 0;
        }
        batch.push(r);
        batch_bytes += size;
    }
    if !batch.is_empty() {
        writes.push(append_landed(log, &batch, now));
    }
    // The log is to start at the copy's first batch; with no live state at all,
    // everything up to the HW goes.
    let mut start = log.high_watermark();
    let log = log.clone();
    Rewrite::Started(
        async move {
            for (i, w) in writes.into_iter().enumerate() {
                match w.await {
                    Ok(Some(landed)) if i == 0 => start = landed.base_offset,
                    Ok(_) => {}
                    Err(_) => return false,
                }
            }
            match log.move_log_start(start, now).await {
                Ok(_) => {
                    tracing::info!(
                        partition = index,
                        live_records = live,
                        replaced_records = logged,
                        "rewrote the live state of an offsets partition and dropped what it replaces"
                    );
                    true
                }
                Err(e) => {
                    tracing::warn!(partition = index, error = %e,
                        "could not move the offsets partition's log start");
                    false
                }
            }
        }
        .boxed_local(),
    )
}

/// Writes whose outcome nobody waits for (a failure is logged by `append`).
pub fn detach_write(write: LocalBoxFuture<'static, Result<(), BrokerError>>) {
    glommio::spawn_local(async move {
        let _ = write.await;
    })
    .detach();
}

pub fn offsets_partition(shard: &Shard, index: i32) -> Option<Rc<Partition>> {
    shard.partition(&TopicPartition {
        topic: OFFSETS_TOPIC.to_string(),
        partition: index,
    })
}

/// Applies `offsets.retention.minutes` to the offsets partitions this shard coordinates.
fn expire_offsets(shard: &Rc<Shard>, retention_ms: i64, now: i64) {
    let indexes: Vec<i32> = shard.groups.borrow().partitions.keys().copied().collect();
    for index in indexes {
        let Some(p) = offsets_partition(shard, index) else {
            continue;
        };
        let shard = shard.clone();
        glommio::spawn_local(async move {
            let epoch = p.leader_epoch();
            let due = shard
                .groups
                .borrow()
                .expiries(index, epoch, retention_ms, now);
            write_expiries(&shard.groups, index, &p, &due, now).await;
        })
        .detach();
    }
}

/// Offsets of one group that expired (`GroupCoordinator::expiries`), with the tombstone of
/// its metadata when nothing of it is left.
pub struct Expiry {
    pub group: String,
    pub offsets: Vec<(String, i32)>,
    pub metadata: Option<CoordinatorRecord>,
}

/// Writes the tombstones of `due`, found just now in offsets partition `index` (`log`),
/// with no await in between (so no write of those offsets can have begun since). Like a
/// deletion, an expiry shows once its tombstones are durable; a commit that lands after them
/// stays.
pub async fn write_expiries<L: OffsetsLog>(
    groups: &RefCell<GroupCoordinator>,
    index: i32,
    log: &Rc<L>,
    due: &[Expiry],
    now_ms: i64,
) {
    if unfix::expiries_shown_at_append() {
        return expire_at_append(groups, log, due, now_ms).await;
    }
    let writes = due.iter().map(|e| {
        if e.metadata.is_some() {
            tracing::info!(group = %e.group, "deleting an empty group without offsets");
        }
        let changes = e.offsets.iter().map(|k| (k.clone(), None)).collect();
        // Only a group with nothing left goes; see `write_group`.
        let metadata = e.metadata.clone().map(Some);
        write_group(groups, index, log, &e.group, changes, metadata, now_ms)
    });
    // Every write begins (appends, and counts its offsets pending) before any waits.
    let mut writes: Vec<_> = writes
        .map(|w| Box::pin(futures::future::maybe_done(w)))
        .collect();
    futures::future::poll_fn(|cx| {
        let mut done = true;
        for w in writes.iter_mut() {
            done &= std::future::Future::poll(w.as_mut(), cx).is_ready();
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    for w in writes.iter_mut() {
        if let Some(Err(e)) = w.as_mut().take_output() {
            tracing::debug!(partition = index, error = %e, "expired offsets not deleted yet");
        }
    }
    groups.borrow_mut().drop_vacant();
}

/// What `write_expiries` did before issue 17's coordinator fixes, for
/// `unfix::set_expiries_shown_at_append` only: the offsets go from memory at once, and
/// nothing brings them back if the tombstones are lost.
async fn expire_at_append<L: OffsetsLog>(
    groups: &RefCell<GroupCoordinator>,
    log: &Rc<L>,
    due: &[Expiry],
    now_ms: i64,
) {
    let mut records = Vec::new();
    {
        let mut c = groups.borrow_mut();
        for e in due {
            let Some(g) = c.groups.get_mut(&e.group) else {
                continue;
            };
            for (topic, partition) in &e.offsets {
                g.offsets.remove(&(topic.clone(), *partition));
                records.push(CoordinatorRecord::Offset {
                    group: e.group.clone(),
                    topic: topic.clone(),
                    partition: *partition,
                    value: None,
                });
            }
            if let Some(tombstone) = &e.metadata {
                records.push(tombstone.clone());
                g.kind = GroupKind::Classic(ClassicGroup::new(now_ms, 0));
            }
        }
        c.drop_vacant();
    }
    let _ = append(log, &records, now_ms).await;
}

/// The tombstone that deletes a group's metadata record.
pub fn tombstone(group_id: &str, g: &Group) -> CoordinatorRecord {
    match &g.kind {
        GroupKind::Classic(_) => CoordinatorRecord::Group {
            group: group_id.to_string(),
            value: None,
        },
        GroupKind::Consumer(_) => CoordinatorRecord::ConsumerGroup {
            group: group_id.to_string(),
            value: None,
        },
    }
}

/// Looks a classic group up for a member request, or creates it for a new member.
/// A KIP-848 group with members cannot take classic members.
pub fn classic_group<'a>(
    c: &'a mut GroupCoordinator,
    group_id: &str,
    partition: i32,
    create: bool,
    cfg: &GroupConfig,
    now: i64,
) -> Result<&'a mut ClassicGroup, BrokerError> {
    if !c.groups.contains_key(group_id) {
        if !create {
            return Err(BrokerError::UnknownMemberId);
        }
        c.groups.insert(
            group_id.to_string(),
            Group::offsets_only(partition, cfg, now),
        );
    }
    let g = c.groups.get_mut(group_id).expect("present");
    if let GroupKind::Consumer(cg) = &g.kind {
        if !create {
            // A classic member's request to a KIP-848 group: it is not a member.
            return Err(BrokerError::UnknownMemberId);
        }
        if !cg.members.is_empty() {
            return Err(BrokerError::InconsistentGroupProtocol);
        }
        // An empty consumer group becomes a classic one when a classic member joins.
        g.convert(GroupKind::Classic(ClassicGroup::new(
            now,
            cfg.initial_rebalance_delay_ms,
        )));
    }
    match &mut g.kind {
        GroupKind::Classic(cg) => Ok(cg),
        GroupKind::Consumer(_) => unreachable!("converted above"),
    }
}

/// Looks a KIP-848 group up, or creates it for a joining member. An empty classic group (one
/// with only offsets) becomes a consumer group; one with members is not a consumer group.
pub fn consumer_group<'a>(
    c: &'a mut GroupCoordinator,
    id: &str,
    partition: i32,
    create: bool,
    cfg: &GroupConfig,
    now: i64,
) -> Result<&'a mut Group, BrokerError> {
    if !c.groups.contains_key(id) {
        if !create {
            return Err(BrokerError::GroupIdNotFound(format!(
                "Group {id} not found."
            )));
        }
        c.groups
            .insert(id.to_string(), Group::offsets_only(partition, cfg, now));
    }
    let g = c.groups.get_mut(id).expect("present");
    if let GroupKind::Classic(cg) = &g.kind {
        if !cg.is_empty() || !create {
            return Err(BrokerError::GroupIdNotFound(format!(
                "Group {id} is not a consumer group."
            )));
        }
        let assignor = &cfg.consumer_assignors[0];
        g.convert(GroupKind::Consumer(ConsumerGroup::new(0, assignor, now)));
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offset(commit_timestamp_ms: i64) -> OffsetValue {
        OffsetValue {
            offset: 1,
            leader_epoch: -1,
            metadata: String::new(),
            commit_timestamp_ms,
        }
    }

    fn group(partition: i32, kind: GroupKind) -> Group {
        Group {
            partition,
            kind,
            offsets: BTreeMap::new(),
            offsets_landed_at: HashMap::new(),
            pending_offsets: HashMap::new(),
            incarnation: 0,
            persisted: None,
            conversions: 0,
        }
    }

    /// An offsets partition whose appends land one after another, each durable once the
    /// test says so.
    #[derive(Default)]
    struct HeldLog {
        waiting: RefCell<Vec<oneshot::Sender<()>>>,
        end: std::cell::Cell<i64>,
    }

    impl OffsetsLog for HeldLog {
        fn is_leader(&self) -> bool {
            true
        }
        fn leader_epoch(&self) -> i32 {
            0
        }
        fn read_lease(&self) -> LocalBoxFuture<'_, Result<(), BrokerError>> {
            async { Ok(()) }.boxed_local()
        }
        fn high_watermark(&self) -> i64 {
            0
        }
        fn log_start(&self) -> i64 {
            0
        }
        fn stored_start(&self) -> i64 {
            0
        }
        fn log_end(&self) -> i64 {
            self.end.get()
        }
        fn move_log_start(&self, _: i64, _: i64) -> LocalBoxFuture<'_, Result<i64, BrokerError>> {
            unreachable!("no rewrite here")
        }
        fn read_committed(
            &self,
            _: i64,
            _: usize,
        ) -> LocalBoxFuture<'_, Result<Bytes, BrokerError>> {
            unreachable!("no load here")
        }
        fn append_batch(
            self: &Rc<Self>,
            _: &Bytes,
            _: i64,
        ) -> LocalBoxFuture<'static, Result<Appended, BrokerError>> {
            let base_offset = self.end.get();
            self.end.set(base_offset + 1);
            let (durable, wait) = oneshot::channel();
            self.waiting.borrow_mut().push(durable);
            async move {
                wait.await.map_err(|_| BrokerError::NotCoordinator)?;
                Ok(Appended {
                    base_offset,
                    end_offset: base_offset + 1,
                    log_append_time_ms: -1,
                    duplicate: false,
                })
            }
            .boxed_local()
        }
    }

    #[test]
    fn a_deleted_group_forgets_its_metadata_only_if_none_was_written_after_the_tombstone() {
        let record = |generation| {
            let mut cg = ClassicGroup::new(0, 0);
            cg.protocol_type = Some("consumer".into());
            cg.generation = generation;
            let value = Some(cg.to_value());
            (
                cg,
                CoordinatorRecord::Group {
                    group: "g".into(),
                    value,
                },
            )
        };
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        for meanwhile in ["nothing", "a rebalance", "two protocol changes"] {
            let log = Rc::new(HeldLog::default());
            let coordinator = RefCell::new(GroupCoordinator::default());
            coordinator.borrow_mut().start_loading(0);
            let g = match meanwhile {
                "two protocol changes" => {
                    group(0, GroupKind::Consumer(ConsumerGroup::new(2, "uniform", 0)))
                }
                _ => {
                    let (cg, persisted) = record(1);
                    let mut g = group(0, GroupKind::Classic(cg));
                    g.persisted = Some(persisted);
                    g
                }
            };
            coordinator.borrow_mut().groups.insert("g".into(), g);

            let mut delete = Box::pin(delete_group(&coordinator, 0, &log, "g", 0));
            assert!(std::future::Future::poll(delete.as_mut(), &mut cx).is_pending());
            assert!(
                coordinator.borrow().groups.contains_key("g"),
                "shown once durable"
            );
            {
                let mut c = coordinator.borrow_mut();
                let g = c.groups.get_mut("g").expect("present");
                match meanwhile {
                    // A member joined and left: generation 2 is persisted after the tombstone.
                    "a rebalance" => {
                        let (cg, persisted) = record(2);
                        g.kind = GroupKind::Classic(cg);
                        g.persisted = Some(persisted);
                    }
                    // Classic members came and went, then KIP-848 ones, whose epochs (written
                    // after the tombstone) climbed back to 2.
                    "two protocol changes" => {
                        g.convert(GroupKind::Classic(record(1).0));
                        g.convert(GroupKind::Consumer(ConsumerGroup::new(2, "uniform", 0)));
                    }
                    _ => {}
                }
            }
            log.waiting
                .borrow_mut()
                .remove(0)
                .send(())
                .expect("waiting");
            let done = std::future::Future::poll(delete.as_mut(), &mut cx);
            assert!(matches!(done, std::task::Poll::Ready(Ok(()))));
            let c = coordinator.borrow();
            match meanwhile {
                "nothing" => assert!(!c.groups.contains_key("g"), "deleted"),
                "a rebalance" => assert_eq!(c.groups["g"].persisted, Some(record(2).1)),
                _ => assert!(matches!(c.groups["g"].kind, GroupKind::Consumer(_))),
            }
        }
    }

    #[test]
    fn the_offset_written_later_wins_whatever_order_the_writes_are_confirmed_in() {
        let mut g = group(0, GroupKind::Classic(ClassicGroup::new(0, 0)));
        let key = || ("t".to_string(), 0);
        // Landed at 20, confirmed first; the write that landed at 10 is confirmed after.
        g.apply_offsets(vec![(key(), Some(offset(2)))], 20);
        g.apply_offsets(vec![(key(), Some(offset(1)))], 10);
        assert_eq!(g.offsets[&key()].commit_timestamp_ms, 2);
        // A deletion that landed later removes it; an older commit does not bring it back.
        g.apply_offsets(vec![(key(), None)], 30);
        g.apply_offsets(vec![(key(), Some(offset(1)))], 25);
        assert!(g.offsets.is_empty());
    }

    #[test]
    fn offsets_expire_after_retention() {
        let mut c = GroupCoordinator::default();
        c.partitions.insert(3, true);
        c.partitions.insert(4, true);
        c.loaded_epochs.insert(3, 0);
        c.loaded_epochs.insert(4, 0);
        // A standalone consumer's offsets: expire by commit time.
        let mut simple = group(3, GroupKind::Classic(ClassicGroup::new(0, 0)));
        simple.offsets.insert(("t".into(), 0), offset(1_000));
        simple.offsets.insert(("t".into(), 1), offset(5_000));
        c.groups.insert("simple".into(), simple);
        // An empty consumer group that emptied at 2_000: expire from then, whatever the
        // commit times.
        let mut empty = group(
            4,
            GroupKind::Consumer(ConsumerGroup::new(3, "uniform", 2_000)),
        );
        empty.offsets.insert(("t".into(), 0), offset(0));
        c.groups.insert("empty".into(), empty);

        assert!(c.expiries(3, 0, 10_000, 10_999).is_empty());
        assert!(c.expiries(4, 0, 10_000, 10_999).is_empty());
        // Not while a write of the group's offsets is in flight: its tombstone would land
        // after the pending value.
        let pending = || HashMap::from([(("t".to_string(), 0), 1)]);
        c.groups.get_mut("simple").expect("present").pending_offsets = pending();
        c.groups.get_mut("empty").expect("present").pending_offsets = pending();
        assert!(c.expiries(3, 0, 10_000, 12_000).is_empty());
        assert!(c.expiries(4, 0, 10_000, 12_000).is_empty());
        c.groups.get_mut("simple").expect("present").pending_offsets = HashMap::new();
        c.groups.get_mut("empty").expect("present").pending_offsets = HashMap::new();
        // Partition 0 of "simple" (committed at 1_000), and all of "empty", whose metadata
        // goes too.
        let simple = c.expiries(3, 0, 10_000, 12_000);
        assert_eq!(simple.len(), 1);
        assert_eq!(simple[0].offsets, vec![("t".to_string(), 0)]);
        assert!(simple[0].metadata.is_none());
        let empty = c.expiries(4, 0, 10_000, 12_000);
        assert_eq!(empty.len(), 1);
        assert_eq!(empty[0].offsets.len(), 1);
        assert!(matches!(
            empty[0].metadata,
            Some(CoordinatorRecord::ConsumerGroup { value: None, .. })
        ));
        // Nothing shows before the tombstones are durable (`write_expiries`).
        assert_eq!(c.groups["simple"].offsets.len(), 2);
        assert_eq!(c.groups["empty"].offsets.len(), 1);
        // Nor in a partition loaded in an earlier leader epoch, or still loading.
        assert!(c.expiries(3, 1, 10_000, 15_000).is_empty());
        c.partitions.insert(3, false);
        assert!(c.expiries(3, 0, 10_000, 15_000).is_empty());
    }

    #[test]
    fn partition_matches_kafka() {
        // Java: Math.abs("my-group".hashCode()) % 50 and friends, computed with the JDK.
        assert_eq!("my-group".encode_utf16().count(), 8);
        let java_hash = |s: &str| {
            s.encode_utf16()
                .fold(0i32, |h, u| h.wrapping_mul(31).wrapping_add(i32::from(u)))
        };
        assert_eq!(java_hash("hello"), 99_162_322);
        assert_eq!(partition_for("hello", 50), 99_162_322 % 50);
        assert_eq!(java_hash(""), 0);
        assert_eq!(partition_for("", 50), 0);
        // A negative hash: abs() first.
        let h = java_hash("polygenelubricants");
        assert_eq!(h, i32::MIN);
        assert_eq!(partition_for("polygenelubricants", 50), 0);
    }
}
