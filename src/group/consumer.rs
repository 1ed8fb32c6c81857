//! A KIP-848 consumer group (ConsumerGroupHeartbeat), with server-side assignors.
//!
//! The group epoch moves on whenever membership, a subscription or a subscribed topic's
//! partition count changes; the target assignment is then recomputed by the group's assignor
//! (`uniform` or `range`) and stamped with that epoch. Each member reconciles towards its
//! target on its own heartbeats, as Kafka's CurrentAssignmentBuilder does:
//! - partitions it holds that the target gives to someone else are revoked first; the member
//!   keeps its epoch until it reports (in `topic_partitions`) that it let them go;
//! - then it moves to the new epoch and gets the target's partitions that no other member
//!   still holds; the rest follow on later heartbeats, once their owners released them.
//!
//! So a partition is never owned by two members at once; members' states are persisted, so
//! this holds across a restart too. A member that does not revoke within
//! its rebalance timeout, or stops heartbeating for the session timeout, is removed.
//!
//! Sans-IO: time and the topic metadata come in as parameters.

use std::collections::{BTreeMap, BTreeSet};

use indexmap::IndexMap;
use uuid::Uuid;

use crate::errors::BrokerError;
use crate::group::codec::{
    ConsumerAssignmentValue, ConsumerMemberValue, CoordinatorRecord, TopicPartitionsValue,
};

/// Partitions by topic id.
pub type Assignment = BTreeMap<Uuid, BTreeSet<i32>>;

/// Subscribed topics as the metadata describes them: name -> (id, partition count).
pub type TopicsMeta = BTreeMap<String, (Uuid, i32)>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    Stable,
    /// Waiting for the member to release partitions the target gives to others.
    UnrevokedPartitions,
    /// At the target epoch, but some target partitions are still held by others.
    UnreleasedPartitions,
}

pub struct ConsumerMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topics: Vec<String>,
    /// A regular expression subscription (ConsumerGroupHeartbeat v1), in Kafka's RE2J syntax.
    pub subscribed_regex: Option<String>,
    pub server_assignor: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub epoch: i32,
    previous_epoch: i32,
    pub state: MemberState,
    /// What the member holds (as far as the coordinator has told it).
    pub assigned: Assignment,
    /// What it still has to give up.
    pending_revocation: Assignment,
    session_deadline_ms: i64,
    revocation_deadline_ms: i64,
    /// The assignment last sent, to send it again only when it changes.
    last_sent: Option<Assignment>,
}

/// A ConsumerGroupHeartbeat's fields.
#[derive(Debug, Clone)]
pub struct HeartbeatRequest {
    pub member_id: String,
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub subscribed_topics: Option<Vec<String>>,
    /// `Some("")` clears a regular expression subscription.
    pub subscribed_regex: Option<String>,
    pub server_assignor: Option<String>,
    pub owned: Option<Assignment>,
    pub client_id: String,
    pub client_host: String,
}

/// The heartbeat's answer; `assignment` is `None` when it did not change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatResult {
    pub member_id: String,
    pub member_epoch: i32,
    pub assignment: Option<Assignment>,
}

pub struct ConsumerGroup {
    pub epoch: i32,
    pub assignment_epoch: i32,
    pub members: IndexMap<String, ConsumerMember>,
    target: BTreeMap<String, Assignment>,
    /// The subscribed topics when the target was computed.
    topics: TopicsMeta,
    pub assignor: String,
    /// When the group last became empty (or was created), for offset expiry.
    pub state_timestamp_ms: i64,
    /// The topics each subscribed regular expression matched when last resolved. Like Kafka,
    /// which resolves them in the background, a new or changed resolution counts from the
    /// next heartbeat on (the group epoch moves when it changes).
    resolved_regexes: BTreeMap<String, BTreeSet<String>>,
}

/// Epoch a member sends to leave (dynamic) or to leave temporarily (static).
pub const LEAVE_EPOCH: i32 = -1;
pub const LEAVE_STATIC_EPOCH: i32 = -2;

impl ConsumerGroup {
    pub fn new(epoch: i32, assignor: &str, now_ms: i64) -> ConsumerGroup {
        ConsumerGroup {
            epoch,
            assignment_epoch: epoch,
            members: IndexMap::new(),
            target: BTreeMap::new(),
            topics: TopicsMeta::new(),
            assignor: assignor.to_string(),
            state_timestamp_ms: now_ms,
            resolved_regexes: BTreeMap::new(),
        }
    }

