//! A node's state machine in the simulation, and the batches its clients write.
//!
//! The log store is the broker's own (`crate::store::LogStore` over io/'s `Log`, on the
//! node's simulated disk, [`super::fs::SimFs`]); the state machine here reports every
//! applied entry to the checker instead of moving a high watermark.

use std::collections::BTreeMap;
use std::io;
use std::rc::Rc;

use ferrolog_io::batch::{make_batch, BatchHeader};
use futures::{Stream, StreamExt};
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{RaftTypeConfig, Snapshot, SnapshotMeta, StoredMembership};

use super::runtime::NodeId;
use super::{Checker, SimRaft};
use crate::entry::Batch;

pub type Entry = <SimRaft as RaftTypeConfig>::Entry;
pub type Vote = <SimRaft as RaftTypeConfig>::Vote;
pub type LogId = openraft::LogId<crate::CommittedLeaderId>;
type Meta = SnapshotMeta<crate::CommittedLeaderId, u64, openraft::BasicNode>;

/// The batch a client writes for `record`: one to three records (so Kafka offsets and Raft
/// indexes part ways), the record's identity in the batch timestamp.
pub fn batch_of(record: super::Record) -> Batch {
    let timestamp = (i64::from(record.client) << 32) | i64::from(record.seq);
    let count = 1 + (record.seq % 3) as i32;
    Batch(make_batch(0, count, timestamp, 20).into())
}

/// The record a client wrote in this entry, if it is one.
pub fn record_of(e: &Entry) -> Option<super::Record> {
    match &e.payload {
        openraft::EntryPayload::Normal(b) => {
            let h = BatchHeader::parse(&b.0).ok()?;
            Some(super::Record {
                client: (h.base_timestamp >> 32) as u32,
                seq: h.base_timestamp as u32,
            })
        }
        _ => None,
    }
}

/// A node's state machine: it reports each applied entry to the checker.
pub struct StateMachine {
    pub node: NodeId,
    pub applied: Option<LogId>,
    pub membership: StoredMembership<crate::CommittedLeaderId, u64, openraft::BasicNode>,
    pub checker: Rc<Checker>,
}

pub struct Builder(Meta);

impl RaftSnapshotBuilder<SimRaft> for Builder {
    type SnapshotData = ();
    async fn build_snapshot(
        &mut self,
    ) -> io::Result<Snapshot<crate::CommittedLeaderId, u64, openraft::BasicNode, ()>> {
        Ok(Snapshot {
            meta: self.0.clone(),
            snapshot: (),
        })
    }
}

impl StateMachine {
    fn meta(&self) -> Meta {
        Meta {
            last_log_id: self.applied,
            last_membership: self.membership.clone(),
        }
    }
}

impl RaftStateMachine<SimRaft> for StateMachine {
    type SnapshotData = ();
    type SnapshotBuilder = Builder;

    async fn applied_state(
        &mut self,
    ) -> io::Result<(
        Option<LogId>,
        StoredMembership<crate::CommittedLeaderId, u64, openraft::BasicNode>,
    )> {
        Ok((self.applied, self.membership.clone()))
    }

    async fn apply<S>(&mut self, mut entries: S) -> io::Result<()>
    where
        S: Stream<Item = io::Result<EntryResponder<SimRaft>>> + Unpin,
    {
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            if self.applied.is_some_and(|a| a.index >= entry.log_id.index) {
                self.checker.violation(format!(
                    "node {} applied index {} after {:?}: the HW went backwards",
                    self.node, entry.log_id.index, self.applied
                ));
            }
            if let openraft::EntryPayload::Membership(m) = &entry.payload {
                self.membership = StoredMembership::new(Some(entry.log_id), m.clone());
            }
            self.applied = Some(entry.log_id);
            self.checker
                .applied(self.node, entry.log_id, record_of(&entry));
            if let Some(r) = responder {
                r.send(());
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Builder {
        Builder(self.meta())
    }

    async fn try_create_snapshot_builder(&mut self, _force: bool) -> Option<Builder> {
        Some(Builder(self.meta()))
    }

    async fn install_snapshot(&mut self, meta: &Meta, _data: ()) -> io::Result<()> {
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> io::Result<Option<Snapshot<crate::CommittedLeaderId, u64, openraft::BasicNode, ()>>> {
        Ok(None)
    }
}

/// The first entry each index was applied with anywhere, to compare every later one with.
pub type Applied = BTreeMap<u64, (LogId, Option<super::Record>, NodeId)>;
