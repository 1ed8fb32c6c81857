//! The Raft log store of one partition: openraft's `RaftLogStorage` over io/'s `Log`.
//!
//! The partition log is the Raft log. Entry `i` is the `i - first_index`-th batch from the
//! log start; an in-memory list maps each entry to its batch's Kafka base offset and term.
//! It is rebuilt on open by walking the batch headers, and costs 16 bytes per batch kept.
//! `raft-meta` in the partition directory holds what the log cannot: the vote, the last
//! purged log id and the index of the first entry (written atomically, fsynced).
//!
//! openraft's contract says an appended entry is readable at once, before it is fsynced,
//! while io/ serves reads only up to the durable offset: entries not yet durable are kept in
//! `unflushed` (sharing the batch bytes) until the flusher passes them.
//!
//! Everything runs on the shard that owns the partition; the store and its readers share one
//! `Rc<RefCell<..>>` and no borrow is held across an await.
//!
//! The store is generic over the file system (`F`, glommio in the broker, the simulator's
//! disk in `ferrolog-sim`) and over openraft's type config (any config with a partition's
//! entry and vote types, so the simulator runs it on its own runtime).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::{Buf, BufMut};
use ferrolog_io::batch::BatchHeader;
use ferrolog_io::{Fs, GlommioFs, Log, LogConfig, LogError};
use openraft::impls::leader_id_std::LeaderId;

use crate::CommittedLeaderId;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{AsyncRuntime, RaftTypeConfig};

use crate::entry::{self, Entry, EntryLogId};
use crate::PartitionRaft;

/// The vote type of a partition group.
pub type Vote = <PartitionRaft as RaftTypeConfig>::Vote;

/// A type config the store serves: a partition's entries and votes, on any runtime.
pub trait PartitionTypes:
    RaftTypeConfig<
    R = (),
    NodeId = u64,
    Node = openraft::BasicNode,
    LeaderId = LeaderId<u64, u64>,
    Entry = Entry,
    Vote = Vote,
>
{
}

impl<C> PartitionTypes for C where
    C: RaftTypeConfig<
        R = (),
        NodeId = u64,
        Node = openraft::BasicNode,
        LeaderId = LeaderId<u64, u64>,
        Entry = Entry,
        Vote = Vote,
    >
{
}

/// Simulation only: fixes of the store that ferrolog-sim can undo on its own thread
/// (`--unfix purge`, `--unfix straddle`), to show that its checker finds the defects they
/// fix. Nothing else sets them.
#[doc(hidden)]
pub mod unfix {
    use std::cell::Cell;

    thread_local! {
        static PURGE_UNSYNCED: Cell<bool> = const { Cell::new(false) };
    }

    /// Undoes (or restores) the fix on this thread: a purge records its purge point without
    /// waiting for the batches below it to be on disk.
    pub fn set_purge_unsynced(undone: bool) {
        PURGE_UNSYNCED.with(|u| u.set(undone));
    }

    pub(crate) fn purge_unsynced() -> bool {
        PURGE_UNSYNCED.with(|u| u.get())
    }

    thread_local! {
        static STRADDLE_TRUNCATE: Cell<bool> = const { Cell::new(false) };
    }

    /// Undoes (or restores) the fix on this thread: a truncation of every entry, the first
    /// of whose batch holds the log start, cuts the log there (and fails: the cut is below
    /// the start) instead of bringing the start down to that batch first.
    pub fn set_straddle_truncate(undone: bool) {
        STRADDLE_TRUNCATE.with(|u| u.set(undone));
    }

    pub(crate) fn straddle_truncate() -> bool {
        STRADDLE_TRUNCATE.with(|u| u.get())
    }
}

/// File holding the vote, the last purged log id and the first entry's index.
const META_FILE: &str = "raft-meta";
const META_VERSION: u8 = 0;
/// Bytes read from the log per step when walking or reading entries.
const READ_CHUNK_BYTES: usize = 256 * 1024;

/// A clock in milliseconds since the epoch, passed in so a simulation can drive it.
pub type Clock = Rc<dyn Fn() -> i64>;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Meta {
    vote: Option<Vote>,
    /// The last committed entry, when the store persists it (see `LogStore::persist_committed`).
    committed: Option<EntryLogId>,
    purged: Option<EntryLogId>,
    /// Raft index of the first entry in the log (or of the next one, when there is none).
    first_index: u64,
    /// Kafka offset of that entry: batches below it are not entries (a purge that crashed
    /// before moving the log start left them).
    first_offset: i64,
}

struct Inner {
    dir: PathBuf,
    meta: Meta,
    /// Kafka base offset and term of every entry from `meta.first_index`, in index order.
    positions: VecDeque<(i64, u64)>,
    /// Entries appended but perhaps not yet durable: (index, offset after the batch, entry).
    unflushed: VecDeque<(u64, i64, Entry)>,
    /// The latest snapshot's last index and the Kafka offset after it (`StoreView::note_snapshot`).
    snapshot: Option<(u64, i64)>,
    /// The entry retention wants the next snapshot to end at (`StoreView::snapshot_through`).
    snapshot_to: Option<u64>,
}

impl Inner {
    fn next_index(&self) -> u64 {
        self.meta.first_index + self.positions.len() as u64
    }

    fn log_id(&self, index: u64) -> EntryLogId {
        let (_, term) = self.positions[(index - self.meta.first_index) as usize];
        EntryLogId::new(CommittedLeaderId::new(term), index)
    }

