//! A classic consumer group (JoinGroup / SyncGroup / Heartbeat / LeaveGroup), as Kafka 4.1's
//! group coordinator runs it.
//!
//! States: Empty -> PreparingRebalance -> CompletingRebalance -> Stable, and back to
//! PreparingRebalance whenever membership or a member's protocols change. A rebalance waits
//! for every known member to send JoinGroup, at most the longest rebalance timeout of the
//! members (those that did not rejoin are removed); a new group first waits
//! `group.initial.rebalance.delay.ms` for more members (Kafka's InitialDelayedJoin). The
//! leader's SyncGroup carries everyone's assignment; if it never comes, the members that did
//! not sync are removed after the rebalance timeout. A member whose heartbeats stop for its
//! session timeout is removed, unless it is waiting in a JoinGroup or SyncGroup.
//!
//! Sans-IO: time comes in as `now_ms`; answers to waiting JoinGroup/SyncGroup requests are
//! returned as `Effects` for the coordinator to deliver once the group's state is durable.

use std::collections::{BTreeSet, HashMap};

use bytes::Bytes;
use futures::channel::oneshot;
use indexmap::IndexMap;

use crate::config::GroupConfig;
use crate::errors::BrokerError;
use crate::group::codec::{GroupValue, MemberValue};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClassicState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl ClassicState {
    /// The name Kafka uses in DescribeGroups and ListGroups.
    pub fn name(self) -> &'static str {
        match self {
            ClassicState::Empty => "Empty",
            ClassicState::PreparingRebalance => "PreparingRebalance",
            ClassicState::CompletingRebalance => "CompletingRebalance",
            ClassicState::Stable => "Stable",
        }
    }
}

/// The answer to a JoinGroup.
#[derive(Debug, Clone, Default)]
pub struct JoinResult {
    pub error: Option<BrokerError>,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// The leader's view of the members (id, instance id, metadata); empty for followers.
    pub members: Vec<(String, Option<String>, Bytes)>,
    pub skip_assignment: bool,
}

impl JoinResult {
    pub fn error(e: BrokerError, member_id: &str) -> JoinResult {
        JoinResult {
            error: Some(e),
            generation: -1,
            member_id: member_id.to_string(),
            ..JoinResult::default()
        }
    }
}

/// The answer to a SyncGroup: protocol type and name, and the member's assignment.
pub type SyncResult = Result<(Option<String>, Option<String>, Bytes), BrokerError>;

/// A JoinGroup request's member fields.
#[derive(Debug, Clone)]
pub struct JoinRequest {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+: a member without an id first gets MEMBER_ID_REQUIRED (KIP-394).
    pub require_known_member_id: bool,
    /// JoinGroup v9+: a static leader that rejoins may skip the assignment (KIP-814).
    pub supports_skip_assignment: bool,
}

/// Answers for waiting requests, to send once the group's state is durable; `persist` says
/// that the group's metadata changed and must be written first.
#[derive(Default)]
pub struct Effects {
    pub joins: Vec<(oneshot::Sender<JoinResult>, JoinResult)>,
    pub syncs: Vec<(oneshot::Sender<SyncResult>, SyncResult)>,
    pub persist: bool,
}

impl Effects {
    fn join(&mut self, tx: Option<oneshot::Sender<JoinResult>>, r: JoinResult) {
        if let Some(tx) = tx {
            self.joins.push((tx, r));
        }
    }

    fn sync(&mut self, tx: Option<oneshot::Sender<SyncResult>>, r: SyncResult) {
        if let Some(tx) = tx {
            self.syncs.push((tx, r));
        }
    }
}

pub struct Member {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocols: Vec<(String, Bytes)>,
    pub assignment: Bytes,
    awaiting_join: Option<oneshot::Sender<JoinResult>>,
    join_skip_assignment: bool,
    awaiting_sync: Option<oneshot::Sender<SyncResult>>,
    /// Sent SyncGroup in the current generation.
    synced: bool,
    /// When the session expires without another heartbeat.
    session_deadline_ms: i64,
}

impl Member {
    fn metadata_for(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(n, _)| n == protocol)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }

    fn same_protocols(&self, protocols: &[(String, Bytes)]) -> bool {
        self.protocols == protocols
    }
}

