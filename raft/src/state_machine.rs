//! The state machine of a partition group. A partition has no state besides its log, so
//! applying an entry only records how far the log is committed: `last_applied` is what the
//! partition turns into its high watermark. Membership is kept because openraft asks for it.
//!
//! A snapshot holds no records either: its meta (last entry, membership), the Kafka offset
//! after its last entry, and what the partition on top keeps of the entries it covers (its
//! idempotent-producer state as of that offset, opaque here) ([`SnapshotData`]). Retention
//! takes one so openraft may purge the log prefix it covers; a follower that needs a purged
//! entry gets the snapshot instead, and its log starts again at that offset
//! (`LogStore::purge`), so offsets stay the leader's. A partition's snapshot is kept in
//! `raft-snapshot` beside its log (written before openraft purges anything it covers), so a
//! restarted replica resumes from it: openraft installs it again at start-up, and the
//! partition takes its state back from it before the entries after it are applied again.
//!
//! The controller's state machine (`with_apply_hook`, no store) keeps its snapshots in memory
//! only: its log is never purged, so openraft never needs one.

use std::io;
use std::path::PathBuf;
use std::rc::Rc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine, Snapshot};
use openraft::{RaftTypeConfig, SnapshotMeta, StoredMembership};

use ferrolog_io::{Fs, GlommioFs};

use crate::entry::{Entry, EntryLogId};
use crate::store::{PartitionTypes, StoreView};
use crate::{wire, PartitionRaft};

type Node = <PartitionRaft as RaftTypeConfig>::Node;
type Stored = StoredMembership<crate::CommittedLeaderId, u64, Node>;
type Meta = SnapshotMeta<crate::CommittedLeaderId, u64, Node>;
type PartitionSnapshot = Snapshot<crate::CommittedLeaderId, u64, Node, SnapshotData>;

/// File holding a partition's latest snapshot.
const SNAPSHOT_FILE: &str = "raft-snapshot";
/// Version 1 added the partition's state; a version 0 file has none.
const SNAPSHOT_VERSION: u8 = 1;

/// What a partition snapshot carries: the Kafka offset after its last entry, and the state
/// the partition on top keeps of the entries it covers (`StateAt`; empty for none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotData {
    pub next_offset: i64,
    pub partition_state: Bytes,
}

