//! The simulated disk of a node, its Raft log store, and its state machine.
//!
//! The store keeps ferrolog's durability contract (`crate::store`): an appended entry is
//! readable at once, and durable only once a flush that began after it ends, which is when
//! openraft hears that it was written; the vote is durable when `save_vote` returns; the
//! commit index is not persisted. A crash keeps the durable prefix and a random part of the
//! tail written after it (what reached the disk before the process died).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::rc::Rc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use openraft::storage::{
    EntryResponder, IOFlushed, LogState, RaftLogReader, RaftLogStorage, RaftSnapshotBuilder,
    RaftStateMachine,
};
use openraft::{AsyncRuntime, RaftTypeConfig, Snapshot, SnapshotMeta, StoredMembership};
use tokio::sync::mpsc;

use super::runtime::{NodeId, SimRuntime};
use super::{Checker, SimRaft};

pub type Entry = <SimRaft as RaftTypeConfig>::Entry;
pub type Vote = <SimRaft as RaftTypeConfig>::Vote;
pub type LogId = openraft::LogId<crate::CommittedLeaderId>;
type Meta = SnapshotMeta<crate::CommittedLeaderId, u64, openraft::BasicNode>;

/// What a node's disk holds: its log (each entry with the number of the write that put it
/// there), how much of it is durable, and its vote.
#[derive(Default)]
pub struct Disk {
    entries: Vec<(Entry, u64)>,
    durable: usize,
    /// The vote as read, and as it would be after a crash (synced).
    vote: Option<Vote>,
    vote_synced: Option<Vote>,
    writes: u64,
    /// Failed (`fail`): every write, flush and vote errs until the node restarts.
    failed: bool,
}

impl Disk {
    /// A crash: the durable prefix stays, and `keep` (0..=1) of the rest.
    /// From now on the disk takes nothing: what is not durable yet never becomes so (the
    /// flush in progress fails too), as after a disk error that aborts the file system.
    pub fn fail(&mut self) {
        self.failed = true;
    }

    /// Whether the node never wrote anything here (no entry, no vote): a new replica.
    pub fn fresh(&self) -> bool {
        self.entries.is_empty() && self.vote.is_none()
    }

    pub fn failed(&self) -> bool {
        self.failed
    }

    fn check(&self) -> io::Result<()> {
        match self.failed {
            true => Err(io::Error::other("the simulated disk failed")),
            false => Ok(()),
        }
    }

    /// A crash (the node restarts on a mended disk, if it had failed).
    pub fn crash(&mut self, keep: f64) {
        self.failed = false;
        let tail = self.entries.len() - self.durable;
        let kept = self.durable + (tail as f64 * keep) as usize;
        self.entries.truncate(kept);
        self.durable = kept;
        self.vote = self.vote_synced;
    }

    /// The log's entries as (log id, record), for the final comparison.
    pub fn log(&self) -> Vec<(LogId, Option<super::Record>)> {
        self.entries
            .iter()
            .map(|(e, _)| (e.log_id, record_of(e)))
            .collect()
    }
}

pub fn record_of(e: &Entry) -> Option<super::Record> {
    match &e.payload {
        openraft::EntryPayload::Normal(r) => Some(*r),
        _ => None,
    }
}

/// A node's log store over its disk; a flusher task makes writes durable in order.
pub struct Store {
    disk: Rc<RefCell<Disk>>,
    flushes: mpsc::UnboundedSender<(u64, IOFlushed<SimRaft>)>,
}

impl Store {
    /// A store over `disk` whose flushes each take up to `flush_max`.
    pub fn new(disk: Rc<RefCell<Disk>>, flush_max: Duration) -> Store {
        let (flushes, mut rx) = mpsc::unbounded_channel::<(u64, IOFlushed<SimRaft>)>();
        let d = disk.clone();
        SimRuntime::spawn(async move {
            while let Some((write, done)) = rx.recv().await {
                let nanos = super::runtime::random_u64() % (flush_max.as_nanos() as u64).max(1);
                SimRuntime::sleep(Duration::from_nanos(nanos)).await;
                let mut disk = d.borrow_mut();
                if let Err(e) = disk.check() {
                    drop(disk);
                    done.io_completed(Err(e));
                    continue;
                }
                while disk.durable < disk.entries.len() && disk.entries[disk.durable].1 <= write {
                    disk.durable += 1;
                }
                drop(disk);
                done.io_completed(Ok(()));
            }
        });
        Store { disk, flushes }
    }
}

fn bounds(range: impl RangeBounds<u64>) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(&i) => i,
        Bound::Excluded(&i) => i + 1,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&i) => i + 1,
        Bound::Excluded(&i) => i,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

/// Reads a node's log (the simulation purges nothing, so index = position).
#[derive(Clone)]
pub struct Reader(Rc<RefCell<Disk>>);

impl RaftLogReader<SimRaft> for Reader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        let (start, end) = bounds(range);
        let disk = self.0.borrow();
        let end = end.min(disk.entries.len() as u64);
        Ok((start..end)
            .map(|i| disk.entries[i as usize].0.clone())
            .collect())
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        Ok(self.0.borrow().vote)
    }
}

impl RaftLogReader<SimRaft> for Store {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        Reader(self.disk.clone()).try_get_log_entries(range).await
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        Ok(self.disk.borrow().vote)
    }
}

impl RaftLogStorage<SimRaft> for Store {
    type LogReader = Reader;

    async fn get_log_state(&mut self) -> io::Result<LogState<SimRaft>> {
        Ok(LogState {
            last_purged_log_id: None,
            last_log_id: self.disk.borrow().entries.last().map(|(e, _)| e.log_id),
        })
    }

    async fn get_log_reader(&mut self) -> Reader {
        Reader(self.disk.clone())
    }

    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        // As the real store: readable at once, durable when this returns.
        self.disk.borrow().check()?;
        self.disk.borrow_mut().vote = Some(*vote);
        SimRuntime::sleep(Duration::from_micros(super::runtime::random_u64() % 500)).await;
        self.disk.borrow_mut().vote_synced = Some(*vote);
        Ok(())
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<SimRaft>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry>,
    {
        let write = {
            let mut disk = self.disk.borrow_mut();
            disk.check()?;
            disk.writes += 1;
            let write = disk.writes;
            for e in entries {
                assert_eq!(
                    e.log_id.index,
                    disk.entries.len() as u64,
                    "appends leave no holes"
                );
                disk.entries.push((e, write));
            }
            write
        };
        self.flushes
            .send((write, callback))
            .map_err(|_| io::Error::other("the flusher stopped"))
    }

    async fn truncate_after(&mut self, last: Option<LogId>) -> io::Result<()> {
        let keep = last.map_or(0, |l| l.index as usize + 1);
        let mut disk = self.disk.borrow_mut();
        disk.check()?;
        disk.entries.truncate(keep);
        disk.durable = disk.durable.min(keep);
        Ok(())
    }

    async fn purge(&mut self, _upto: LogId) -> io::Result<()> {
        Err(io::Error::other("the simulation purges nothing"))
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