    fn last_log_id(&self) -> Option<EntryLogId> {
        match self.next_index().checked_sub(1) {
            Some(last) if !self.positions.is_empty() => Some(self.log_id(last)),
            _ => self.meta.purged,
        }
    }

    fn forget_durable(&mut self, durable: i64) {
        while self
            .unflushed
            .front()
            .is_some_and(|(_, end, _)| *end <= durable)
        {
            self.unflushed.pop_front();
        }
    }
}

/// One partition's Raft log, stored in its Kafka log.
pub struct LogStore<F: Fs = GlommioFs> {
    log: Rc<Log<F>>,
    inner: Rc<RefCell<Inner>>,
    clock: Clock,
    persist_committed: bool,
}

/// What the partition on top needs to know about the entries: where each one's batch
/// starts and ends in Kafka offsets, and which term wrote it.
pub struct StoreView<F: Fs = GlommioFs> {
    log: Rc<Log<F>>,
    inner: Rc<RefCell<Inner>>,
}

impl<F: Fs> Clone for StoreView<F> {
    fn clone(&self) -> Self {
        StoreView {
            log: self.log.clone(),
            inner: self.inner.clone(),
        }
    }
}

impl<F: Fs> StoreView<F> {
    /// A reader of the store's entries, as openraft reads them (the simulator's final check
    /// reads a broker replica's log through it).
    pub fn reader(&self) -> LogStoreReader<F> {
        LogStoreReader {
            log: self.log.clone(),
            inner: self.inner.clone(),
        }
    }

    /// Kafka offset of entry `index`'s batch, if the log holds it.
    pub fn base_offset(&self, index: u64) -> Option<i64> {
        let inner = self.inner.borrow();
        let i = index.checked_sub(inner.meta.first_index)? as usize;
        inner.positions.get(i).map(|p| p.0)
    }

    /// The partition directory.
    pub fn dir(&self) -> &Path {
        self.log.dir()
    }

    /// The file system the log lives on.
    pub fn fs(&self) -> &F {
        self.log.fs()
    }

    /// Index of the first entry the log holds (of the next one, when it holds none): the
    /// entries below it are purged, and covered by a snapshot.
    pub fn first_index(&self) -> u64 {
        self.inner.borrow().meta.first_index
    }

    /// The state machine took (or installed) a snapshot up to entry `index`, after which
    /// the log goes on at `next_offset`: a purge through `index` past the log end restarts
    /// the log there.
    pub fn note_snapshot(&self, index: u64, next_offset: i64) {
        let mut inner = self.inner.borrow_mut();
        if inner.snapshot.is_none_or(|(kept, _)| kept <= index) {
            inner.snapshot = Some((index, next_offset));
        }
    }

    /// The last index of the latest snapshot noted.
    pub fn snapshot_index(&self) -> Option<u64> {
        self.inner.borrow().snapshot.map(|(index, _)| index)
    }

    /// Retention will purge through entry `index`: the next snapshot ends there rather than
    /// at the last applied entry, so a follower that takes it starts its log where the
    /// leader's starts and still gets every entry the leader keeps. The largest index asked
    /// for wins (retention and DeleteRecords may ask at once): each purges through its own,
    /// and a snapshot past the smaller one still covers it.
    pub fn snapshot_through(&self, index: u64) {
        let mut inner = self.inner.borrow_mut();
        inner.snapshot_to = inner.snapshot_to.max(Some(index));
    }

    /// Where retention wants the next snapshot to end, if anywhere.
    pub fn snapshot_to(&self) -> Option<u64> {
        self.inner.borrow().snapshot_to
    }

    /// The id of entry `index`, if the log holds it or it is the last purged one.
    pub fn log_id(&self, index: u64) -> Option<EntryLogId> {
        let inner = self.inner.borrow();
        if index >= inner.meta.first_index && index < inner.next_index() {
            return Some(inner.log_id(index));
        }
        inner.meta.purged.filter(|p| p.index == index)
    }

    /// Kafka offset after entry `index`'s batch: the high watermark once it is committed.
    /// For the last purged entry it is where the log starts.
    pub fn end_offset(&self, index: u64) -> Option<i64> {
        let inner = self.inner.borrow();
        if index.checked_add(1) == Some(inner.meta.first_index) {
            return Some(inner.meta.first_offset);
        }
        let i = index.checked_sub(inner.meta.first_index)? as usize;
        if i >= inner.positions.len() {
            return None;
        }
        Some(match inner.positions.get(i + 1) {
            Some(next) => next.0,
            None => self.log.end_offset(),
        })
    }

    /// The last entry whose batch lies wholly below `offset`.
    pub fn last_index_below(&self, offset: i64) -> Option<u64> {
        let inner = self.inner.borrow();
        let mut below = inner.positions.partition_point(|p| p.0 < offset);
        let end_of_last = inner
            .positions
            .get(below)
            .map_or_else(|| self.log.end_offset(), |p| p.0);
        if below > 0 && end_of_last > offset {
            below -= 1; // that batch holds `offset`
        }
        let below = below as u64;
        (inner.meta.first_index + below)
            .checked_sub(1)
            .filter(|_| below > 0)
    }