    /// Kafka's consumer group states: Empty, Assigning, Reconciling, Stable.
    pub fn state_name(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else if self.assignment_epoch < self.epoch {
            "Assigning"
        } else if self
            .members
            .values()
            .any(|m| m.epoch != self.assignment_epoch || m.state != MemberState::Stable)
        {
            "Reconciling"
        } else {
            "Stable"
        }
    }

    pub fn target_of(&self, member_id: &str) -> Assignment {
        self.target.get(member_id).cloned().unwrap_or_default()
    }

    /// The topics a member subscribes to, by name and through its regular expression.
    fn member_topics<'a>(&'a self, m: &'a ConsumerMember) -> impl Iterator<Item = &'a String> {
        let by_regex = m
            .subscribed_regex
            .as_ref()
            .and_then(|r| self.resolved_regexes.get(r))
            .into_iter()
            .flatten();
        m.subscribed_topics.iter().chain(by_regex)
    }

    /// Topics any member subscribes to.
    pub fn subscribed_topics(&self) -> BTreeSet<String> {
        self.members
            .values()
            .flat_map(|m| self.member_topics(m).cloned())
            .collect()
    }

    fn bump_epoch(&mut self) {
        self.epoch += 1;
    }

    /// One ConsumerGroupHeartbeat. `topics` describes every topic named in the group's
    /// subscriptions after this request (the caller resolves them against the metadata).
    pub fn heartbeat(
        &mut self,
        req: HeartbeatRequest,
        topics: impl Fn(&BTreeSet<String>) -> TopicsMeta,
        resolve_regex: impl Fn(&str) -> BTreeSet<String>,
        session_timeout_ms: i32,
        max_size: usize,
        now_ms: i64,
    ) -> Result<HeartbeatResult, BrokerError> {
        let session_deadline_ms = now_ms + i64::from(session_timeout_ms);
        match req.member_epoch {
            // Epoch 0 from a member the group already has is a heartbeat like any other (Kafka
            // accepts it only as a repeat of the member's first join).
            0 if !self.members.contains_key(&req.member_id) => {
                self.join(&req, max_size, session_deadline_ms)?
            }
            LEAVE_EPOCH | LEAVE_STATIC_EPOCH => {
                if self.members.shift_remove(&req.member_id).is_none() {
                    return Err(BrokerError::UnknownMemberId);
                }
                self.target.remove(&req.member_id);
                self.bump_epoch();
                if self.members.is_empty() {
                    self.state_timestamp_ms = now_ms;
                }
                return Ok(HeartbeatResult {
                    member_id: req.member_id,
                    member_epoch: req.member_epoch,
                    assignment: None,
                });
            }
            epoch => {
                let m = self
                    .members
                    .get_mut(&req.member_id)
                    .ok_or(BrokerError::UnknownMemberId)?;
                if epoch != m.epoch {
                    // The answer to the previous heartbeat may have been lost: accept the
                    // previous epoch if the member owns nothing it should not.
                    let lost_answer = epoch == m.previous_epoch
                        && req
                            .owned
                            .as_ref()
                            .is_some_and(|o| is_subset(o, &m.assigned));
                    if !lost_answer {
                        return Err(BrokerError::FencedMemberEpoch);
                    }
                }
                m.session_deadline_ms = session_deadline_ms;
                if req.rebalance_timeout_ms > 0 {
                    m.rebalance_timeout_ms = req.rebalance_timeout_ms;
                }
                if req.rack_id.is_some() {
                    m.rack_id = req.rack_id.clone();
                }
                if req.server_assignor.is_some() {
                    m.server_assignor = req.server_assignor.clone();
                }
                let mut changed = false;
                if let Some(subs) = &req.subscribed_topics {
                    let mut subs = subs.clone();
                    subs.sort();
                    subs.dedup();
                    if subs != m.subscribed_topics {
                        m.subscribed_topics = subs;
                        changed = true;
                    }
                }
                if let Some(regex) = &req.subscribed_regex {
                    let regex = (!regex.is_empty()).then(|| regex.clone());
                    if regex != m.subscribed_regex {
                        m.subscribed_regex = regex;
                        changed = true;
                    }
                }
                if changed {
                    self.bump_epoch();
                }
            }
        }
        // A subscribed topic appeared, vanished or grew: the target must be recomputed.
        let meta = topics(&self.subscribed_topics());
        if meta != self.topics {
            self.topics = meta;
            if self.assignment_epoch == self.epoch {
                self.bump_epoch();
            }
        }
        if self.assignment_epoch < self.epoch {
            self.compute_target();
        }
        let owned = req.owned.clone();
        self.reconcile(&req.member_id, owned.as_ref(), now_ms);
        let m = self.members.get_mut(&req.member_id).expect("member exists");
        // Send the assignment when it changed, and again when the member's view differs from
        // it (an answer was lost, or it joined).
        let resend = req.member_epoch != m.epoch
            || req.member_epoch == 0
            || owned.as_ref().is_some_and(|o| *o != m.assigned);
        let assignment = if m.last_sent.as_ref() != Some(&m.assigned) || resend {
            m.last_sent = Some(m.assigned.clone());
            Some(m.assigned.clone())
        } else {
            None
        };
        let result = HeartbeatResult {
            member_id: m.member_id.clone(),
            member_epoch: m.epoch,
            assignment,
        };
        self.refresh_regexes(resolve_regex);
        Ok(result)
    }