pub struct ClassicGroup {
    pub state: ClassicState,
    /// When the group entered its state (Kafka's currentStateTimestamp), for offset expiry.
    pub state_timestamp_ms: i64,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub generation: i32,
    pub leader: Option<String>,
    /// In join order: the first member becomes the leader.
    pub members: IndexMap<String, Member>,
    /// Member ids handed out with MEMBER_ID_REQUIRED, with when they lapse.
    pending: HashMap<String, i64>,
    /// group.instance.id -> member id.
    statics: HashMap<String, String>,
    /// PreparingRebalance: when the join phase ends. CompletingRebalance: when members that
    /// have not synced are removed.
    deadline_ms: i64,
    /// InitialDelayedJoin: how much longer the first rebalance may still be extended, and
    /// whether a member joined during the current delay.
    initial_delay: Option<(i64, bool)>,
    /// `group.initial.rebalance.delay.ms`.
    initial_delay_ms: i64,
}

impl ClassicGroup {
    pub fn new(now_ms: i64, initial_delay_ms: i64) -> ClassicGroup {
        ClassicGroup {
            state: ClassicState::Empty,
            state_timestamp_ms: now_ms,
            protocol_type: None,
            protocol: None,
            generation: 0,
            leader: None,
            members: IndexMap::new(),
            pending: HashMap::new(),
            statics: HashMap::new(),
            deadline_ms: 0,
            initial_delay: None,
            initial_delay_ms,
        }
    }

    /// Restores a group from its last `GroupMetadataValue`: members keep their assignments
    /// and get a fresh session.
    pub fn from_value(v: GroupValue, now_ms: i64, initial_delay_ms: i64) -> ClassicGroup {
        let mut g = ClassicGroup::new(now_ms, initial_delay_ms);
        g.protocol_type = (!v.protocol_type.is_empty()).then_some(v.protocol_type);
        g.protocol = v.protocol;
        g.generation = v.generation;
        g.leader = v.leader;
        if v.state_timestamp_ms >= 0 {
            g.state_timestamp_ms = v.state_timestamp_ms;
        }
        for m in v.members {
            let protocols = match &g.protocol {
                Some(p) => vec![(p.clone(), m.subscription.clone())],
                None => Vec::new(),
            };
            if let Some(i) = &m.instance_id {
                g.statics.insert(i.clone(), m.member_id.clone());
            }
            g.members.insert(
                m.member_id.clone(),
                Member {
                    session_deadline_ms: now_ms + i64::from(m.session_timeout_ms),
                    member_id: m.member_id,
                    instance_id: m.instance_id,
                    client_id: m.client_id,
                    client_host: m.client_host,
                    session_timeout_ms: m.session_timeout_ms,
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    protocols,
                    assignment: m.assignment,
                    awaiting_join: None,
                    join_skip_assignment: false,
                    awaiting_sync: None,
                    synced: true,
                },
            );
        }
        g.state = if g.members.is_empty() {
            ClassicState::Empty
        } else {
            ClassicState::Stable
        };
        g
    }