    /// OffsetForLeaderEpoch: the largest term <= `term` in the log and the offset after its
    /// last batch (the start of the next term's first batch, or the log end), or `None`
    /// when every batch of the log has a larger term.
    pub fn end_offset_for_term(&self, term: u64) -> Option<(u64, i64)> {
        let inner = self.inner.borrow();
        let after = inner.positions.partition_point(|p| p.1 <= term);
        if after == 0 {
            return None;
        }
        let found_term = inner.positions[after - 1].1;
        let end = inner
            .positions
            .get(after)
            .map_or(self.log.end_offset(), |p| p.0);
        Some((found_term, end))
    }
}

/// A reader of the same log, for openraft's replication tasks.
pub struct LogStoreReader<F: Fs = GlommioFs> {
    log: Rc<Log<F>>,
    inner: Rc<RefCell<Inner>>,
}

impl<F: Fs> Clone for LogStoreReader<F> {
    fn clone(&self) -> Self {
        LogStoreReader {
            log: self.log.clone(),
            inner: self.inner.clone(),
        }
    }
}

fn io_err(e: LogError) -> io::Error {
    io::Error::other(e)
}

fn corrupt(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl LogStore {
    /// Opens the partition log in `dir` and the Raft state beside it.
    pub async fn open(dir: &Path, config: LogConfig, clock: Clock) -> io::Result<LogStore> {
        LogStore::open_on(GlommioFs, dir, config, clock).await
    }
}

impl<F: Fs> LogStore<F> {
    /// Opens the partition log in `dir` on `fs`, and the Raft state beside it.
    pub async fn open_on(
        fs: F,
        dir: &Path,
        config: LogConfig,
        clock: Clock,
    ) -> io::Result<LogStore<F>> {
        let log = Log::open_on(fs, dir, config, clock())
            .await
            .map_err(io_err)?;
        let meta = match log.fs().read(&log.dir().join(META_FILE)) {
            Ok(bytes) => decode_meta(&bytes)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Meta::default(),
            Err(e) => return Err(e),
        };
        let mut meta = meta;
        if log.end_offset() < meta.first_offset {
            // Every entry below the purge point is in the snapshot, and the log lost batches
            // up to it: a purge point recorded before they were on disk (by an older
            // version), or a snapshot install's `restart_at` cut short after a purge whose
            // start move a crash had undone. Appended at this end, the next entry would take
            // another Kafka offset than the leader gave it: the log goes on from the purge
            // point instead.
            tracing::warn!(dir = %dir.display(), end = log.end_offset(), purge_point = meta.first_offset,
                "the log ends below its purge point: starting it empty there");
            log.restart_at(meta.first_offset, clock())
                .await
                .map_err(io_err)?;
        }
        let positions = walk_headers(&log, meta.first_offset).await?;
        // A commit point past the log (written before the flusher, by an older version) is
        // dropped: the leader tells the node again.
        let last = meta.first_index + positions.len() as u64;
        if meta.committed.is_some_and(|c| c.index >= last) {
            meta.committed = None;
        }
        let inner = Inner {
            dir: log.dir().to_path_buf(),
            meta,
            positions,
            unflushed: VecDeque::new(),
            snapshot: None,
            snapshot_to: None,
        };
        Ok(LogStore {
            log,
            inner: Rc::new(RefCell::new(inner)),
            clock,
            persist_committed: false,
        })
    }

    /// Persists the commit point on every change, so a restarted node applies its committed
    /// entries at once instead of waiting for a leader. One small fsynced write per commit:
    /// right for the controller's rare changes, too costly for busy partitions.
    pub fn persist_committed(mut self) -> LogStore<F> {
        self.persist_committed = true;
        self
    }

    /// The partition's Kafka log, for the fetch path.
    pub fn log(&self) -> &Rc<Log<F>> {
        &self.log
    }

    /// A handle the partition keeps after the store moves into openraft.
    pub fn view(&self) -> StoreView<F> {
        StoreView {
            log: self.log.clone(),
            inner: self.inner.clone(),
        }
    }

    /// Whether the node never took part in the group: no entry, nothing purged, no vote.
    pub fn is_fresh(&self) -> bool {
        let inner = self.inner.borrow();
        inner.last_log_id().is_none() && inner.meta.vote.is_none()
    }

    /// A reader of the entries, as openraft's replication tasks get.
    pub fn reader(&self) -> LogStoreReader<F> {
        LogStoreReader {
            log: self.log.clone(),
            inner: self.inner.clone(),
        }
    }

    async fn write_meta(&self) -> io::Result<()> {
        let (path, bytes) = {
            let inner = self.inner.borrow();
            (inner.dir.join(META_FILE), encode_meta(&inner.meta))
        };
        self.log.fs().write_file(&path, bytes).await
    }
}

/// Base offset and term of every batch from the log start to the log end.
async fn walk_headers<F: Fs>(log: &Log<F>, from: i64) -> io::Result<VecDeque<(i64, u64)>> {
    let mut positions = VecDeque::new();
    // A log start set inside a batch (DeleteRecords) leaves that batch an entry.
    let mut offset = log.whole_batches_start().max(from);
    while offset < log.end_offset() {
        let bytes = log
            .read_whole_batches(offset, READ_CHUNK_BYTES)
            .await
            .map_err(io_err)?;
        if bytes.is_empty() {
            return Err(corrupt(format!("log has no batch at offset {offset}")));
        }
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let header = BatchHeader::parse(rest).map_err(|e| corrupt(e.to_string()))?;
            if header.base_offset < offset {
                // The read started inside an earlier batch.
                rest = &rest[header.total_bytes()..];
                continue;
            }
            let term = entry::term_of(&header).map_err(|e| corrupt(e.to_string()))?;
            positions.push_back((header.base_offset, term));
            offset = header.next_offset();
            rest = &rest[header.total_bytes()..];
        }
    }
    Ok(positions)
}