    /// Resolves the members' regular expressions again; a changed resolution moves the
    /// group epoch, so the next heartbeat recomputes the target assignment.
    fn refresh_regexes(&mut self, resolve: impl Fn(&str) -> BTreeSet<String>) {
        let regexes: BTreeSet<String> = self
            .members
            .values()
            .filter_map(|m| m.subscribed_regex.clone())
            .collect();
        let resolved: BTreeMap<String, BTreeSet<String>> = regexes
            .into_iter()
            .map(|r| {
                let topics = resolve(&r);
                (r, topics)
            })
            .collect();
        if resolved != self.resolved_regexes {
            self.resolved_regexes = resolved;
            if self.assignment_epoch == self.epoch {
                self.bump_epoch();
            }
        }
    }

    fn join(
        &mut self,
        req: &HeartbeatRequest,
        max_size: usize,
        session_deadline_ms: i64,
    ) -> Result<(), BrokerError> {
        let mut subscribed = req.subscribed_topics.clone().unwrap_or_default();
        subscribed.sort();
        subscribed.dedup();
        let member = ConsumerMember {
            member_id: req.member_id.clone(),
            instance_id: req.instance_id.clone(),
            rack_id: req.rack_id.clone(),
            client_id: req.client_id.clone(),
            client_host: req.client_host.clone(),
            subscribed_topics: subscribed,
            subscribed_regex: req.subscribed_regex.clone().filter(|r| !r.is_empty()),
            server_assignor: req.server_assignor.clone(),
            rebalance_timeout_ms: req.rebalance_timeout_ms,
            epoch: 0,
            previous_epoch: -1,
            state: MemberState::Stable,
            assigned: Assignment::new(),
            pending_revocation: Assignment::new(),
            session_deadline_ms,
            revocation_deadline_ms: 0,
            last_sent: None,
        };
        if let Some(instance) = &req.instance_id {
            let holder = self
                .members
                .values()
                .find(|m| m.instance_id.as_deref() == Some(instance))
                .map(|m| m.member_id.clone());
            if let Some(old) = holder.filter(|old| *old != req.member_id) {
                // KIP-848 static membership: a restarted static member takes over the old
                // member's assignment; the old one must have left with epoch -2 first.
                return Err(BrokerError::UnreleasedInstanceId(format!(
                    "Static member {old} with instance id {instance} is still active in the group."
                )));
            }
        }
        // A member that rejoins with epoch 0 gives up what it had.
        let rejoining = self.members.shift_remove(&req.member_id).is_some();
        if !rejoining && self.members.len() >= max_size {
            return Err(BrokerError::GroupMaxSizeReached);
        }
        self.members.insert(req.member_id.clone(), member);
        self.bump_epoch();
        Ok(())
    }

