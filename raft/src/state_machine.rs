//! The state machine of a partition group. A partition has no state besides its log, so
//! applying an entry only records how far the log is committed: `last_applied` is what the
//! partition turns into its high watermark. Membership is kept because openraft asks for it.
//!
//! Snapshots carry no data (`SnapshotData = ()`): the log itself is the state. A follower that
//! falls behind the leader's log start will need the Kafka offset to resume at; carrying it in
//! the snapshot is not built yet (see the crate docs).

use std::io;

use futures::{Stream, StreamExt};
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine, Snapshot};
use openraft::{RaftTypeConfig, SnapshotMeta, StoredMembership};

use crate::entry::{Entry, EntryLogId};
use crate::PartitionRaft;

type Node = <PartitionRaft as RaftTypeConfig>::Node;
type Stored = StoredMembership<crate::CommittedLeaderId, u64, Node>;
type Meta = SnapshotMeta<crate::CommittedLeaderId, u64, Node>;
type PartitionSnapshot = Snapshot<crate::CommittedLeaderId, u64, Node, ()>;

/// Called with each committed entry, in log order, on every replica.
pub type ApplyHook = Box<dyn FnMut(&Entry)>;

/// How far a partition's log is committed (applied) and its latest membership.
#[derive(Default)]
pub struct PartitionStateMachine {
    last_applied: Option<EntryLogId>,
    membership: Stored,
    snapshot: Option<Meta>,
    on_apply: Option<ApplyHook>,
}

impl PartitionStateMachine {
    /// A state machine that also hands every committed entry to `hook` (the controller
    /// applies its metadata records this way).
    pub fn with_apply_hook(hook: ApplyHook) -> PartitionStateMachine {
        PartitionStateMachine {
            on_apply: Some(hook),
            ..PartitionStateMachine::default()
        }
    }

    /// The last applied (committed) entry.
    pub fn last_applied(&self) -> Option<EntryLogId> {
        self.last_applied
    }

    fn meta(&self) -> Meta {
        SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
        }
    }
}

impl RaftStateMachine<PartitionRaft> for PartitionStateMachine {
    type SnapshotData = ();
    type SnapshotBuilder = SnapshotTaker;

    async fn applied_state(&mut self) -> io::Result<(Option<EntryLogId>, Stored)> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<S>(&mut self, mut entries: S) -> io::Result<()>
    where
        S: Stream<Item = io::Result<EntryResponder<PartitionRaft>>> + Unpin,
    {
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            assert!(
                self.last_applied
                    .is_none_or(|a| a.index < entry.log_id.index),
                "entries applied out of order"
            );
            if let openraft::EntryPayload::Membership(m) = &entry.payload {
                self.membership = StoredMembership::new(Some(entry.log_id), m.clone());
            }
            self.last_applied = Some(entry.log_id);
            if let Some(hook) = &mut self.on_apply {
                hook(&entry);
            }
            if let Some(r) = responder {
                r.send(());
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotTaker {
        SnapshotTaker(self.meta())
    }

    async fn try_create_snapshot_builder(&mut self, _force: bool) -> Option<SnapshotTaker> {
        // The builder's snapshot becomes the current one as soon as it is taken.
        self.snapshot = Some(self.meta());
        Some(SnapshotTaker(self.meta()))
    }

    async fn install_snapshot(&mut self, meta: &Meta, _snapshot: ()) -> io::Result<()> {
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.snapshot = Some(meta.clone());
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> io::Result<Option<PartitionSnapshot>> {
        Ok(self
            .snapshot
            .clone()
            .map(|meta| Snapshot { meta, snapshot: () }))
    }
}

/// Builds the (data-less) snapshot of the state at the time it was created.
pub struct SnapshotTaker(Meta);

impl RaftSnapshotBuilder<PartitionRaft> for SnapshotTaker {
    type SnapshotData = ();

    async fn build_snapshot(&mut self) -> io::Result<PartitionSnapshot> {
        Ok(Snapshot {
            meta: self.0.clone(),
            snapshot: (),
        })
    }
}