/// What the partition on top hears of, in log order, on every replica.
pub enum Applied<'a> {
    /// A committed entry.
    Entry(&'a Entry),
    /// A snapshot took the place of the entries up to it, on a follower behind a purge or at
    /// a restart: the log goes on at its offset, and the partition's state is the one it
    /// carries.
    Snapshot(&'a SnapshotData),
}

/// Called with each committed entry and each snapshot installed.
pub type ApplyHook = Box<dyn FnMut(Applied<'_>)>;

/// The partition's state as of a Kafka offset at or below the last applied entry's end, for
/// a snapshot ending there.
pub type StateAt = Box<dyn Fn(i64) -> Bytes>;

/// How far a partition's log is committed (applied) and its latest membership. Generic over
/// the file system of its log, as the store is (the simulator runs it on its disks).
pub struct PartitionStateMachine<F: Fs = GlommioFs> {
    last_applied: Option<EntryLogId>,
    membership: Stored,
    snapshot: Option<(Meta, SnapshotData)>,
    on_apply: Option<ApplyHook>,
    state_at: Option<StateAt>,
    /// The partition's log: where a snapshot's offset comes from and where it is kept.
    store: Option<StoreView<F>>,
    /// Held while a snapshot is kept (`keep`), so an older one never lands last.
    keeping: Rc<tokio::sync::Mutex<()>>,
}

impl<F: Fs> Default for PartitionStateMachine<F> {
    fn default() -> Self {
        PartitionStateMachine {
            last_applied: None,
            membership: Stored::default(),
            snapshot: None,
            on_apply: None,
            state_at: None,
            store: None,
            keeping: Rc::default(),
        }
    }
}

impl<F: Fs> PartitionStateMachine<F> {
    /// A state machine that also hands every committed entry to `hook` (the controller
    /// applies its metadata records this way). Its snapshots live in memory only.
    pub fn with_apply_hook(hook: ApplyHook) -> PartitionStateMachine<F> {
        PartitionStateMachine {
            on_apply: Some(hook),
            ..PartitionStateMachine::default()
        }
    }

    /// The state machine of a partition whose log `store` is: its latest snapshot comes back
    /// from disk (openraft installs it at start-up), `hook` hears of every entry applied
    /// and snapshot installed, and each snapshot taken carries `state_at` its offset.
    pub fn open(
        store: StoreView<F>,
        hook: ApplyHook,
        state_at: StateAt,
    ) -> io::Result<PartitionStateMachine<F>> {
        let path = snapshot_path(&store);
        let snapshot = match store.fs().read(&path) {
            Ok(bytes) => Some(decode_snapshot(&bytes).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            })?),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        Ok(PartitionStateMachine {
            on_apply: Some(hook),
            state_at: Some(state_at),
            store: Some(store),
            snapshot,
            ..PartitionStateMachine::default()
        })
    }

    /// The last applied (committed) entry.
    pub fn last_applied(&self) -> Option<EntryLogId> {
        self.last_applied
    }

    /// The snapshot to take now: through the entry retention asked for (`snapshot_through`)
    /// or else the last applied one. It names the current membership, so it never ends
    /// before the entry that set it (partition groups set theirs once, at creation).
    fn current(&self) -> (Meta, Option<i64>) {
        let (last, next) = match (&self.store, self.last_applied) {
            (Some(store), Some(applied)) => {
                let wanted = store
                    .snapshot_to()
                    .map_or(applied.index, |i| i.min(applied.index));
                let at = wanted.max(self.membership.log_id().map_or(0, |m| m.index));
                let earlier = match at < applied.index {
                    true => store.log_id(at).zip(store.end_offset(at)),
                    false => None,
                };
                earlier.unwrap_or_else(|| {
                    let end = store.end_offset(applied.index);
                    (
                        applied,
                        end.expect("an applied entry is in the log or at its start"),
                    )
                })
            }
            (_, applied) => return (self.meta(applied), None),
        };
        (self.meta(Some(last)), Some(next))
    }

    /// What a snapshot ending at Kafka offset `next` carries (the partition's state as of
    /// there); nothing without one (no log, or nothing applied).
    fn data_at(&self, next: Option<i64>) -> SnapshotData {
        let Some(next_offset) = next else {
            return SnapshotData::default();
        };
        let partition_state = self
            .state_at
            .as_ref()
            .map_or_else(Bytes::new, |at| at(next_offset));
        SnapshotData {
            next_offset,
            partition_state,
        }
    }

    fn taker(&self, meta: Meta, next: SnapshotData) -> SnapshotTaker<F> {
        SnapshotTaker {
            meta,
            next,
            store: self.store.clone(),
            keeping: self.keeping.clone(),
        }
    }

    fn meta(&self, last_log_id: Option<EntryLogId>) -> Meta {
        SnapshotMeta {
            last_log_id,
            last_membership: self.membership.clone(),
        }
    }
}

fn snapshot_path<F: Fs>(store: &StoreView<F>) -> PathBuf {
    store.dir().join(SNAPSHOT_FILE)
}

fn encode_snapshot(meta: &Meta, data: &SnapshotData) -> Vec<u8> {
    let mut out = BytesMut::new();
    out.put_u8(SNAPSHOT_VERSION);
    wire::put_snapshot(&mut out, meta, data);
    let crc = crc32c::crc32c(&out);
    out.put_u32(crc);
    out.to_vec()
}

fn decode_snapshot(bytes: &[u8]) -> Result<(Meta, SnapshotData), String> {
    let (body, crc) = bytes
        .split_at_checked(bytes.len().saturating_sub(4))
        .filter(|(body, _)| !body.is_empty())
        .ok_or("too short")?;
    if crc32c::crc32c(body) != u32::from_be_bytes(crc.try_into().expect("4 bytes")) {
        return Err("checksum mismatch".into());
    }
    if body[0] > SNAPSHOT_VERSION {
        return Err(format!("unknown version {}", body[0]));
    }
    // A version 0 snapshot ends before the partition's state: it has none.
    let mut rest = Bytes::copy_from_slice(&body[1..]);
    let (meta, data) = wire::get_snapshot(&mut rest).map_err(|e| e.to_string())?;
    if rest.has_remaining() {
        return Err("trailing bytes".into());
    }
    Ok((meta, data))
}

/// Keeps the snapshot in `raft-snapshot` and tells the store, unless a newer one is kept
/// already (a replica's own retention snapshot may finish after it installed its leader's).
async fn keep<F: Fs>(
    store: &Option<StoreView<F>>,
    keeping: &tokio::sync::Mutex<()>,
    meta: &Meta,
    data: &SnapshotData,
) -> io::Result<()> {
    let (Some(store), Some(last)) = (store, meta.last_log_id) else {
        return Ok(());
    };
    let _one_at_a_time = keeping.lock().await;
    if store.snapshot_index().is_some_and(|kept| kept > last.index) {
        return Ok(());
    }
    let path = snapshot_path(store);
    store
        .fs()
        .write_file(&path, encode_snapshot(meta, data))
        .await?;
    store.note_snapshot(last.index, data.next_offset);
    Ok(())
}

impl<C: PartitionTypes, F: Fs> RaftStateMachine<C> for PartitionStateMachine<F> {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = SnapshotTaker<F>;

    async fn applied_state(&mut self) -> io::Result<(Option<EntryLogId>, Stored)> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<S>(&mut self, mut entries: S) -> io::Result<()>
    where
        S: Stream<Item = io::Result<EntryResponder<C>>> + Unpin,
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
                hook(Applied::Entry(&entry));
            }
            if let Some(r) = responder {
                r.send(());
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotTaker<F> {
        let (meta, next) = self.current();
        self.taker(meta, self.data_at(next))
    }

    async fn try_create_snapshot_builder(&mut self, force: bool) -> Option<SnapshotTaker<F>> {
        let (meta, next) = self.current();
        let (meta, data) = match &self.snapshot {
            // Nothing newer to take (retention asked for an entry the snapshot in place,
            // perhaps the leader's, already covers): openraft gets that one when it must.
            // Checked before the partition's state is gathered for a snapshot not taken.
            Some((kept, _)) if kept.last_log_id >= meta.last_log_id && !force => return None,
            Some((kept, data)) if kept.last_log_id >= meta.last_log_id => {
                (kept.clone(), data.clone())
            }
            _ => (meta, self.data_at(next)),
        };
        // The builder's snapshot becomes the current one as soon as it is taken; openraft
        // purges nothing it covers before the builder has kept it.
        self.snapshot = Some((meta.clone(), data.clone()));
        Some(self.taker(meta, data))
    }

    async fn install_snapshot(&mut self, meta: &Meta, data: SnapshotData) -> io::Result<()> {
        // Kept first: openraft purges the entries it covers once this returns.
        keep(&self.store, &self.keeping, meta, &data).await?;
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        if let Some(hook) = &mut self.on_apply {
            hook(Applied::Snapshot(&data));
        }
        self.snapshot = Some((meta.clone(), data));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> io::Result<Option<PartitionSnapshot>> {
        Ok(self.snapshot.clone().map(|(meta, next)| Snapshot {
            meta,
            snapshot: next,
        }))
    }
}

/// Builds the snapshot of the state at the time it was created, and keeps it on disk.
pub struct SnapshotTaker<F: Fs = GlommioFs> {
    meta: Meta,
    next: SnapshotData,
    store: Option<StoreView<F>>,
    keeping: Rc<tokio::sync::Mutex<()>>,
}

impl<C: PartitionTypes, F: Fs> RaftSnapshotBuilder<C> for SnapshotTaker<F> {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> io::Result<PartitionSnapshot> {
        keep(&self.store, &self.keeping, &self.meta, &self.next).await?;
        Ok(Snapshot {
            meta: self.meta.clone(),
            snapshot: self.next.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CommittedLeaderId;
    use openraft::{BasicNode, Membership};
    use std::collections::{BTreeMap, BTreeSet};

    #[test]
    fn snapshot_file_round_trips_and_damage_is_refused() {
        let nodes: BTreeMap<u64, BasicNode> = (1..=3)
            .map(|i| (i, BasicNode::new(format!("n{i}"))))
            .collect();
        let members = Membership::new(vec![BTreeSet::from([1, 2, 3])], nodes).unwrap();
        let meta = Meta {
            last_log_id: Some(EntryLogId::new(CommittedLeaderId::new(4), 90)),
            last_membership: StoredMembership::new(
                Some(EntryLogId::new(CommittedLeaderId::new(1), 1)),
                members,
            ),
        };
        let data = SnapshotData {
            next_offset: 12_345,
            partition_state: Bytes::from_static(b"{\"producers\":{}}"),
        };
        let bytes = encode_snapshot(&meta, &data);
        assert_eq!(decode_snapshot(&bytes).unwrap(), (meta.clone(), data));
        // A snapshot kept before snapshots carried the partition's state (version 0) has none.
        let mut v0 = BytesMut::new();
        v0.put_u8(0);
        let mut body = BytesMut::new();
        wire::put_snapshot(
            &mut body,
            &meta,
            &SnapshotData {
                next_offset: 7,
                partition_state: Bytes::new(),
            },
        );
        v0.put_slice(&body[..body.len() - 4]);
        let crc = crc32c::crc32c(&v0);
        v0.put_u32(crc);
        let empty = SnapshotData {
            next_offset: 7,
            partition_state: Bytes::new(),
        };
        assert_eq!(decode_snapshot(&v0).unwrap(), (meta, empty));
        for cut in [0, 1, 4, bytes.len() - 1] {
            assert!(decode_snapshot(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut flipped = bytes.clone();
        flipped[5] ^= 1;
        assert!(decode_snapshot(&flipped).is_err());
    }
}