    /// Moves `member_id` towards its target (see the module docs).
    fn reconcile(&mut self, member_id: &str, owned: Option<&Assignment>, now_ms: i64) {
        let target = self.target_of(member_id);
        let held_by_others = self.held_by_others(member_id);
        let assignment_epoch = self.assignment_epoch;
        let m = self.members.get_mut(member_id).expect("member exists");
        if m.state == MemberState::UnrevokedPartitions {
            let released = owned.is_some_and(|o| intersect(o, &m.pending_revocation).is_empty());
            if !released {
                return;
            }
            m.pending_revocation.clear();
            m.state = MemberState::Stable;
        }
        if m.epoch < assignment_epoch || m.state == MemberState::UnreleasedPartitions {
            let revoke = difference(&m.assigned, &target);
            if !revoke.is_empty() {
                m.assigned = intersect(&m.assigned, &target);
                m.pending_revocation = revoke;
                m.state = MemberState::UnrevokedPartitions;
                m.revocation_deadline_ms = now_ms + i64::from(m.rebalance_timeout_ms.max(0));
                return;
            }
            if m.epoch != assignment_epoch {
                m.previous_epoch = m.epoch;
                m.epoch = assignment_epoch;
            }
            m.assigned = difference(&target, &held_by_others);
            m.state = if m.assigned == target {
                MemberState::Stable
            } else {
                MemberState::UnreleasedPartitions
            };
        }
    }

    fn held_by_others(&self, member_id: &str) -> Assignment {
        let mut held = Assignment::new();
        for m in self.members.values().filter(|m| m.member_id != member_id) {
            for (t, ps) in m.assigned.iter().chain(m.pending_revocation.iter()) {
                held.entry(*t).or_default().extend(ps);
            }
        }
        held
    }

    fn compute_target(&mut self) {
        let assignor = self
            .members
            .values()
            .find_map(|m| m.server_assignor.clone())
            .unwrap_or_else(|| self.assignor.clone());
        let subs: Vec<(String, Vec<Uuid>, Assignment)> = self
            .members
            .values()
            .map(|m| {
                let ids = self
                    .member_topics(m)
                    .filter_map(|t| self.topics.get(t).map(|(id, _)| *id))
                    .collect();
                (m.member_id.clone(), ids, self.target_of(&m.member_id))
            })
            .collect();
        let partitions: BTreeMap<Uuid, i32> =
            self.topics.values().map(|(id, n)| (*id, *n)).collect();
        self.target = if assignor == "range" {
            assign_range(&subs, &partitions)
        } else {
            assign_uniform(&subs, &partitions)
        };
        self.assignor = assignor;
        self.assignment_epoch = self.epoch;
    }

    /// The records that persist a member (tombstones once it is gone): its metadata and its
    /// reconciliation state, so a restarted coordinator knows who owns what.
    pub fn member_records(&self, group_id: &str, member_id: &str) -> Vec<CoordinatorRecord> {
        let (meta, assignment) = match self.members.get(member_id) {
            Some(m) => {
                let (meta, assignment) = member_values(m);
                (Some(meta), Some(assignment))
            }
            None => (None, None),
        };
        vec![
            CoordinatorRecord::ConsumerMember {
                group: group_id.to_string(),
                member: member_id.to_string(),
                value: meta,
            },
            CoordinatorRecord::ConsumerAssignment {
                group: group_id.to_string(),
                member: member_id.to_string(),
                value: assignment,
            },
        ]
    }

    /// What `member_records` would write for a member now (to see whether it changed).
    pub fn member_state(
        &self,
        member_id: &str,
    ) -> Option<(ConsumerMemberValue, ConsumerAssignmentValue)> {
        self.members.get(member_id).map(member_values)
    }

    /// Replay: a member's metadata record (`None`: the member left).
    pub fn restore_member(
        &mut self,
        member_id: &str,
        value: Option<ConsumerMemberValue>,
        session_timeout_ms: i32,
        now_ms: i64,
    ) {
        let Some(v) = value else {
            self.members.shift_remove(member_id);
            return;
        };
        let restored = ConsumerMember {
            member_id: member_id.to_string(),
            instance_id: v.instance_id,
            rack_id: v.rack_id,
            client_id: v.client_id,
            client_host: v.client_host,
            subscribed_topics: v.subscribed_topics,
            subscribed_regex: v.subscribed_regex,
            server_assignor: v.server_assignor,
            rebalance_timeout_ms: v.rebalance_timeout_ms,
            epoch: 0,
            previous_epoch: -1,
            state: MemberState::Stable,
            assigned: Assignment::new(),
            pending_revocation: Assignment::new(),
            session_deadline_ms: now_ms + i64::from(session_timeout_ms),
            revocation_deadline_ms: now_ms + i64::from(v.rebalance_timeout_ms.max(0)),
            last_sent: None,
        };
        match self.members.get_mut(member_id) {
            Some(m) => {
                let (epoch, previous, state) = (m.epoch, m.previous_epoch, m.state);
                let (assigned, pending) = (m.assigned.clone(), m.pending_revocation.clone());
                *m = restored;
                (m.epoch, m.previous_epoch, m.state) = (epoch, previous, state);
                (m.assigned, m.pending_revocation) = (assigned, pending);
            }
            None => {
                self.members.insert(member_id.to_string(), restored);
            }
        }
    }