impl<C: PartitionTypes, F: Fs> RaftLogReader<C> for LogStoreReader<F> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        read_entries(&self.log, &self.inner, range).await
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        Ok(self.inner.borrow().meta.vote)
    }
}

/// The entries of `range` that the log holds, from io/ up to the durable offset and from
/// `unflushed` after it.
async fn read_entries<F: Fs, RB: RangeBounds<u64>>(
    log: &Log<F>,
    inner: &RefCell<Inner>,
    range: RB,
) -> io::Result<Vec<Entry>> {
    let (mut next, end) = {
        let mut st = inner.borrow_mut();
        st.forget_durable(log.durable_offset());
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&i) => i.saturating_add(1),
            Bound::Excluded(&i) => i,
            Bound::Unbounded => u64::MAX,
        };
        (start.max(st.meta.first_index), end.min(st.next_index()))
    };
    let mut out = Vec::new();
    while next < end {
        let (offset, memory) = {
            let st = inner.borrow();
            if next >= st.next_index() {
                break; // truncated meanwhile
            }
            if next < st.meta.first_index {
                // Purged meanwhile (openraft purges nothing its own readers are reading;
                // another reader may meet this): what was read is what the log still had.
                break;
            }
            let first_unflushed = st.unflushed.front().map_or(u64::MAX, |(i, _, _)| *i);
            if next >= first_unflushed {
                let (_, _, e) = &st.unflushed[(next - first_unflushed) as usize];
                (0, Some(e.clone()))
            } else {
                (st.positions[(next - st.meta.first_index) as usize].0, None)
            }
        };
        if let Some(e) = memory {
            out.push(e);
            next += 1;
            continue;
        }
        // Moved meanwhile: a purge took the log start past the read, or a truncation (whose
        // entries the store forgets only once the log is cut) took the durable end down to
        // it; entries appended since may have taken the end past it again. A read from the
        // disk is of a durable entry, below the durable end until a truncation. A deposed
        // leader's replication may read while its new leader truncates its tail.
        let moved = || next < inner.borrow().meta.first_index || offset >= log.durable_offset();
        let bytes = match log.read_whole_batches(offset, READ_CHUNK_BYTES).await {
            Ok(bytes) => bytes,
            Err(_) if moved() => break,
            Err(e) => return Err(io_err(e)),
        };
        if bytes.is_empty() {
            if moved() {
                break;
            }
            return Err(corrupt(format!(
                "entry {next} at offset {offset} is not in the log"
            )));
        }
        let mut rest = bytes;
        while !rest.is_empty() && next < end {
            let header = BatchHeader::parse(&rest).map_err(|e| corrupt(e.to_string()))?;
            let total = header.total_bytes();
            let expected = {
                let st = inner.borrow();
                let i = next.checked_sub(st.meta.first_index);
                i.and_then(|i| st.positions.get(i as usize)).map(|p| p.0)
            };
            if expected != Some(header.base_offset) {
                break; // the log changed under the read (cut or purged); go round again
            }
            let e = entry::decode(next, rest.slice(..total)).map_err(|e| corrupt(e.to_string()))?;
            out.push(e);
            rest.advance(total);
            next += 1;
        }
    }
    Ok(out)
}

impl<C: PartitionTypes, F: Fs> RaftLogStorage<C> for LogStore<F> {
    type LogReader = LogStoreReader<F>;