    /// The record to persist for this group.
    pub fn to_value(&self) -> GroupValue {
        let protocol = self.protocol.clone();
        GroupValue {
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            generation: self.generation,
            protocol: protocol.clone(),
            leader: self.leader.clone(),
            state_timestamp_ms: self.state_timestamp_ms,
            members: self
                .members
                .values()
                .map(|m| MemberValue {
                    member_id: m.member_id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    session_timeout_ms: m.session_timeout_ms,
                    subscription: protocol
                        .as_deref()
                        .map(|p| m.metadata_for(p))
                        .unwrap_or_default(),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty() && self.pending.is_empty()
    }

    fn transition(&mut self, state: ClassicState, now_ms: i64) {
        self.state = state;
        self.state_timestamp_ms = now_ms;
    }

    /// Kafka's `supportsProtocols`: the first member sets the protocol type; later members
    /// must share it and at least one protocol with every member.
    fn supports(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        if self.members.is_empty() {
            return !protocol_type.is_empty() && !protocols.is_empty();
        }
        self.protocol_type.as_deref() == Some(protocol_type)
            && protocols
                .iter()
                .any(|(name, _)| self.candidate_protocols().contains(name))
    }

    fn candidate_protocols(&self) -> BTreeSet<String> {
        let mut iter = self.members.values();
        let Some(first) = iter.next() else {
            return BTreeSet::new();
        };
        let mut set: BTreeSet<String> = first.protocols.iter().map(|(n, _)| n.clone()).collect();
        for m in iter {
            set.retain(|n| m.protocols.iter().any(|(p, _)| p == n));
        }
        set
    }

    /// The protocol most members prefer among those all members support (Kafka's vote).
    fn select_protocol(&self) -> Option<String> {
        let candidates = self.candidate_protocols();
        let mut votes: IndexMap<String, usize> = IndexMap::new();
        for m in self.members.values() {
            if let Some((name, _)) = m.protocols.iter().find(|(n, _)| candidates.contains(n)) {
                *votes.entry(name.clone()).or_default() += 1;
            }
        }
        let max = votes.values().copied().max()?;
        votes.into_iter().find(|(_, v)| *v == max).map(|(n, _)| n)
    }

    fn max_rebalance_timeout_ms(&self) -> i64 {
        self.members
            .values()
            .map(|m| i64::from(m.rebalance_timeout_ms))
            .max()
            .unwrap_or(0)
    }

    fn check_member(&self, member_id: &str, instance_id: Option<&str>) -> Result<(), BrokerError> {
        // Kafka's validateMember: an instance id held by another member id is fenced; one
        // that nobody holds (the member was removed) is unknown, so the client rejoins.
        if let Some(instance) = instance_id {
            match self.statics.get(instance) {
                Some(id) if id != member_id => return Err(BrokerError::FencedInstanceId),
                Some(_) => {}
                None => return Err(BrokerError::UnknownMemberId),
            }
        }
        if !self.members.contains_key(member_id) {
            return Err(BrokerError::UnknownMemberId);
        }
        Ok(())
    }

    /// JoinGroup. The answer goes to `tx`: through `fx` at once, or when the join phase of
    /// the rebalance completes.
    pub fn join(
        &mut self,
        req: JoinRequest,
        tx: oneshot::Sender<JoinResult>,
        cfg: &GroupConfig,
        new_member_id: impl FnOnce() -> String,
        now_ms: i64,
        fx: &mut Effects,
    ) {
        let answer = |fx: &mut Effects, tx, r| fx.join(Some(tx), r);
        if req.session_timeout_ms < cfg.min_session_timeout_ms
            || req.session_timeout_ms > cfg.max_session_timeout_ms
        {
            return answer(
                fx,
                tx,
                JoinResult::error(BrokerError::InvalidSessionTimeout, &req.member_id),
            );
        }
        let unknown = req.member_id.is_empty();
        if !unknown
            && !self.members.contains_key(&req.member_id)
            && !self.pending.contains_key(&req.member_id)
        {
            let e = match req.instance_id.as_ref().and_then(|i| self.statics.get(i)) {
                Some(_) => BrokerError::FencedInstanceId,
                None => BrokerError::UnknownMemberId,
            };
            return answer(fx, tx, JoinResult::error(e, &req.member_id));
        }
        if !self.supports(&req.protocol_type, &req.protocols) {
            return answer(
                fx,
                tx,
                JoinResult::error(BrokerError::InconsistentGroupProtocol, &req.member_id),
            );
        }
        let joining_new = unknown || self.pending.contains_key(&req.member_id);
        let replaces_static = unknown
            && req
                .instance_id
                .as_ref()
                .is_some_and(|i| self.statics.contains_key(i));
        if joining_new && !replaces_static && self.members.len() >= cfg.max_size {
            return answer(
                fx,
                tx,
                JoinResult::error(BrokerError::GroupMaxSizeReached, &req.member_id),
            );
        }
        if unknown {
            let member_id = new_member_id();
            if let Some(instance) = req.instance_id.clone() {
                match self.statics.get(&instance).cloned() {
                    Some(old) => self.replace_static(old, member_id, req, tx, now_ms, fx),
                    None => self.add_member(member_id, req, tx, now_ms, fx),
                }
            } else if req.require_known_member_id {
                // KIP-394: the member must come back with this id; until then it only holds
                // a place for one session timeout.
                self.pending.insert(
                    member_id.clone(),
                    now_ms + i64::from(req.session_timeout_ms),
                );
                answer(
                    fx,
                    tx,
                    JoinResult::error(BrokerError::MemberIdRequired, &member_id),
                );
            } else {
                self.add_member(member_id, req, tx, now_ms, fx);
            }
            return;
        }
        if self.pending.remove(&req.member_id).is_some() {
            let id = req.member_id.clone();
            return self.add_member(id, req, tx, now_ms, fx);
        }
        if let Err(e) = self.check_member(&req.member_id, req.instance_id.as_deref()) {
            return answer(fx, tx, JoinResult::error(e, &req.member_id));
        }
        let is_leader = self.leader.as_deref() == Some(req.member_id.as_str());
        let member = self.members.get_mut(&req.member_id).expect("checked");
        member.session_deadline_ms = now_ms + i64::from(req.session_timeout_ms);
        match self.state {
            ClassicState::PreparingRebalance => {
                self.update_member(req, tx);
                self.maybe_complete_join(now_ms, fx);
            }
            ClassicState::CompletingRebalance if member.same_protocols(&req.protocols) => {
                // A retried JoinGroup whose answer was lost: the same answer again.
                let r = self.join_result(&req.member_id, is_leader, false);
                answer(fx, tx, r);
            }
            ClassicState::Stable if !is_leader && member.same_protocols(&req.protocols) => {
                let r = self.join_result(&req.member_id, false, false);
                answer(fx, tx, r);
            }
            ClassicState::CompletingRebalance | ClassicState::Stable => {
                self.update_member(req, tx);
                self.prepare_rebalance(now_ms, fx);
            }
            ClassicState::Empty => answer(
                fx,
                tx,
                JoinResult::error(BrokerError::UnknownMemberId, &req.member_id),
            ),
        }
    }

    fn update_member(&mut self, req: JoinRequest, tx: oneshot::Sender<JoinResult>) {
        let m = self.members.get_mut(&req.member_id).expect("member exists");
        m.protocols = req.protocols;
        m.session_timeout_ms = req.session_timeout_ms;
        m.rebalance_timeout_ms = req.rebalance_timeout_ms;
        m.join_skip_assignment = req.supports_skip_assignment;
        if let Some(old) = m.awaiting_join.replace(tx) {
            // A second JoinGroup from the same member replaces the first.
            let _ = old.send(JoinResult::error(
                BrokerError::RebalanceInProgress,
                &req.member_id,
            ));
        }
    }

    fn add_member(
        &mut self,
        member_id: String,
        req: JoinRequest,
        tx: oneshot::Sender<JoinResult>,
        now_ms: i64,
        fx: &mut Effects,
    ) {
        if self.members.is_empty() {
            self.protocol_type = Some(req.protocol_type.clone());
        }
        if let Some(i) = &req.instance_id {
            self.statics.insert(i.clone(), member_id.clone());
        }
        if self.leader.is_none() {
            self.leader = Some(member_id.clone());
        }
        self.members.insert(
            member_id.clone(),
            Member {
                member_id,
                instance_id: req.instance_id,
                client_id: req.client_id,
                client_host: req.client_host,
                session_timeout_ms: req.session_timeout_ms,
                rebalance_timeout_ms: req.rebalance_timeout_ms,
                protocols: req.protocols,
                assignment: Bytes::new(),
                awaiting_join: Some(tx),
                join_skip_assignment: req.supports_skip_assignment,
                awaiting_sync: None,
                synced: false,
                session_deadline_ms: now_ms + i64::from(req.session_timeout_ms),
            },
        );
        if let Some((_, joined)) = &mut self.initial_delay {
            *joined = true;
        }
        match self.state {
            ClassicState::PreparingRebalance => self.maybe_complete_join(now_ms, fx),
            _ => self.prepare_rebalance(now_ms, fx),
        }
    }

    /// KIP-345: a static member that restarts takes over its old member id's place. The old
    /// id is fenced; if nothing else changed, a stable group does not rebalance.
    fn replace_static(
        &mut self,
        old_id: String,
        new_id: String,
        req: JoinRequest,
        tx: oneshot::Sender<JoinResult>,
        now_ms: i64,
        fx: &mut Effects,
    ) {
        let Some(mut member) = self.members.shift_remove(&old_id) else {
            self.statics
                .remove(req.instance_id.as_deref().unwrap_or_default());
            return self.add_member(new_id, req, tx, now_ms, fx);
        };
        fx.join(
            member.awaiting_join.take(),
            JoinResult::error(BrokerError::FencedInstanceId, &old_id),
        );
        fx.sync(
            member.awaiting_sync.take(),
            Err(BrokerError::FencedInstanceId),
        );
        member.protocols = req.protocols.clone();
        member.member_id = new_id.clone();
        member.client_id = req.client_id.clone();
        member.client_host = req.client_host.clone();
        member.session_timeout_ms = req.session_timeout_ms;
        member.rebalance_timeout_ms = req.rebalance_timeout_ms;
        member.session_deadline_ms = now_ms + i64::from(req.session_timeout_ms);
        self.members.insert(new_id.clone(), member);
        let instance = req.instance_id.clone().expect("static member");
        self.statics.insert(instance, new_id.clone());
        let was_leader = self.leader.as_deref() == Some(old_id.as_str());
        if was_leader {
            self.leader = Some(new_id.clone());
        }
        // Kafka: a stable group rebalances only if the protocol it would select changed.
        let unchanged = self.select_protocol() == self.protocol;
        match self.state {
            ClassicState::Stable if unchanged => {
                // The group's metadata names the new member id: persist it before answering.
                let mut r = self.join_result(&new_id, false, false);
                if was_leader && req.supports_skip_assignment {
                    r = self.join_result(&new_id, true, true);
                }
                fx.persist = true;
                fx.join(Some(tx), r);
            }
            ClassicState::PreparingRebalance => {
                self.update_member(
                    JoinRequest {
                        member_id: new_id,
                        ..req
                    },
                    tx,
                );
                self.maybe_complete_join(now_ms, fx);
            }
            _ => {
                self.update_member(
                    JoinRequest {
                        member_id: new_id,
                        ..req
                    },
                    tx,
                );
                self.prepare_rebalance(now_ms, fx);
            }
        }
    }

    fn join_result(
        &self,
        member_id: &str,
        with_members: bool,
        skip_assignment: bool,
    ) -> JoinResult {
        let protocol = self.protocol.clone().unwrap_or_default();
        JoinResult {
            error: None,
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            leader: self.leader.clone().unwrap_or_default(),
            member_id: member_id.to_string(),
            members: if with_members {
                self.members
                    .values()
                    .map(|m| {
                        (
                            m.member_id.clone(),
                            m.instance_id.clone(),
                            m.metadata_for(&protocol),
                        )
                    })
                    .collect()
            } else {
                Vec::new()
            },
            skip_assignment,
        }
    }

    fn prepare_rebalance(&mut self, now_ms: i64, fx: &mut Effects) {
        if self.state == ClassicState::CompletingRebalance {
            // Members waiting in SyncGroup must rejoin.
            for m in self.members.values_mut() {
                fx.sync(
                    m.awaiting_sync.take(),
                    Err(BrokerError::RebalanceInProgress),
                );
                m.assignment = Bytes::new();
            }
        }
        let rebalance_timeout = self.max_rebalance_timeout_ms();
        if self.state == ClassicState::Empty {
            let delay = self.initial_delay_ms.min(rebalance_timeout);
            self.initial_delay = Some(((rebalance_timeout - delay).max(0), false));
            self.deadline_ms = now_ms + delay;
        } else {
            self.initial_delay = None;
            self.deadline_ms = now_ms + rebalance_timeout;
        }
        self.transition(ClassicState::PreparingRebalance, now_ms);
        self.maybe_complete_join(now_ms, fx);
    }

    fn all_joined(&self) -> bool {
        self.pending.is_empty() && self.members.values().all(|m| m.awaiting_join.is_some())
    }

    fn maybe_complete_join(&mut self, now_ms: i64, fx: &mut Effects) {
        if self.state == ClassicState::PreparingRebalance
            && self.initial_delay.is_none()
            && self.all_joined()
        {
            self.complete_join(now_ms, fx);
        }
    }

    /// Ends the join phase: members that did not rejoin are removed, the generation moves on
    /// and every member that joined gets its answer (the leader with the member list).
    fn complete_join(&mut self, now_ms: i64, fx: &mut Effects) {
        let gone: Vec<String> = self
            .members
            .values()
            .filter(|m| m.awaiting_join.is_none())
            .map(|m| m.member_id.clone())
            .collect();
        for id in gone {
            self.remove_member_only(&id, fx);
        }
        self.initial_delay = None;
        self.generation += 1;
        if self.members.is_empty() {
            self.protocol = None;
            self.transition(ClassicState::Empty, now_ms);
            fx.persist = true;
            return;
        }
        self.protocol = self.select_protocol();
        if self
            .leader
            .as_ref()
            .is_none_or(|l| !self.members.contains_key(l))
        {
            self.leader = self.members.keys().next().cloned();
        }
        self.transition(ClassicState::CompletingRebalance, now_ms);
        self.deadline_ms = now_ms + self.max_rebalance_timeout_ms();
        let leader = self.leader.clone();
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            let is_leader = leader.as_deref() == Some(id.as_str());
            let r = self.join_result(&id, is_leader, false);
            let m = self.members.get_mut(&id).expect("member");
            m.synced = false;
            m.session_deadline_ms = now_ms + i64::from(m.session_timeout_ms);
            fx.join(m.awaiting_join.take(), r);
        }
    }

    /// SyncGroup: the leader's request carries the assignments; everyone waits for them.
    #[allow(clippy::too_many_arguments)]
    pub fn sync(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        protocol_type: Option<&str>,
        protocol_name: Option<&str>,
        assignments: Vec<(String, Bytes)>,
        tx: oneshot::Sender<SyncResult>,
        now_ms: i64,
        fx: &mut Effects,
    ) {
        if let Err(e) = self.check_member(member_id, instance_id) {
            return fx.sync(Some(tx), Err(e));
        }
        if generation != self.generation {
            return fx.sync(Some(tx), Err(BrokerError::IllegalGeneration));
        }
        if protocol_type.is_some_and(|t| Some(t) != self.protocol_type.as_deref())
            || protocol_name.is_some_and(|n| Some(n) != self.protocol.as_deref())
        {
            return fx.sync(Some(tx), Err(BrokerError::InconsistentGroupProtocol));
        }
        let answer = (self.protocol_type.clone(), self.protocol.clone());
        let is_leader = self.leader.as_deref() == Some(member_id);
        let member = self.members.get_mut(member_id).expect("checked");
        member.session_deadline_ms = now_ms + i64::from(member.session_timeout_ms);
        match self.state {
            ClassicState::Empty => fx.sync(Some(tx), Err(BrokerError::UnknownMemberId)),
            ClassicState::PreparingRebalance => {
                fx.sync(Some(tx), Err(BrokerError::RebalanceInProgress))
            }
            ClassicState::Stable => {
                let r = Ok((answer.0, answer.1, member.assignment.clone()));
                fx.sync(Some(tx), r);
            }
            ClassicState::CompletingRebalance => {
                member.synced = true;
                if let Some(old) = member.awaiting_sync.replace(tx) {
                    let _ = old.send(Err(BrokerError::RebalanceInProgress));
                }
                if !is_leader {
                    return;
                }
                let mut assignments: HashMap<String, Bytes> = assignments.into_iter().collect();
                for m in self.members.values_mut() {
                    m.assignment = assignments.remove(&m.member_id).unwrap_or_default();
                }
                self.transition(ClassicState::Stable, now_ms);
                fx.persist = true;
                for m in self.members.values_mut() {
                    let r = Ok((answer.0.clone(), answer.1.clone(), m.assignment.clone()));
                    fx.sync(m.awaiting_sync.take(), r);
                }
            }
        }
    }

    /// Heartbeat: keeps the session alive and tells members when to rejoin.
    pub fn heartbeat(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        now_ms: i64,
    ) -> Result<(), BrokerError> {
        if self.state == ClassicState::Empty {
            return Err(BrokerError::UnknownMemberId);
        }
        self.check_member(member_id, instance_id)?;
        if generation != self.generation {
            return Err(BrokerError::IllegalGeneration);
        }
        let m = self.members.get_mut(member_id).expect("checked");
        m.session_deadline_ms = now_ms + i64::from(m.session_timeout_ms);
        if self.state == ClassicState::PreparingRebalance {
            return Err(BrokerError::RebalanceInProgress);
        }
        Ok(())
    }

    /// OffsetCommit from this group (Kafka's `ClassicGroup.validateOffsetCommit`): a commit
    /// without a generation is an admin's or a standalone consumer's, allowed while the group
    /// is empty. A member's commit keeps its session alive.
    pub fn validate_offset_commit(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        now_ms: i64,
    ) -> Result<(), BrokerError> {
        if generation < 0 && self.state == ClassicState::Empty {
            return Ok(());
        }
        if generation >= 0 || !member_id.is_empty() || instance_id.is_some() {
            self.check_member(member_id, instance_id)?;
            if generation != self.generation {
                return Err(BrokerError::IllegalGeneration);
            }
        } else if self.state != ClassicState::Empty {
            return Err(BrokerError::UnknownMemberId);
        }
        if self.state == ClassicState::CompletingRebalance {
            return Err(BrokerError::RebalanceInProgress);
        }
        if let Some(m) = self.members.get_mut(member_id) {
            m.session_deadline_ms = now_ms + i64::from(m.session_timeout_ms);
        }
        Ok(())
    }

    /// LeaveGroup for one member (by member id, or by instance id for static members).
    pub fn leave(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        now_ms: i64,
        fx: &mut Effects,
    ) -> Result<(), BrokerError> {
        let id = match instance_id {
            Some(instance) => {
                let id = self
                    .statics
                    .get(instance)
                    .cloned()
                    .ok_or(BrokerError::UnknownMemberId)?;
                if !member_id.is_empty() && member_id != id {
                    return Err(BrokerError::FencedInstanceId);
                }
                id
            }
            None => {
                if self.pending.remove(member_id).is_some() {
                    self.maybe_complete_join(now_ms, fx);
                    return Ok(());
                }
                member_id.to_string()
            }
        };
        if !self.members.contains_key(&id) {
            return Err(BrokerError::UnknownMemberId);
        }
        self.remove_member(&id, now_ms, fx);
        Ok(())
    }

    fn remove_member_only(&mut self, id: &str, fx: &mut Effects) {
        let Some(mut m) = self.members.shift_remove(id) else {
            return;
        };
        fx.join(
            m.awaiting_join.take(),
            JoinResult::error(BrokerError::UnknownMemberId, id),
        );
        fx.sync(m.awaiting_sync.take(), Err(BrokerError::UnknownMemberId));
        if let Some(i) = &m.instance_id {
            if self.statics.get(i).map(String::as_str) == Some(id) {
                self.statics.remove(i);
            }
        }
        if self.leader.as_deref() == Some(id) {
            self.leader = self.members.keys().next().cloned();
        }
    }

    fn remove_member(&mut self, id: &str, now_ms: i64, fx: &mut Effects) {
        self.remove_member_only(id, fx);
        match self.state {
            ClassicState::Stable | ClassicState::CompletingRebalance => {
                self.prepare_rebalance(now_ms, fx)
            }
            ClassicState::PreparingRebalance => self.maybe_complete_join(now_ms, fx),
            ClassicState::Empty => {}
        }
    }

    /// Expires sessions and ends join and sync phases whose time is up.
    pub fn tick(&mut self, now_ms: i64, fx: &mut Effects) {
        self.pending.retain(|_, deadline| *deadline > now_ms);
        let expired: Vec<String> = self
            .members
            .values()
            .filter(|m| {
                m.awaiting_join.is_none()
                    && m.awaiting_sync.is_none()
                    && m.session_deadline_ms <= now_ms
            })
            .map(|m| m.member_id.clone())
            .collect();
        for id in expired {
            tracing::info!(member = %id, "classic group member's session expired");
            self.remove_member(&id, now_ms, fx);
        }
        match self.state {
            ClassicState::PreparingRebalance if now_ms >= self.deadline_ms => {
                match self.initial_delay {
                    Some((remaining, true)) if remaining > 0 => {
                        // New members arrived during the delay: wait once more for others.
                        let delay = self.initial_delay_ms.min(remaining);
                        self.initial_delay = Some((remaining - delay, false));
                        self.deadline_ms = now_ms + delay;
                    }
                    _ => {
                        self.initial_delay = None;
                        self.complete_join(now_ms, fx);
                    }
                }
            }
            ClassicState::CompletingRebalance if now_ms >= self.deadline_ms => {
                let unsynced: Vec<String> = self
                    .members
                    .values()
                    .filter(|m| !m.synced)
                    .map(|m| m.member_id.clone())
                    .collect();
                for id in unsynced {
                    tracing::info!(member = %id, "classic group member did not sync within the rebalance timeout");
                    self.remove_member_only(&id, fx);
                }
                if self.state == ClassicState::CompletingRebalance {
                    if self.members.is_empty() {
                        self.complete_join(now_ms, fx);
                    } else {
                        self.prepare_rebalance(now_ms, fx);
                    }
                }
            }
            _ => {}
        }
    }

    /// Topics the members are subscribed to, when the group uses the consumer protocol type
    /// and the metadata decodes (for OffsetDelete's GROUP_SUBSCRIBED_TO_TOPIC).
    pub fn subscribed_topics(&self) -> Option<BTreeSet<String>> {
        if self.protocol_type.as_deref() != Some("consumer") || self.members.is_empty() {
            return None;
        }
        let protocol = self.protocol.as_deref()?;
        let mut topics = BTreeSet::new();
        for m in self.members.values() {
            topics.extend(decode_subscription_topics(&m.metadata_for(protocol))?);
        }
        Some(topics)
    }
}

/// The topic list of a `ConsumerProtocolSubscription` (any version: the topics come first).
fn decode_subscription_topics(mut b: &[u8]) -> Option<Vec<String>> {
    use bytes::Buf;
    if b.len() < 6 {
        return None;
    }
    let _version = b.get_i16();
    let count = b.get_i32();
    if count < 0 || count as usize > b.len() / 2 {
        return None;
    }
    let mut topics = Vec::with_capacity(count as usize);
    for _ in 0..count {
        if b.len() < 2 {
            return None;
        }
        let len = b.get_i16();
        if len < 0 || len as usize > b.len() {
            return None;
        }
        topics.push(String::from_utf8(b[..len as usize].to_vec()).ok()?);
        b.advance(len as usize);
    }
    Some(topics)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> GroupConfig {
        GroupConfig {
            initial_rebalance_delay_ms: 0,
            ..GroupConfig::default()
        }
    }

    fn request(member_id: &str, rebalance_timeout_ms: i32) -> JoinRequest {
        JoinRequest {
            member_id: member_id.into(),
            instance_id: None,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms,
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"m"))],
            require_known_member_id: true,
            supports_skip_assignment: false,
        }
    }

    /// Sends a JoinGroup; returns the answer if it came at once, else the pending receiver.
    fn join(
        g: &mut ClassicGroup,
        req: JoinRequest,
        id: &str,
        now: i64,
    ) -> (Option<JoinResult>, oneshot::Receiver<JoinResult>) {
        let (tx, mut rx) = oneshot::channel();
        let mut fx = Effects::default();
        g.join(req, tx, &cfg(), || id.to_string(), now, &mut fx);
        for (tx, r) in fx.joins {
            let _ = tx.send(r);
        }
        (rx.try_recv().ok().flatten(), rx)
    }

    fn tick(g: &mut ClassicGroup, now: i64) -> Effects {
        let mut fx = Effects::default();
        g.tick(now, &mut fx);
        for (tx, r) in std::mem::take(&mut fx.joins) {
            let _ = tx.send(r);
        }
        fx
    }

    #[test]
    fn join_sync_and_rebalance_timeout() {
        let mut g = ClassicGroup::new(0, 0);
        // KIP-394: the first join only hands out a member id.
        let (r, _) = join(&mut g, request("", 1_000), "a", 0);
        let r = r.expect("answered at once");
        assert_eq!(r.error, Some(BrokerError::MemberIdRequired));
        assert_eq!(r.member_id, "a");
        let (r, mut rx_a) = join(&mut g, request("a", 1_000), "x", 0);
        assert!(r.is_none(), "waits for the join phase to end");
        tick(&mut g, 100);
        let a = rx_a.try_recv().unwrap().expect("joined");
        assert_eq!((a.generation, a.leader.as_str()), (1, "a"));
        assert_eq!(a.members.len(), 1, "the leader sees the members");
        // Sync: the leader's assignment goes out once persisted.
        let (tx, mut rx) = oneshot::channel();
        let mut fx = Effects::default();
        let assignment = vec![("a".to_string(), Bytes::from_static(b"p0"))];
        g.sync("a", None, 1, None, None, assignment, tx, 100, &mut fx);
        assert!(fx.persist);
        for (tx, r) in fx.syncs {
            let _ = tx.send(r);
        }
        assert_eq!(
            rx.try_recv().unwrap().unwrap().unwrap().2,
            Bytes::from_static(b"p0")
        );
        assert_eq!(g.state, ClassicState::Stable);
        assert_eq!(g.heartbeat("a", None, 1, 200), Ok(()));
        assert_eq!(
            g.heartbeat("a", None, 0, 200),
            Err(BrokerError::IllegalGeneration)
        );
        assert_eq!(
            g.heartbeat("zz", None, 1, 200),
            Err(BrokerError::UnknownMemberId)
        );
        // b joins; a never rejoins: after a's rebalance timeout b's join completes without a.
        let _ = join(&mut g, request("", 1_000), "b", 300);
        let (_, mut rx_b) = join(&mut g, request("b", 1_000), "y", 300);
        assert_eq!(g.state, ClassicState::PreparingRebalance);
        assert_eq!(
            g.heartbeat("a", None, 1, 400),
            Err(BrokerError::RebalanceInProgress)
        );
        tick(&mut g, 1_200);
        assert!(
            rx_b.try_recv().unwrap().is_none(),
            "still inside the rebalance timeout"
        );
        tick(&mut g, 1_400);
        let b = rx_b.try_recv().unwrap().expect("completed at the deadline");
        assert_eq!((b.generation, b.leader.as_str()), (2, "b"));
        assert!(!g.members.contains_key("a"));
    }

    #[test]
    fn protocols_must_match() {
        let mut g = ClassicGroup::new(0, 0);
        let _ = join(&mut g, request("", 1_000), "a", 0);
        let _ = join(&mut g, request("a", 1_000), "x", 0);
        let mut other = request("", 1_000);
        other.protocols = vec![("roundrobin".into(), Bytes::new())];
        let (r, _) = join(&mut g, other, "b", 0);
        assert_eq!(
            r.unwrap().error,
            Some(BrokerError::InconsistentGroupProtocol)
        );
    }

    #[test]
    fn static_member_rejoin_fences_the_old_id() {
        let mut g = ClassicGroup::new(0, 0);
        let mut req = request("", 1_000);
        req.instance_id = Some("i1".into());
        let (_, mut rx) = join(&mut g, req.clone(), "old", 0);
        tick(&mut g, 100);
        assert!(rx.try_recv().unwrap().is_some());
        let (tx, _rx) = oneshot::channel();
        let mut fx = Effects::default();
        g.sync("old", Some("i1"), 1, None, None, vec![], tx, 100, &mut fx);
        assert_eq!(g.state, ClassicState::Stable);
        // The same instance restarts: new member id, no rebalance.
        let (r, _) = join(&mut g, req, "new", 200);
        let r = r.expect("answered at once");
        assert_eq!((r.member_id.as_str(), r.generation), ("new", 1));
        assert_eq!(g.state, ClassicState::Stable);
        assert_eq!(
            g.heartbeat("old", Some("i1"), 1, 300),
            Err(BrokerError::FencedInstanceId)
        );
        assert_eq!(g.heartbeat("new", Some("i1"), 1, 300), Ok(()));
    }
}