    /// Replay: a member's reconciliation state.
    pub fn restore_assignment(&mut self, member_id: &str, v: ConsumerAssignmentValue) {
        let Some(m) = self.members.get_mut(member_id) else {
            return;
        };
        m.epoch = v.epoch;
        m.previous_epoch = v.previous_epoch;
        m.state = match v.state {
            1 => MemberState::UnrevokedPartitions,
            2 => MemberState::UnreleasedPartitions,
            _ => MemberState::Stable,
        };
        m.assigned = from_value(&v.assigned);
        m.pending_revocation = from_value(&v.pending_revocation);
        m.last_sent = Some(m.assigned.clone());
    }

    /// After a replay: the members' current partitions stand in for the target, so the
    /// next computation keeps them where they are whenever the balance allows.
    pub fn finish_restore(&mut self) {
        self.target = self
            .members
            .values()
            .map(|m| (m.member_id.clone(), m.assigned.clone()))
            .collect();
        self.assignment_epoch = self.epoch;
    }

    /// Removes members whose session lapsed or who did not revoke in time; returns them.
    pub fn tick(&mut self, now_ms: i64) -> Vec<String> {
        let gone: Vec<String> = self
            .members
            .values()
            .filter(|m| {
                m.session_deadline_ms <= now_ms
                    || (m.state == MemberState::UnrevokedPartitions
                        && m.revocation_deadline_ms <= now_ms)
            })
            .map(|m| m.member_id.clone())
            .collect();
        for id in &gone {
            tracing::info!(member = %id, "consumer group member fenced (session or rebalance timeout)");
            self.members.shift_remove(id);
            self.target.remove(id);
        }
        if !gone.is_empty() {
            self.bump_epoch();
            if self.members.is_empty() {
                self.state_timestamp_ms = now_ms;
            }
        }
        gone
    }

    /// OffsetCommit/OffsetFetch from a member: it must exist and have the current epoch.
    pub fn check_member_epoch(&self, member_id: &str, epoch: i32) -> Result<(), BrokerError> {
        let m = self
            .members
            .get(member_id)
            .ok_or(BrokerError::UnknownMemberId)?;
        if epoch != m.epoch {
            return Err(BrokerError::StaleMemberEpoch);
        }
        Ok(())
    }
}

fn member_values(m: &ConsumerMember) -> (ConsumerMemberValue, ConsumerAssignmentValue) {
    let meta = ConsumerMemberValue {
        instance_id: m.instance_id.clone(),
        rack_id: m.rack_id.clone(),
        client_id: m.client_id.clone(),
        client_host: m.client_host.clone(),
        subscribed_topics: m.subscribed_topics.clone(),
        subscribed_regex: m.subscribed_regex.clone(),
        rebalance_timeout_ms: m.rebalance_timeout_ms,
        server_assignor: m.server_assignor.clone(),
    };
    let assignment = ConsumerAssignmentValue {
        epoch: m.epoch,
        previous_epoch: m.previous_epoch,
        state: match m.state {
            MemberState::Stable => 0,
            MemberState::UnrevokedPartitions => 1,
            MemberState::UnreleasedPartitions => 2,
        },
        assigned: to_value(&m.assigned),
        pending_revocation: to_value(&m.pending_revocation),
    };
    (meta, assignment)
}

fn to_value(a: &Assignment) -> TopicPartitionsValue {
    a.iter()
        .map(|(t, ps)| (*t, ps.iter().copied().collect()))
        .collect()
}