    async fn get_log_state(&mut self) -> io::Result<LogState<C>> {
        let inner = self.inner.borrow();
        Ok(LogState {
            last_purged_log_id: inner.meta.purged,
            last_log_id: inner.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> LogStoreReader<F> {
        self.reader()
    }

    async fn save_committed(&mut self, committed: Option<EntryLogId>) -> io::Result<()> {
        if !self.persist_committed || self.inner.borrow().meta.committed == committed {
            return Ok(());
        }
        // openraft may call this before the entry is on this node's disk; a commit point
        // past the durable log would not survive a crash, so it waits for the flusher.
        let end = committed.and_then(|c| self.view().end_offset(c.index));
        match end {
            Some(end) => self.log.wait_durable(end).await.map_err(io_err)?,
            None if committed.is_some() => return Ok(()),
            None => {}
        }
        self.inner.borrow_mut().meta.committed = committed;
        self.write_meta().await
    }

    async fn read_committed(&mut self) -> io::Result<Option<EntryLogId>> {
        Ok(self.inner.borrow().meta.committed)
    }

    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        self.inner.borrow_mut().meta.vote = Some(*vote);
        self.write_meta().await
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<C>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry>,
    {
        for e in entries {
            let index = e.log_id.index;
            let fresh_start = {
                let mut inner = self.inner.borrow_mut();
                if inner.positions.is_empty() && index != inner.meta.first_index {
                    // The first entry after a purge past the log end (or into an empty log)
                    // fixes where the index count starts.
                    inner.meta.first_index = index;
                    inner.meta.first_offset = self.log.end_offset();
                    true
                } else {
                    assert_eq!(index, inner.next_index(), "Raft appends leave no holes");
                    false
                }
            };
            if fresh_start {
                // The purge point must not be on disk before the batches below it are.
                let end = self.log.end_offset();
                self.log.wait_durable(end).await.map_err(io_err)?;
                self.write_meta().await?;
            }
            let term = e.log_id.leader_id.term;
            let bytes = entry::encode(&e, (self.clock)());
            let info = self
                .log
                .append(bytes, entry::epoch_of(term), (self.clock)())
                .map_err(io_err)?;
            let mut inner = self.inner.borrow_mut();
            inner.positions.push_back((info.base_offset, term));
            inner.unflushed.push_back((index, info.last_offset + 1, e));
        }
        let durable = self.log.wait_durable(self.log.end_offset());
        // Dropping the handle detaches the task.
        drop(C::AsyncRuntime::spawn(async move {
            callback.io_completed(durable.await.map_err(io_err));
        }));
        Ok(())
    }

    async fn truncate_after(&mut self, last_log_id: Option<EntryLogId>) -> io::Result<()> {
        let (offset, keep) = {
            let inner = self.inner.borrow();
            let keep_until = last_log_id.map_or(0, |l| l.index + 1);
            assert!(
                keep_until >= inner.meta.first_index || inner.positions.is_empty(),
                "truncating purged entries"
            );
            let keep = keep_until.saturating_sub(inner.meta.first_index) as usize;
            match inner.positions.get(keep) {
                Some(&(offset, _)) => (offset, keep),
                None => return Ok(()),
            }
        };
        if keep == 0 && !unfix::straddle_truncate() {
            // Every entry goes. The first one's batch may hold the log start (DeleteRecords
            // moved it inside the batch): the start then comes back to where that batch
            // began, the offset the leader's entry there has, and the log is cut there
            // (Kafka's truncate-fully-and-start-at); io decides under its segment-file lock.
            // Only a snapshot install after a restart truncates an applied entry (openraft no
            // longer knows it committed): its purge then restarts the log at the snapshot. A
            // crash part-way leaves the entries back, or none, with the next one to go at
            // that offset either way.
            self.log
                .truncate_from_below_start(offset, (self.clock)())
                .await
                .map_err(io_err)?;
        } else {
            self.log
                .truncate(offset, (self.clock)())
                .await
                .map_err(io_err)?;
        }
        let mut inner = self.inner.borrow_mut();
        inner.positions.truncate(keep);
        let next = inner.next_index();
        inner.unflushed.retain(|(i, _, _)| *i < next);
        Ok(())
    }

    async fn purge(&mut self, log_id: EntryLogId) -> io::Result<()> {
        let (new_start, restart) = {
            let mut inner = self.inner.borrow_mut();
            assert!(
                inner.meta.purged.is_none_or(|p| p.index <= log_id.index),
                "purge goes backwards"
            );
            let gone = (log_id.index + 1).saturating_sub(inner.meta.first_index) as usize;
            let gone = gone.min(inner.positions.len());
            let new_start = inner.positions.get(gone).map(|p| p.0);
            inner.positions.drain(..gone);
            inner.meta.purged = Some(log_id);
            inner.meta.first_index = inner.meta.first_index.max(log_id.index + 1);
            while inner
                .unflushed
                .front()
                .is_some_and(|(i, _, _)| *i <= log_id.index)
            {
                inner.unflushed.pop_front();
            }
            // Past the last entry, the log goes on where the snapshot through `log_id` says
            // (a follower that took its leader's snapshot), else at its own end.
            let (new_start, restart) = match new_start {
                Some(start) => (start, false),
                None => match inner.snapshot {
                    Some((index, next)) if index == log_id.index => {
                        (next, next != self.log.end_offset())
                    }
                    _ => (self.log.end_offset(), false),
                },
            };
            inner.meta.first_offset = new_start;
            (new_start, restart)
        };
        if restart {
            // The log holds no entry to keep. It is emptied before the purge point is
            // recorded: a crash in between leaves an empty log (or a prefix of the old one)
            // under the old purge point, and openraft purges again from the snapshot.
            self.log
                .restart_at(new_start, (self.clock)())
                .await
                .map_err(io_err)?;
            return self.write_meta().await;
        }
        // The batches below the purge point are on disk before it is: openraft applies, and
        // so snapshots and purges, entries this node has accepted but perhaps not yet
        // written. A purge point recorded first could outlive a crash that lost them, and
        // the next entry would then land at another Kafka offset than on the leader.
        if !unfix::purge_unsynced() {
            self.log.wait_durable(new_start).await.map_err(io_err)?;
        }
        // The purge point is recorded before the log start moves: a crash in between leaves
        // batches below the recorded start, which the next open skips.
        self.write_meta().await?;
        self.log.advance_start(new_start).await.map_err(io_err)?;
        Ok(())
    }
}

fn encode_meta(meta: &Meta) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.put_u8(META_VERSION);
    match &meta.vote {
        Some(v) => {
            out.put_u8(1);
            out.put_u64(v.leader_id.term);
            out.put_u64(v.leader_id.voted_for);
            out.put_u8(u8::from(v.committed));
        }
        None => out.put_u8(0),
    }
    for id in [&meta.purged, &meta.committed] {
        match id {
            Some(p) => {
                out.put_u8(1);
                out.put_u64(p.leader_id.term);
                out.put_u64(p.index);
            }
            None => out.put_u8(0),
        }
    }
    out.put_u64(meta.first_index);
    out.put_i64(meta.first_offset);
    let crc = crc32c::crc32c(&out);
    out.put_u32(crc);
    out
}

fn decode_meta(bytes: &[u8]) -> io::Result<Meta> {
    let bad = |what: &str| corrupt(format!("{META_FILE}: {what}"));
    let (body, crc) = bytes
        .split_at_checked(bytes.len().saturating_sub(4))
        .ok_or_else(|| bad("too short"))?;
    if crc.len() != 4
        || crc32c::crc32c(body) != u32::from_be_bytes(crc.try_into().expect("4 bytes"))
    {
        return Err(bad("checksum mismatch"));
    }
    let mut r = body;
    let need = |r: &[u8], n: usize| {
        if r.len() < n {
            Err(bad("cut short"))
        } else {
            Ok(())
        }
    };
    need(r, 2)?;
    if r.get_u8() != META_VERSION {
        return Err(bad("unknown version"));
    }
    let vote = match r.get_u8() {
        0 => None,
        _ => {
            need(r, 17)?;
            let term = r.get_u64();
            let voted_for = r.get_u64();
            let committed = r.get_u8() != 0;
            Some(Vote {
                leader_id: LeaderId { term, voted_for },
                committed,
            })
        }
    };
    let mut log_id = || {
        need(r, 1)?;
        match r.get_u8() {
            0 => Ok::<_, io::Error>(None),
            _ => {
                need(r, 16)?;
                let term = r.get_u64();
                Ok(Some(EntryLogId::new(
                    CommittedLeaderId::new(term),
                    r.get_u64(),
                )))
            }
        }
    };
    let purged = log_id()?;
    let committed = log_id()?;
    need(r, 16)?;
    let first_index = r.get_u64();
    let first_offset = r.get_i64();
    if !r.is_empty() {
        return Err(bad("trailing bytes"));
    }
    Ok(Meta {
        vote,
        committed,
        purged,
        first_index,
        first_offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_machine::PartitionStateMachine;
    use crate::GlommioRuntime;
    use openraft::testing::log::{StoreBuilder, Suite};
    use openraft::{ErrorSubject, ErrorVerb, StorageError};
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Removes a test's partition directory when the suite drops it.
    struct TempDir(PathBuf);

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    struct Builder;

    impl StoreBuilder<PartitionRaft, LogStore, PartitionStateMachine, TempDir> for Builder {
        async fn build(
            &self,
        ) -> Result<(TempDir, LogStore, PartitionStateMachine), StorageError<PartitionRaft>>
        {
            static SEQ: AtomicU64 = AtomicU64::new(0);
            let dir = std::env::temp_dir().join(format!(
                "ferrolog-raft-suite-{}-{}",
                std::process::id(),
                SEQ.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            // Small segments, so the suite's entries cross segment boundaries.
            let config = LogConfig {
                segment_bytes: 400,
                index_interval_bytes: 100,
                preallocate_bytes: 4096,
                cache_bytes_max: 300,
                ..LogConfig::default()
            };
            let store = LogStore::open(&dir, config, Rc::new(|| 1_700_000_000_000))
                .await
                .map_err(|e| StorageError::from_io_error(ErrorSubject::Logs, ErrorVerb::Read, e))?;
            Ok((
                TempDir(dir),
                store.persist_committed(),
                PartitionStateMachine::default(),
            ))
        }
    }

    fn id(term: u64, index: u64) -> EntryLogId {
        EntryLogId::new(CommittedLeaderId::new(term), index)
    }

    /// Offsets are assigned per batch as Kafka does, terms become leader epochs, and the
    /// log, the vote and the purge point come back after a reopen.
    #[test]
    fn entries_keep_offsets_terms_and_state_across_reopen() {
        use openraft::{EntryPayload, Membership};
        let dir = std::env::temp_dir().join(format!("ferrolog-raft-reopen-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let _guard = TempDir(dir.clone());
        let mut rt = <GlommioRuntime as AsyncRuntime>::new(1);
        rt.block_on(async move {
            let clock: Clock = Rc::new(|| 1_700_000_000_000);
            let config = LogConfig {
                segment_bytes: 300,
                ..LogConfig::default()
            };
            let mut store = LogStore::open(&dir, config.clone(), clock.clone())
                .await
                .unwrap();
            let members = Membership::new_with_defaults(vec![[1u64, 2, 3].into()], []);
            let entries = vec![
                Entry {
                    log_id: id(1, 1),
                    payload: EntryPayload::Blank,
                },
                Entry {
                    log_id: id(1, 2),
                    payload: EntryPayload::Membership(members.clone()),
                },
                Entry {
                    log_id: id(2, 3),
                    payload: EntryPayload::Normal(entry::test_batch(5)),
                },
                Entry {
                    log_id: id(2, 4),
                    payload: EntryPayload::Normal(entry::test_batch(1)),
                },
                Entry {
                    log_id: id(3, 5),
                    payload: EntryPayload::Normal(entry::test_batch(3)),
                },
                Entry {
                    log_id: id(3, 6),
                    payload: EntryPayload::Blank,
                },
            ];
            store
                .append(entries, IOFlushed::<PartitionRaft>::noop())
                .await
                .unwrap();
            // Readable at once, before the flusher has run.
            let mut reader = store.reader();
            let read = RaftLogReader::<PartitionRaft>::try_get_log_entries(&mut reader, 1..7);
            assert_eq!(read.await.unwrap().len(), 6);
            store
                .log()
                .wait_durable(store.log().end_offset())
                .await
                .unwrap();
            assert_eq!(store.log().end_offset(), 12);
            let vote = Vote {
                leader_id: LeaderId {
                    term: 3,
                    voted_for: 1,
                },
                committed: true,
            };
            RaftLogStorage::<PartitionRaft>::save_vote(&mut store, &vote)
                .await
                .unwrap();
            RaftLogStorage::<PartitionRaft>::purge(&mut store, id(1, 1))
                .await
                .unwrap();
            RaftLogStorage::<PartitionRaft>::truncate_after(&mut store, Some(id(3, 5)))
                .await
                .unwrap();
            assert_eq!(store.log().start_offset(), 1);
            assert_eq!(store.log().end_offset(), 11);
            drop((store, reader));

            let mut store = LogStore::open(&dir, config, clock).await.unwrap();
            let state = RaftLogStorage::<PartitionRaft>::get_log_state(&mut store)
                .await
                .unwrap();
            assert_eq!(state.last_purged_log_id, Some(id(1, 1)));
            assert_eq!(state.last_log_id, Some(id(3, 5)));
            let mut reader = store.reader();
            let vote_read = RaftLogReader::<PartitionRaft>::read_vote(&mut reader).await;
            assert_eq!(vote_read.unwrap(), Some(vote));
            let got = RaftLogReader::<PartitionRaft>::try_get_log_entries(&mut reader, 0..100)
                .await
                .unwrap();
            let ids: Vec<_> = got.iter().map(|e| e.log_id).collect();
            assert_eq!(ids, vec![id(1, 2), id(2, 3), id(2, 4), id(3, 5)]);
            assert_eq!(got[0].payload, EntryPayload::Membership(members));
            // Kafka offsets and leader epochs of the data batches, as consumers see them.
            let offsets: Vec<_> = got[1..]
                .iter()
                .map(|e| match &e.payload {
                    EntryPayload::Normal(b) => {
                        let h = ferrolog_io::batch::verify(&b.0).expect("valid batch");
                        (h.base_offset, h.last_offset(), h.partition_leader_epoch)
                    }
                    other => panic!("expected a data batch, got {other:?}"),
                })
                .collect();
            assert_eq!(offsets, vec![(2, 6, 2), (7, 7, 2), (8, 10, 3)]);
            let view = store.view();
            assert_eq!(
                (view.base_offset(3), view.end_offset(3)),
                (Some(2), Some(7))
            );
            assert_eq!(view.end_offset(5), Some(11));
            assert_eq!(view.end_offset(6), None);
            assert_eq!(view.end_offset_for_term(1), Some((1, 2)));
            assert_eq!(view.end_offset_for_term(2), Some((2, 8)));
            assert_eq!(view.end_offset_for_term(9), Some((3, 11)));
        });
    }

    /// A log that lost batches below its recorded purge point (a purge point written before
    /// they were on disk, then a crash) goes on from the purge point, so the next entry takes
    /// the Kafka offset the leader gave it.
    #[test]
    fn a_log_ending_below_its_purge_point_goes_on_from_it() {
        use openraft::EntryPayload;
        let dir =
            std::env::temp_dir().join(format!("ferrolog-raft-purge-point-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let _guard = TempDir(dir.clone());
        let mut rt = <GlommioRuntime as AsyncRuntime>::new(1);
        rt.block_on(async move {
            let clock: Clock = Rc::new(|| 1_700_000_000_000);
            let config = LogConfig::default();
            let data = |term, index, records| Entry {
                log_id: id(term, index),
                payload: EntryPayload::Normal(entry::test_batch(records)),
            };
            let mut store = LogStore::open(&dir, config.clone(), clock.clone())
                .await
                .unwrap();
            store
                .append(
                    vec![data(1, 1, 5), data(1, 2, 5)],
                    IOFlushed::<PartitionRaft>::noop(),
                )
                .await
                .unwrap();
            let end = store.log().end_offset();
            store.log().wait_durable(end).await.unwrap();
            assert_eq!(end, 10);
            drop(store);
            // What a crash leaves when the purge through entry 4 (offsets 10..20, never
            // written) was recorded first.
            let meta = Meta {
                purged: Some(id(1, 4)),
                first_index: 5,
                first_offset: 20,
                ..Meta::default()
            };
            std::fs::write(dir.join(META_FILE), encode_meta(&meta)).unwrap();
            let mut store = LogStore::open(&dir, config, clock).await.unwrap();
            let state = RaftLogStorage::<PartitionRaft>::get_log_state(&mut store);
            assert_eq!(state.await.unwrap().last_log_id, Some(id(1, 4)));
            store
                .append(vec![data(1, 5, 3)], IOFlushed::<PartitionRaft>::noop())
                .await
                .unwrap();
            let view = store.view();
            assert_eq!(
                view.base_offset(5),
                Some(20),
                "the leader's offset for entry 5"
            );
            assert_eq!(store.log().start_offset(), 20);
        });
    }

    /// openraft's conformance suite for log stores, on real segment files.
    #[test]
    fn openraft_log_store_suite() {
        let mut rt = <GlommioRuntime as AsyncRuntime>::new(1);
        rt.block_on(async {
            Suite::test_all(Builder)
                .await
                .expect("log store conformance");
        });
    }

    #[test]
    fn meta_round_trips_and_rejects_damage() {
        let meta = Meta {
            vote: Some(Vote {
                leader_id: LeaderId {
                    term: 9,
                    voted_for: 2,
                },
                committed: true,
            }),
            committed: Some(EntryLogId::new(CommittedLeaderId::new(4), 80)),
            purged: Some(EntryLogId::new(CommittedLeaderId::new(4), 77)),
            first_index: 78,
            first_offset: 1234,
        };
        let bytes = encode_meta(&meta);
        assert_eq!(decode_meta(&bytes).unwrap(), meta);
        assert_eq!(
            decode_meta(&encode_meta(&Meta::default())).unwrap(),
            Meta::default()
        );
        for cut in 0..bytes.len() {
            assert!(decode_meta(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut flipped = bytes.clone();
        flipped[3] ^= 1;
        assert!(decode_meta(&flipped).is_err());
    }

    /// A store on a simulated disk holding entries 1..=`entries` of term 1, three records
    /// each, all durable (run it on the simulator's executor).
    async fn sim_store(config: LogConfig, entries: u64) -> LogStore<crate::sim::fs::SimFs> {
        use crate::sim::SimRaft;
        let clock: Clock = Rc::new(|| 1_700_000_000_000);
        let disk = crate::sim::fs::SimFs::new();
        let mut store = LogStore::open_on(disk, Path::new("/p"), config, clock)
            .await
            .unwrap();
        let entries: Vec<Entry> = (1..=entries)
            .map(|i| Entry {
                log_id: id(1, i),
                payload: openraft::EntryPayload::Normal(entry::test_batch(3)),
            })
            .collect();
        let flushed = IOFlushed::<SimRaft>::noop();
        RaftLogStorage::<SimRaft>::append(&mut store, entries, flushed)
            .await
            .unwrap();
        let end = store.log().end_offset();
        store.log().wait_durable(end).await.unwrap();
        store
    }

    /// A read that a purge overtakes returns the entries the log still had when it began
    /// (openraft never purges under its own readers; another reader, such as the simulator's
    /// final check, may meet it). It used to compute an index below the purge point, which
    /// overflows and aborts the process.
    #[test]
    fn a_read_overtaken_by_a_purge_returns_what_it_read() {
        use crate::sim::runtime::{spawn_here, spawn_on, Sim, SimRuntime};
        use crate::sim::SimRaft;
        use std::time::Duration;

        let sim = Sim::new(1);
        let read = Rc::new(RefCell::new(None));
        let out = read.clone();
        spawn_on(1, async move {
            // No tail cache: reads go to the disk, and wait on it.
            let config = LogConfig {
                segment_bytes: 2000,
                cache_bytes_max: 0,
                ..LogConfig::default()
            };
            let mut store = sim_store(config, 60).await;
            let mut reader = store.reader();
            spawn_here(async move {
                let got = RaftLogReader::<SimRaft>::try_get_log_entries(&mut reader, 1..=60).await;
                *out.borrow_mut() =
                    Some(got.map(|e| e.iter().map(|e| e.log_id.index).collect::<Vec<_>>()));
            });
            // The reader is inside its disk read now.
            SimRuntime::sleep(Duration::from_micros(1)).await;
            RaftLogStorage::<SimRaft>::purge(&mut store, id(1, 40))
                .await
                .unwrap();
        });
        sim.run_until(sim.now() + Duration::from_secs(5));
        let got = read.borrow_mut().take().expect("the read ended");
        let indexes = got.expect("the read succeeds");
        let expected: Vec<u64> = (1..=indexes.len() as u64).collect();
        assert_eq!(
            indexes, expected,
            "a prefix of what was asked, without gaps"
        );
    }

    /// A truncation of every entry when the first one's batch holds the log start (moved
    /// inside it, as DeleteRecords does): openraft does this when a restarted node installs a
    /// snapshot that conflicts with its log. The start comes back to where that batch began
    /// and the log is cut there, empty; it used to try to cut below the log start, and the
    /// node's Raft core stopped.
    /// (Found by ferrolog-sim, seed 549.)
    #[test]
    fn truncating_a_batch_that_holds_the_log_start_restarts_the_log() {
        use crate::sim::runtime::{spawn_on, Sim};
        use crate::sim::SimRaft;
        use std::time::Duration;

        let sim = Sim::new(1);
        let done = Rc::new(RefCell::new(None));
        let out = done.clone();
        spawn_on(1, async move {
            let mut store = sim_store(LogConfig::default(), 6).await;
            // Entry 3's batch holds offsets 6..9; the log start moves to 7, inside it.
            RaftLogStorage::<SimRaft>::purge(&mut store, id(1, 2))
                .await
                .unwrap();
            store.log().advance_start(7).await.unwrap();
            let truncated = RaftLogStorage::<SimRaft>::truncate_after(&mut store, Some(id(1, 2)));
            let result = truncated.await.map(|()| {
                let log = store.log();
                (log.start_offset(), log.end_offset())
            });
            *out.borrow_mut() = Some(result.map_err(|e| e.to_string()));
        });
        sim.run_until(sim.now() + Duration::from_secs(5));
        let result = done.borrow_mut().take().expect("the truncation ended");
        assert_eq!(
            result,
            Ok((6, 6)),
            "the log starts again, empty, at entry 3's offset"
        );
    }
}