fn from_value(v: &TopicPartitionsValue) -> Assignment {
    let mut a = Assignment::new();
    for (t, ps) in v {
        if !ps.is_empty() {
            a.entry(*t).or_default().extend(ps.iter().copied());
        }
    }
    a
}

fn is_subset(a: &Assignment, b: &Assignment) -> bool {
    a.iter()
        .all(|(t, ps)| ps.is_empty() || b.get(t).is_some_and(|bs| ps.is_subset(bs)))
}

fn intersect(a: &Assignment, b: &Assignment) -> Assignment {
    let mut out = Assignment::new();
    for (t, ps) in a {
        if let Some(bs) = b.get(t) {
            let both: BTreeSet<i32> = ps.intersection(bs).copied().collect();
            if !both.is_empty() {
                out.insert(*t, both);
            }
        }
    }
    out
}

fn difference(a: &Assignment, b: &Assignment) -> Assignment {
    let mut out = Assignment::new();
    for (t, ps) in a {
        let rest: BTreeSet<i32> = match b.get(t) {
            Some(bs) => ps.difference(bs).copied().collect(),
            None => ps.clone(),
        };
        if !rest.is_empty() {
            out.insert(*t, rest);
        }
    }
    out
}

/// The `uniform` assignor: every partition goes to a member subscribed to its topic, with
/// partition counts as even as the subscriptions allow, and a partition stays with its
/// current target owner whenever that keeps the balance.
fn assign_uniform(
    members: &[(String, Vec<Uuid>, Assignment)],
    partitions: &BTreeMap<Uuid, i32>,
) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> = members
        .iter()
        .map(|(id, _, _)| (id.clone(), Assignment::new()))
        .collect();
    let subscribers = |topic: &Uuid| -> Vec<&String> {
        members
            .iter()
            .filter(|(_, subs, _)| subs.contains(topic))
            .map(|(id, _, _)| id)
            .collect()
    };
    let total = |a: &Assignment| a.values().map(BTreeSet::len).sum::<usize>();
    // Keep what each member had, if it still subscribes and the partition still exists.
    let mut taken: BTreeSet<(Uuid, i32)> = BTreeSet::new();
    for (id, subs, previous) in members {
        for (t, ps) in previous {
            let Some(&count) = partitions.get(t) else {
                continue;
            };
            if !subs.contains(t) {
                continue;
            }
            for &p in ps {
                if p < count && taken.insert((*t, p)) {
                    out.get_mut(id)
                        .expect("member")
                        .entry(*t)
                        .or_default()
                        .insert(p);
                }
            }
        }
    }
    // Give each unassigned partition to the least loaded subscriber.
    for (t, &count) in partitions {
        let subs = subscribers(t);
        if subs.is_empty() {
            continue;
        }
        for p in 0..count {
            if taken.contains(&(*t, p)) {
                continue;
            }
            let id = subs
                .iter()
                .min_by_key(|id| (total(&out[**id]), **id))
                .expect("a subscriber");
            out.get_mut(*id)
                .expect("member")
                .entry(*t)
                .or_default()
                .insert(p);
            taken.insert((*t, p));
        }
    }
    // Move partitions from the most to the least loaded member that may take them, until no
    // move makes the counts more even. Each move lowers the spread, so this ends.
    let moves_max = taken.len() * members.len().max(1);
    for _ in 0..moves_max {
        let mut best: Option<(String, String, Uuid, i32)> = None;
        let mut best_gap = 1usize;
        for (from, _, _) in members {
            for (to, to_subs, _) in members {
                let gap = total(&out[from]).saturating_sub(total(&out[to]));
                if gap <= best_gap {
                    continue;
                }
                let candidate = out[from]
                    .iter()
                    .filter(|(t, _)| to_subs.contains(t))
                    .find_map(|(t, ps)| ps.iter().next_back().map(|p| (*t, *p)));
                if let Some((t, p)) = candidate {
                    best_gap = gap;
                    best = Some((from.clone(), to.clone(), t, p));
                }
            }
        }
        let Some((from, to, t, p)) = best else {
            break;
        };
        let from_parts = out.get_mut(&from).expect("member");
        let set = from_parts.get_mut(&t).expect("topic");
        set.remove(&p);
        if set.is_empty() {
            from_parts.remove(&t);
        }
        out.get_mut(&to)
            .expect("member")
            .entry(t)
            .or_default()
            .insert(p);
    }
    out
}

/// The `range` assignor: per topic, its subscribers (by member id) get consecutive ranges of
/// partitions, the first ones one more when the count does not divide evenly.
fn assign_range(
    members: &[(String, Vec<Uuid>, Assignment)],
    partitions: &BTreeMap<Uuid, i32>,
) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> = members
        .iter()
        .map(|(id, _, _)| (id.clone(), Assignment::new()))
        .collect();
    for (t, &count) in partitions {
        let mut subs: Vec<&String> = members
            .iter()
            .filter(|(_, s, _)| s.contains(t))
            .map(|(id, _, _)| id)
            .collect();
        if subs.is_empty() {
            continue;
        }
        subs.sort();
        let n = subs.len() as i32;
        let (base, extra) = (count / n, count % n);
        let mut next = 0;
        for (i, id) in subs.into_iter().enumerate() {
            let take = base + i32::from((i as i32) < extra);
            if take > 0 {
                out.get_mut(id)
                    .expect("member")
                    .insert(*t, (next..next + take).collect());
            }
            next += take;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(member: &str, epoch: i32, owned: Option<Assignment>) -> HeartbeatRequest {
        HeartbeatRequest {
            member_id: member.into(),
            member_epoch: epoch,
            instance_id: None,
            rack_id: None,
            rebalance_timeout_ms: 30_000,
            subscribed_topics: (epoch == 0).then(|| vec!["t".to_string()]),
            subscribed_regex: None,
            server_assignor: None,
            owned,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
        }
    }

    /// One heartbeat with a 45 s session, no regular expressions and room for 100 members.
    fn beat(
        g: &mut ConsumerGroup,
        r: HeartbeatRequest,
        meta: impl Fn(&BTreeSet<String>) -> TopicsMeta,
        now_ms: i64,
    ) -> Result<HeartbeatResult, BrokerError> {
        g.heartbeat(r, meta, |_| BTreeSet::new(), 45_000, 100, now_ms)
    }

    fn count(a: &Assignment) -> usize {
        a.values().map(BTreeSet::len).sum()
    }

    #[test]
    fn partitions_move_only_after_revocation() {
        let topic = Uuid::from_u128(7);
        let meta = move |_: &BTreeSet<String>| TopicsMeta::from([("t".to_string(), (topic, 12))]);
        let mut g = ConsumerGroup::new(0, "uniform", 0);
        let a = beat(&mut g, req("a", 0, Some(Assignment::new())), meta, 0).unwrap();
        assert_eq!(count(a.assignment.as_ref().unwrap()), 12);
        let a_owned = a.assignment.clone().unwrap();
        // b joins: it gets nothing until a has released half.
        let b = beat(&mut g, req("b", 0, Some(Assignment::new())), meta, 1).unwrap();
        assert_eq!(count(b.assignment.as_ref().unwrap()), 0);
        assert!(b.member_epoch > a.member_epoch);
        // a is told to keep 6 (revoke 6), still at its old epoch.
        let a2 = beat(
            &mut g,
            req("a", a.member_epoch, Some(a_owned.clone())),
            meta,
            2,
        )
        .unwrap();
        assert_eq!(a2.member_epoch, a.member_epoch);
        let kept = a2.assignment.clone().unwrap();
        assert_eq!(count(&kept), 6);
        // b still gets nothing while a owns them.
        let b2 = beat(
            &mut g,
            req("b", b.member_epoch, Some(Assignment::new())),
            meta,
            3,
        )
        .unwrap();
        assert!(b2.assignment.is_none() || count(b2.assignment.as_ref().unwrap()) == 0);
        // a reports it released them and moves to the new epoch.
        let a3 = beat(
            &mut g,
            req("a", a2.member_epoch, Some(kept.clone())),
            meta,
            4,
        )
        .unwrap();
        assert_eq!(a3.member_epoch, b.member_epoch);
        let b3 = beat(
            &mut g,
            req("b", b.member_epoch, Some(Assignment::new())),
            meta,
            5,
        )
        .unwrap();
        let b_assigned = b3.assignment.unwrap();
        assert_eq!(count(&b_assigned), 6);
        assert!(intersect(&b_assigned, &kept).is_empty());
        assert_eq!(g.state_name(), "Stable");
    }

    #[test]
    fn members_survive_a_replay_mid_revocation() {
        let topic = Uuid::from_u128(7);
        let meta = move |_: &BTreeSet<String>| TopicsMeta::from([("t".to_string(), (topic, 6))]);
        let mut g = ConsumerGroup::new(0, "uniform", 0);
        let a = beat(&mut g, req("a", 0, Some(Assignment::new())), meta, 0).unwrap();
        let b = beat(&mut g, req("b", 0, Some(Assignment::new())), meta, 1).unwrap();
        // a is asked to give up half but has not yet: partitions pending revocation.
        let owned = a.assignment.clone();
        let a2 = beat(&mut g, req("a", a.member_epoch, owned.clone()), meta, 2).unwrap();
        assert_eq!(g.members["a"].state, MemberState::UnrevokedPartitions);
        // Write both members' records, read them back into a fresh group.
        let mut restored = ConsumerGroup::new(g.epoch, "uniform", 10);
        for id in ["a", "b"] {
            for r in g.member_records("grp", id) {
                let (k, v) = r.encode();
                match CoordinatorRecord::decode(&k, v.as_deref()).unwrap() {
                    CoordinatorRecord::ConsumerMember { value, .. } => {
                        restored.restore_member(id, value, 45_000, 10)
                    }
                    CoordinatorRecord::ConsumerAssignment { value: Some(v), .. } => {
                        restored.restore_assignment(id, v)
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        restored.finish_restore();
        assert_eq!(restored.members["a"].assigned, g.members["a"].assigned);
        assert_eq!(
            restored.members["a"].state,
            MemberState::UnrevokedPartitions
        );
        // b still gets nothing a holds; a carries on with its epoch, not fenced.
        let b2 = beat(
            &mut restored,
            req("b", b.member_epoch, Some(Assignment::new())),
            meta,
            11,
        )
        .unwrap();
        assert!(b2.assignment.is_none_or(|x| count(&x) == 0));
        let kept = a2.assignment.clone().unwrap();
        let a3 = beat(
            &mut restored,
            req("a", a2.member_epoch, Some(kept)),
            meta,
            12,
        )
        .unwrap();
        assert!(a3.member_epoch >= b.member_epoch);
    }

    #[test]
    fn fenced_and_unknown_members() {
        let topic = Uuid::from_u128(1);
        let meta = move |_: &BTreeSet<String>| TopicsMeta::from([("t".to_string(), (topic, 3))]);
        let mut g = ConsumerGroup::new(0, "uniform", 0);
        let a = beat(&mut g, req("a", 0, Some(Assignment::new())), meta, 0).unwrap();
        assert_eq!(
            beat(&mut g, req("a", a.member_epoch + 5, None), meta, 1),
            Err(BrokerError::FencedMemberEpoch)
        );
        assert_eq!(
            beat(&mut g, req("zz", 3, None), meta, 1),
            Err(BrokerError::UnknownMemberId)
        );
        // Session expiry removes the member and moves the epoch.
        let before = g.epoch;
        assert_eq!(g.tick(45_001), vec!["a".to_string()]);
        assert!(g.members.is_empty());
        assert!(g.epoch > before);
    }

    #[test]
    fn range_and_uniform_cover_every_partition_once() {
        let t1 = Uuid::from_u128(1);
        let t2 = Uuid::from_u128(2);
        let parts = BTreeMap::from([(t1, 7), (t2, 5)]);
        let members = vec![
            ("m1".to_string(), vec![t1, t2], Assignment::new()),
            ("m2".to_string(), vec![t1], Assignment::new()),
            ("m3".to_string(), vec![t1, t2], Assignment::new()),
        ];
        for out in [
            assign_range(&members, &parts),
            assign_uniform(&members, &parts),
        ] {
            let mut seen = BTreeSet::new();
            for a in out.values() {
                for (t, ps) in a {
                    for p in ps {
                        assert!(seen.insert((*t, *p)), "assigned twice");
                    }
                }
            }
            assert_eq!(seen.len(), 12);
            assert!(!out["m2"].contains_key(&t2), "m2 is not subscribed to t2");
        }
        let uniform = assign_uniform(&members, &parts);
        let counts: Vec<usize> = uniform.values().map(count).collect();
        assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1);
    }
}
