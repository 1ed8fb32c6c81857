//! A partition log: an ordered list of segments with one writer, on one shard.
//!
//! Appends are synchronous and in memory: the batch gets its offsets, joins the pending queue
//! and the tail cache, and the caller learns its offsets at once. One flusher task per log
//! drains the pending queue with large aligned Direct I/O writes (the partial last page is
//! rewritten in place) and one `fdatasync` for everything it took: concurrent producers share
//! that sync (group commit). `durable_offset` moves only after the sync returns, and waiters
//! are woken in offset order.
//!
//! Invariants: `log_start <= durable <= end`; segment base offsets strictly increase; only the
//! last segment takes appends; a read never returns bytes past `durable`. After a write or sync
//! error the log refuses appends for good (reads go on) and every waiter gets the error.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use futures::channel::oneshot;

use crate::batch::{self, BatchHeader, HEADER_BYTES};
use crate::fs::{Fs, FsFile, FsReader, GlommioFs, WriteBuf};
use crate::segment::Segment;
use crate::txn_index::{self, AbortedTxn};
use crate::{LogConfig, LogError};

/// Direct I/O alignment used for every write position and size.
const ALIGN: u64 = 4096;
/// Largest single write the flusher submits.
const WRITE_CHUNK_BYTES_MAX: usize = 4 << 20;
/// First preallocation of a segment (small: 10,000 partitions reserve 640 MiB, not 10 GiB);
/// later ones double up to `LogConfig::preallocate_bytes`.
const PREALLOCATE_MIN_BYTES: u64 = 64 << 10;
/// Read size used while scanning a segment during recovery.
const SCAN_CHUNK_BYTES: usize = 1 << 20;
/// File in the partition directory that remembers the log start offset (DeleteRecords).
const LOG_START_FILE: &str = "log-start-offset";

/// What an append assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    pub base_offset: i64,
    pub last_offset: i64,
}

/// Simulation only: fixes of issue 17's defect g that ferrolog-sim can undo on its own
/// thread, to show that its checker finds the defects they fix. Nothing else sets them.
#[doc(hidden)]
pub mod unfix {
    use std::cell::Cell;

    thread_local! {
        static UNDONE: Cell<u16> = const { Cell::new(0) };
    }

    /// At open, the recovered tail is fsynced before the log calls it durable.
    pub const OPEN_SYNC: u16 = 1;
    /// A truncation syncs the directory after deleting later segments, before the cut.
    pub const TRUNCATE_DIR_SYNC: u16 = 2;
    /// A cut removes a closed segment's index files durably first, and open removes the
    /// last segment's, so stale index files are never trusted.
    pub const STALE_INDEXES: u16 = 4;
    /// Finishing rolled segments holds the segment-file lock, so it never runs beside a
    /// truncation, a restart or a deletion of segments.
    pub const FINISH_LOCK: u16 = 8;
    /// Moving the log start holds the segment-file lock, so concurrent moves write the start
    /// file in order.
    pub const START_LOCK: u16 = 16;
    /// A read that opens a segment's file, or has read from it, checks the segment is still
    /// the one it planned on, and plans again if it went, was cut or was remade.
    pub const RESHAPED_READ: u16 = 32;
    /// A failed log refuses to move its start.
    pub const FAILED_START: u16 = 64;
    /// Open deletes index files whose segment's log file is gone, before a segment made
    /// later at the same base could trust them.
    pub const ORPHAN_INDEXES: u16 = 128;
    /// A truncation lowers the log end before it cuts the file, so reads planned meanwhile
    /// stop below the cut, and a read ends at bytes past its limit that are no batch.
    pub const CUT_READ: u16 = 256;
    /// Open starts an empty log at the persisted start when every segment ends below it,
    /// instead of clamping the start down to the end in memory only.
    pub const START_PAST_END: u16 = 512;

    /// Undoes the fixes in `undone` (a set of the flags above) on this thread.
    pub fn set(undone: u16) {
        UNDONE.with(|u| u.set(undone));
    }

    pub(crate) fn undone(fix: u16) -> bool {
        UNDONE.with(|u| u.get() & fix != 0)
    }
}

struct Pending {
    segment_base: i64,
    bytes: Bytes,
    next_offset: i64,
}

struct State<F: Fs> {
    segments: Vec<Segment<F>>,
    log_start: i64,
    /// Offset after the last appended batch (LEO).
    end: i64,
    /// Offset after the last fsynced batch.
    durable: i64,
    pending: VecDeque<Pending>,
    pending_bytes: usize,
    /// Recently appended batches, newest last, for tail reads without disk I/O.
    cache: VecDeque<(i64, i64, Bytes)>,
    cache_bytes: usize,
    durable_waiters: VecDeque<(i64, oneshot::Sender<Result<(), LogError>>)>,
    change_waiters: Vec<oneshot::Sender<()>>,
    failed: Option<LogError>,
    config: LogConfig,
    /// The base of the first segment whose `.txnindex` did not decode at open: its aborted
    /// transactions, and those of every later segment, are the partition's to rebuild.
    txn_index_lost_from: Option<i64>,
}

/// One partition's log. Shard-local: wrap it in `Rc`, never share it across threads.
/// `F` is the file system under it: glommio's in the broker, a simulated one in ferrolog-sim.
pub struct Log<F: Fs = GlommioFs> {
    fs: F,
    dir: PathBuf,
    state: RefCell<State<F>>,
    flushing: Cell<bool>,
    /// Set by `close`: appends fail from then on.
    closing: Cell<bool>,
    /// Held by whatever creates, rewrites or deletes the files of segments other than by
    /// appending: finishing rolled segments (the flusher, the retention timer, `close`),
    /// truncating, restarting and deleting segments. Each of them looks segments up again
    /// after every await, so none may change the segment list under another.
    files: futures::lock::Mutex<()>,
}

fn io_error(context: &str, path: &Path, e: impl Into<std::io::Error>) -> LogError {
    LogError::Io(format!("{context} {}: {}", path.display(), e.into()))
}

impl Log {
    /// Opens (or creates) the log in `dir` on glommio; see [`Log::open_on`].
    pub async fn open(dir: &Path, config: LogConfig, now_ms: i64) -> Result<Rc<Log>, LogError> {
        Log::open_on(GlommioFs, dir, config, now_ms).await
    }
}

impl<F: Fs> Log<F> {
    /// Opens (or creates) the log in `dir` on `fs`, recovering the last segment by CRC: a torn
    /// or corrupt tail is cut off, indexes that are missing or do not fit are rebuilt.
    pub async fn open_on(
        fs: F,
        dir: &Path,
        config: LogConfig,
        now_ms: i64,
    ) -> Result<Rc<Log<F>>, LogError> {
        config.validate();
        // glommio opens directories with `openat(-1, ..)`, which takes absolute paths only;
        // every path of this log is derived from `dir`.
        let dir = &std::path::absolute(dir).map_err(|e| io_error("resolving", dir, e))?;
        if !fs.is_dir(dir) {
            fs.create_dir_all(dir)
                .map_err(|e| io_error("creating", dir, e))?;
            // A new directory is durable once its parent's entry is. (One created just before
            // a crash, before this sync, is the caller's to sync at start-up: the broker
            // syncs `log.dirs` once rather than every partition opening it again.)
            if let Some(parent) = dir.parent() {
                sync_dir(&fs, parent).await?;
            }
        }
        let names = fs.list(dir).map_err(|e| io_error("listing", dir, e))?;
        let mut bases: Vec<i64> = names
            .iter()
            .filter_map(|name| name.strip_suffix(".log").and_then(segment_base))
            .collect();
        bases.sort_unstable();
        if !unfix::undone(unfix::ORPHAN_INDEXES) {
            remove_orphan_indexes(&fs, dir, &names, &bases)?;
        }
        remove_temp_files(&fs, dir, &names)?;
        let mut segments = Vec::with_capacity(bases.len().max(1));
        let mut txn_index_lost_from = None;
        for (i, &base) in bases.iter().enumerate() {
            let last = i + 1 == bases.len();
            let mut segment = Segment::new(dir, base, now_ms);
            if let Some(prev) = segments.last() {
                let prev: &Segment<F> = prev;
                if prev.next_offset > base {
                    return Err(LogError::Corrupt(format!(
                        "{}: segment {base} overlaps the previous one ending at {}",
                        dir.display(),
                        prev.next_offset
                    )));
                }
            }
            let indexes_loaded = recover_segment(&fs, &mut segment, last, &config).await?;
            if !load_txn_index(&fs, &mut segment, last) && txn_index_lost_from.is_none() {
                txn_index_lost_from = Some(base);
            }
            segment.closed = !last;
            // A closed segment whose index files fit needs nothing more; one whose indexes
            // were rebuilt gets them written by `finish_closed_segments`.
            segment.finalized = !last && indexes_loaded;
            if segment.finalized {
                // Closed for good: no write handle needed (one descriptor per segment at most).
                segment.file = None;
            }
            segments.push(segment);
        }
        let persisted_start = read_log_start(&fs, &dir.join(LOG_START_FILE))?;
        let end = segments.last().map(|s: &Segment<F>| s.next_offset);
        if let Some((start, end)) = persisted_start.zip(end).filter(|(start, end)| start > end) {
            if !unfix::undone(unfix::START_PAST_END) {
                // A `restart_at` cut short left a prefix of the old log below the start it had
                // persisted. Every batch here is below the start: the log goes on from the
                // start, empty. Clamping the start down to the end instead would leave the
                // file saying more than memory, and once appends passed it, the next open
                // would move the start up past batches taken since.
                tracing::warn!(dir = %dir.display(), start, end,
                    "the log ends below its start: removing the segments below it");
                for seg in segments.drain(..) {
                    remove_files(&fs, &seg.paths())?;
                }
            }
        }
        if segments.is_empty() {
            // Retention may have deleted every segment before a crash: offsets go on from the
            // persisted log start, never back to 0.
            segments.push(Segment::new(
                dir,
                persisted_start.unwrap_or(0).max(0),
                now_ms,
            ));
        }
        // A truncation or retention cut short by the crash may have deleted segments without
        // syncing the directory: make what this open found (and the orphaned index files it
        // removed) the durable state before anything is appended to it.
        sync_dir(&fs, dir).await?;
        let first_base = segments[0].base_offset;
        let end = segments.last().expect("at least one segment").next_offset;
        let log_start = persisted_start.unwrap_or(first_base).clamp(first_base, end);
        let log = Log {
            fs,
            dir: dir.to_path_buf(),
            state: RefCell::new(State {
                segments,
                log_start,
                end,
                durable: end,
                pending: VecDeque::new(),
                pending_bytes: 0,
                cache: VecDeque::new(),
                cache_bytes: 0,
                durable_waiters: VecDeque::new(),
                change_waiters: Vec::new(),
                failed: None,
                config,
                txn_index_lost_from,
            }),
            flushing: Cell::new(false),
            closing: Cell::new(false),
            files: futures::lock::Mutex::new(()),
        };
        Ok(Rc::new(log))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file system the log lives on (the Raft store keeps its own small files there).
    pub fn fs(&self) -> &F {
        &self.fs
    }

    /// Offset after the last appended batch (the log end offset, LEO).
    pub fn end_offset(&self) -> i64 {
        self.state.borrow().end
    }

    /// Offset after the last batch known to be on disk.
    pub fn durable_offset(&self) -> i64 {
        self.state.borrow().durable
    }

    /// Base offset of the segment that takes appends.
    pub fn active_base_offset(&self) -> i64 {
        self.state
            .borrow()
            .segments
            .last()
            .expect("active segment")
            .base_offset
    }

    /// The lowest offset `read_whole_batches` reaches: the log start, or below it the base
    /// of the segment holding it (batches there stay on disk until the segment goes).
    pub fn whole_batches_start(&self) -> i64 {
        let st = self.state.borrow();
        st.segments[0].base_offset.min(st.log_start)
    }

    pub fn start_offset(&self) -> i64 {
        self.state.borrow().log_start
    }

    /// The storage error that stopped appends, if any.
    pub fn failure(&self) -> Option<LogError> {
        self.state.borrow().failed.clone()
    }

    /// Total bytes of all segments.
    pub fn size_bytes(&self) -> u64 {
        self.state.borrow().segments.iter().map(|s| s.size).sum()
    }

    pub fn set_config(&self, config: LogConfig) {
        config.validate();
        self.state.borrow_mut().config = config;
    }

    /// Largest timestamp in the log and the base offset of the batch carrying it.
    pub fn max_timestamp(&self) -> Option<(i64, i64)> {
        let st = self.state.borrow();
        st.segments
            .iter()
            .filter(|s| s.size > 0 && s.next_offset > st.log_start)
            .map(|s| (s.max_timestamp, s.max_timestamp_batch))
            .fold(None, |best: Option<(i64, i64)>, cur| match best {
                Some(b) if b.0 >= cur.0 => Some(b),
                _ => Some(cur),
            })
    }

    /// Appends one verified batch: sets its base offset and leader epoch and queues it for
    /// the flusher. Returns at once; `wait_durable` tells when it is on disk.
    pub fn append(
        self: &Rc<Self>,
        mut batch_bytes: BytesMut,
        leader_epoch: i32,
        now_ms: i64,
    ) -> Result<AppendInfo, LogError> {
        let info = {
            let mut guard = self.state.borrow_mut();
            let st = &mut *guard;
            if let Some(e) = &st.failed {
                return Err(e.clone());
            }
            if self.closing.get() {
                return Err(LogError::Closed);
            }
            let base_offset = st.end;
            batch::set_offset_and_epoch(&mut batch_bytes, base_offset, leader_epoch);
            let header = BatchHeader::parse(&batch_bytes).map_err(LogError::InvalidBatch)?;
            assert_eq!(
                header.total_bytes(),
                batch_bytes.len(),
                "append of a partial batch"
            );
            let total = batch_bytes.len() as u64;
            let needs_roll = {
                let active = st.segments.last().expect("active segment");
                active.size > 0
                    && (active.size + total > st.config.segment_bytes
                        || now_ms - active.created_ms >= st.config.segment_ms
                        || header.last_offset() - active.base_offset > i64::from(i32::MAX))
            };
            if needs_roll {
                st.segments
                    .last_mut()
                    .expect("active segment")
                    .seal_time_index();
                st.segments.last_mut().expect("active segment").closed = true;
                let segment = Segment::new(&self.dir, base_offset, now_ms);
                st.segments.push(segment);
            }
            let interval = st.config.index_interval_bytes;
            let active = st.segments.last_mut().expect("active segment");
            let position = active.size;
            active.track_batch(&header, position, interval);
            let segment_base = active.base_offset;
            let bytes = batch_bytes.freeze();
            st.end = header.next_offset();
            st.pending_bytes += bytes.len();
            st.pending.push_back(Pending {
                segment_base,
                bytes: bytes.clone(),
                next_offset: st.end,
            });
            st.cache_bytes += bytes.len();
            st.cache.push_back((base_offset, st.end, bytes));
            while st.cache_bytes > st.config.cache_bytes_max && st.cache.len() > 1 {
                let (_, _, old) = st.cache.pop_front().expect("non-empty cache");
                st.cache_bytes -= old.len();
            }
            AppendInfo {
                base_offset,
                last_offset: header.last_offset(),
            }
        };
        if !self.flushing.replace(true) {
            self.fs.spawn(self.clone().flush_loop());
        }
        Ok(info)
    }

    /// Bytes appended but not yet on disk. Callers use it for backpressure.
    pub fn pending_bytes(&self) -> usize {
        self.state.borrow().pending_bytes
    }

    /// Resolves once every offset below `end_offset` is fsynced, or with the storage error.
    pub fn wait_durable(
        &self,
        end_offset: i64,
    ) -> impl std::future::Future<Output = Result<(), LogError>> {
        let rx = {
            let mut st = self.state.borrow_mut();
            let (tx, rx) = oneshot::channel();
            if let Some(e) = &st.failed {
                let _ = tx.send(Err(e.clone()));
            } else if st.durable >= end_offset {
                let _ = tx.send(Ok(()));
            } else {
                // A waiter given up on (an acks=1 produce whose proposal failed) may wait for
                // an offset that is not coming soon: drop those now and then (amortized O(1)).
                let waiting = st.durable_waiters.len();
                if waiting >= 64 && waiting.is_power_of_two() {
                    st.durable_waiters.retain(|(_, w)| !w.is_canceled());
                }
                st.durable_waiters.push_back((end_offset, tx));
            }
            rx
        };
        async move { rx.await.unwrap_or(Err(LogError::Closed)) }
    }

    /// Resolves the next time the durable offset moves (or the log fails or closes).
    pub fn durable_changed(&self) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let mut st = self.state.borrow_mut();
        st.change_waiters.retain(|w| !w.is_canceled());
        st.change_waiters.push(tx);
        rx
    }

    async fn flush_loop(self: Rc<Self>) {
        loop {
            // Aborted-transaction indexes first: a marker is durable only after its entry.
            if let Err(e) = self.sync_txn_indexes().await {
                tracing::error!(dir = %self.dir.display(), error = %e,
                    "storage error: partition refuses writes from now on, reads go on");
                self.fail(e);
                self.flushing.set(false);
                return;
            }
            let taken: Vec<Pending> = {
                let mut st = self.state.borrow_mut();
                if st.failed.is_some() {
                    self.flushing.set(false);
                    return;
                }
                if st.pending.is_empty() {
                    if st.segments.iter().all(|s| s.aborted_synced) {
                        self.flushing.set(false);
                        return;
                    }
                    continue;
                }
                st.pending_bytes = 0;
                st.pending.drain(..).collect()
            };
            let new_durable = taken.last().expect("took pending").next_offset;
            match self.write_out(taken).await {
                Ok(()) => self.advance_durable(new_durable),
                Err(e) => {
                    tracing::error!(dir = %self.dir.display(), error = %e,
                        "storage error: partition refuses writes from now on, reads go on");
                    self.fail(e);
                    self.flushing.set(false);
                    return;
                }
            }
        }
    }

    /// Writes each segment's `.txnindex` that differs from its aborted transactions (removes
    /// it when there are none), under the segment-file lock.
    async fn sync_txn_indexes(&self) -> Result<(), LogError> {
        loop {
            if !self
                .state
                .borrow()
                .segments
                .iter()
                .any(|s| !s.aborted_synced)
            {
                return Ok(());
            }
            let _files = self.files.lock().await;
            let next = {
                let st = self.state.borrow();
                st.segments
                    .iter()
                    .find(|s| !s.aborted_synced)
                    .map(|s| (s.base_offset, s.txn_index_path(), s.aborted.clone()))
            };
            let Some((base, path, entries)) = next else {
                return Ok(());
            };
            if entries.is_empty() {
                remove_files(&self.fs, &[path])?;
                sync_dir(&self.fs, &self.dir).await?;
            } else {
                write_file_on(&self.fs, &path, txn_index::encode(&entries)).await?;
            }
            let mut st = self.state.borrow_mut();
            if let Some(seg) = find_segment_mut(&mut st.segments, base) {
                // Entries added meanwhile make another round.
                seg.aborted_synced = seg.aborted == entries;
            }
        }
    }

    /// Records a transaction aborted by the marker at `txn.last_offset`, which this log holds,
    /// in its segment's index; one already recorded is left alone. The index is on disk
    /// before anything appended after this call is durable.
    pub fn add_aborted(self: &Rc<Self>, txn: AbortedTxn) {
        {
            let mut st = self.state.borrow_mut();
            assert!(
                txn.first_offset <= txn.last_offset && txn.last_offset < st.end,
                "aborted transaction {txn:?} outside the log (end {})",
                st.end
            );
            let Some(seg) = st
                .segments
                .iter_mut()
                .rev()
                .find(|s| s.base_offset <= txn.last_offset)
            else {
                return; // below the log: deleted already
            };
            if !seg.add_aborted(txn) {
                return;
            }
        }
        if !self.flushing.replace(true) {
            self.fs.spawn(self.clone().flush_loop());
        }
    }

    /// The aborted transactions a read_committed fetch of `[from, upper)` returns: those
    /// whose marker is at or after `from` and which began below `upper`.
    pub fn aborted_txns(&self, from: i64, upper: i64) -> Vec<AbortedTxn> {
        let st = self.state.borrow();
        st.segments
            .iter()
            .filter(|s| s.next_offset > from)
            .flat_map(|s| &s.aborted)
            .filter(|e| e.last_offset >= from && e.first_offset < upper)
            .copied()
            .collect()
    }

    /// Aborted transactions below `below` that are not on disk yet: what a Raft snapshot
    /// ending there carries, as the entries it covers are not applied again.
    pub fn aborted_unsynced(&self, below: i64) -> Vec<AbortedTxn> {
        let st = self.state.borrow();
        st.segments
            .iter()
            .filter(|s| !s.aborted_synced && s.base_offset < below)
            .flat_map(|s| &s.aborted)
            .filter(|e| e.last_offset < below)
            .copied()
            .collect()
    }

    /// Where the aborted transactions stopped being known at open (a `.txnindex` that did not
    /// decode): the partition rebuilds them from there, or from below.
    pub fn txn_index_lost_from(&self) -> Option<i64> {
        self.state.borrow().txn_index_lost_from
    }

    fn advance_durable(&self, new_durable: i64) {
        let mut st = self.state.borrow_mut();
        assert!(new_durable >= st.durable, "durable offset goes backwards");
        assert!(new_durable <= st.end, "durable offset past the log end");
        st.durable = new_durable;
        // Waiters register in roughly, not strictly, offset order (they come from tasks on
        // several connections), so look at all of them; there are at most as many as
        // requests in flight.
        let (done, waiting): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut st.durable_waiters)
            .into_iter()
            .partition(|(end, _)| *end <= new_durable);
        st.durable_waiters = waiting;
        for (_, tx) in done {
            let _ = tx.send(Ok(()));
        }
        for w in st.change_waiters.drain(..) {
            let _ = w.send(());
        }
    }

    fn fail(&self, e: LogError) {
        let mut st = self.state.borrow_mut();
        for (_, tx) in st.durable_waiters.drain(..) {
            let _ = tx.send(Err(e.clone()));
        }
        for w in st.change_waiters.drain(..) {
            let _ = w.send(());
        }
        st.failed = Some(e);
    }

    /// Writes the taken batches segment by segment, closes segments that were rolled, and
    /// fsyncs the segment written last.
    async fn write_out(&self, taken: Vec<Pending>) -> Result<(), LogError> {
        let mut i = 0;
        while i < taken.len() {
            let base = taken[i].segment_base;
            let mut j = i;
            while j < taken.len() && taken[j].segment_base == base {
                j += 1;
            }
            self.write_segment(base, &taken[i..j]).await?;
            // A rolled segment gets its exact size before the next segment's file exists, so
            // a crash never leaves padding inside a closed segment.
            self.finish_closed_segments().await?;
            i = j;
        }
        Ok(())
    }

    async fn write_segment(&self, base: i64, chunks: &[Pending]) -> Result<(), LogError> {
        // Only the flusher changes `synced`, `allocated` and `tail`, so one look suffices.
        let (file, synced, allocated, head, path, segment_bytes, step) = {
            let st = self.state.borrow();
            let seg = find_segment(&st.segments, base).expect("pending segment exists");
            (
                seg.file.clone(),
                seg.synced,
                seg.allocated,
                seg.tail.clone(),
                seg.log_path(),
                st.config.segment_bytes,
                st.config.preallocate_bytes,
            )
        };
        let file = match file {
            Some(f) => f,
            None => {
                let f = Rc::new(
                    self.fs
                        .create_new(&path)
                        .await
                        .map_err(|e| io_error("creating", &path, e))?,
                );
                sync_dir(&self.fs, &self.dir).await?;
                let mut st = self.state.borrow_mut();
                let seg = find_segment_mut(&mut st.segments, base).expect("segment exists");
                seg.file = Some(f.clone());
                f
            }
        };
        let added: usize = chunks.iter().map(|c| c.bytes.len()).sum();
        let end = synced + added as u64;
        // Preallocate in large steps so the file is not fragmented by many small extensions.
        if end > allocated {
            // Grow geometrically from PREALLOCATE_MIN_BYTES up to the configured step, so a
            // partition that holds little data reserves little disk (10,000 idle partitions
            // must not reserve 10,000 full steps).
            let grow = allocated.clamp(PREALLOCATE_MIN_BYTES, step.max(PREALLOCATE_MIN_BYTES));
            let target = (end + grow).min(segment_bytes.max(end));
            let target = target.div_ceil(ALIGN) * ALIGN;
            // Preallocation only helps layout: when it fails (a nearly full disk), write on
            // and let the write itself report ENOSPC if the space is really gone.
            let reserved = match file.pre_allocate(target).await {
                Ok(()) => target,
                Err(e) => {
                    tracing::debug!(path = %path.display(), error = %e, "preallocation failed");
                    end
                }
            };
            let mut st = self.state.borrow_mut();
            if let Some(seg) = find_segment_mut(&mut st.segments, base) {
                seg.allocated = reserved;
            }
        }
        // The partial page at the current end is rewritten whole, from the copy kept in memory.
        let aligned_start = synced / ALIGN * ALIGN;
        let head_len = head.len();
        assert_eq!(
            head_len as u64,
            synced - aligned_start,
            "tail page copy out of step"
        );
        let mut source = ChunkCursor::new(&head, chunks);
        let mut pos = aligned_start;
        let total = head_len + added;
        let mut remaining = total;
        let mut new_tail = Vec::new();
        while remaining > 0 {
            let n = remaining.min(WRITE_CHUNK_BYTES_MAX);
            let padded = (n as u64).div_ceil(ALIGN) as usize * ALIGN as usize;
            let mut buf = file.alloc(padded);
            let dst = buf.bytes_mut();
            source.copy_to(&mut dst[..n]);
            dst[n..].fill(0);
            if remaining == n {
                let tail_from = (end / ALIGN * ALIGN - pos) as usize;
                new_tail = dst[tail_from..n].to_vec();
            }
            let written = file
                .write_at(buf, pos)
                .await
                .map_err(|e| io_error("writing", &path, e))?;
            if written != padded {
                return Err(LogError::Io(format!(
                    "short write to {}: {written} of {padded} bytes",
                    path.display()
                )));
            }
            pos += n as u64;
            remaining -= n;
        }
        file.fdatasync()
            .await
            .map_err(|e| io_error("syncing", &path, e))?;
        {
            let mut st = self.state.borrow_mut();
            let seg = find_segment_mut(&mut st.segments, base).expect("segment exists");
            seg.synced = end;
            seg.tail = new_tail;
            assert!(seg.synced <= seg.size, "synced past the segment size");
        }
        Ok(())
    }

    /// Rolled segments whose bytes are all on disk get their exact size (no padding) and
    /// their index files, once. The flusher, the retention timer and `close` all call it;
    /// the segment-file lock keeps it from running beside another call, a truncation or a
    /// deletion, any of which would have it write index files for a segment that is gone or
    /// mark a new segment with the same base finished.
    async fn finish_closed_segments(&self) -> Result<(), LogError> {
        let _files = if unfix::undone(unfix::FINISH_LOCK) {
            None
        } else {
            Some(self.files.lock().await)
        };
        loop {
            let next = {
                let st = self.state.borrow();
                st.segments
                    .iter()
                    .find(|s| s.closed && !s.finalized && s.synced == s.size && s.file.is_some())
                    .map(|seg| {
                        (
                            seg.base_offset,
                            seg.file.clone().expect("checked"),
                            seg.synced,
                            seg.encode_index(),
                            seg.encode_time_index(),
                            seg.index_path(),
                            seg.time_index_path(),
                            seg.log_path(),
                        )
                    })
            };
            let Some((base, file, size, index, time_index, index_path, time_path, log_path)) = next
            else {
                return Ok(());
            };
            finish_segment_files(
                &self.fs,
                &*file,
                size,
                index,
                time_index,
                &index_path,
                &time_path,
                &log_path,
            )
            .await?;
            let mut st = self.state.borrow_mut();
            if let Some(seg) = find_segment_mut(&mut st.segments, base) {
                seg.finalized = true;
                seg.file = None;
            }
        }
    }

    /// Whether a read at `offset` finds it in the in-memory tail rather than on disk.
    pub fn is_cached(&self, offset: i64) -> bool {
        let st = self.state.borrow();
        st.cache.front().is_some_and(|(base, _, _)| *base <= offset)
    }

    /// Reads whole batches starting with the one that contains `offset`, at most `max_bytes`,
    /// never at or past `limit_offset` nor past the durable offset. With `oversized_first`
    /// the first batch comes whole even when larger than `max_bytes` (KIP-74); without it
    /// such a batch is not returned. Empty when there is nothing to read.
    pub async fn read(
        &self,
        offset: i64,
        max_bytes: usize,
        limit_offset: i64,
        oversized_first: bool,
    ) -> Result<Bytes, LogError> {
        self.read_above(false, offset, max_bytes, limit_offset, oversized_first)
            .await
    }

    /// `read` that also reaches the batches below the log start in its segment, so a log
    /// start set inside a batch (DeleteRecords) leaves that batch readable: Raft reads its
    /// entries whole.
    pub async fn read_whole_batches(
        &self,
        offset: i64,
        max_bytes: usize,
    ) -> Result<Bytes, LogError> {
        self.read_above(true, offset, max_bytes, i64::MAX, true)
            .await
    }

    async fn read_above(
        &self,
        below_start: bool,
        offset: i64,
        max_bytes: usize,
        limit_offset: i64,
        oversized_first: bool,
    ) -> Result<Bytes, LogError> {
        // A retention, truncation or restart may delete or remake a segment while a read of
        // it waits on the disk: the read then plans again on the log as it now is (and finds
        // the offset out of range if it went). Each round needs another such change.
        for _ in 0..RESHAPED_READ_ROUNDS {
            let read = self
                .read_planned(
                    below_start,
                    offset,
                    max_bytes,
                    limit_offset,
                    oversized_first,
                )
                .await?;
            if let Some(bytes) = read {
                return Ok(bytes);
            }
        }
        Err(LogError::Io(format!(
            "{}: the segments changed under {RESHAPED_READ_ROUNDS} reads at offset {offset} in a row",
            self.dir.display()
        )))
    }

    /// One round of `read_above`: `None` when a segment it planned to read is gone or remade.
    async fn read_planned(
        &self,
        below_start: bool,
        offset: i64,
        max_bytes: usize,
        limit_offset: i64,
        oversized_first: bool,
    ) -> Result<Option<Bytes>, LogError> {
        let (limit, from_cache, disk_plan) = {
            let st = self.state.borrow();
            let floor = if below_start {
                self.whole_batches_start()
            } else {
                st.log_start
            };
            if offset < floor || offset > st.end {
                return Err(LogError::OffsetOutOfRange {
                    requested: offset,
                    log_start: st.log_start,
                    log_end: st.end,
                });
            }
            let limit = limit_offset.min(st.durable);
            if offset >= limit {
                return Ok(Some(Bytes::new()));
            }
            if st.cache.front().is_some_and(|(base, _, _)| *base <= offset) {
                (
                    limit,
                    Some(collect_cached(&st.cache, offset, max_bytes, limit)),
                    Vec::new(),
                )
            } else {
                (limit, None, plan_disk_read(&st.segments, offset))
            }
        };
        if let Some(bytes) = from_cache {
            let first_too_big =
                BatchHeader::parse(&bytes).is_ok_and(|h| h.total_bytes() > max_bytes);
            if first_too_big && !oversized_first {
                return Ok(Some(Bytes::new()));
            }
            return Ok(Some(bytes));
        }
        for (base, generation, reader, start_pos, end_pos, seg_offset) in disk_plan {
            let file = match reader {
                Some(f) => f,
                None => match self.open_segment_reader(base, generation).await? {
                    Some(f) => f,
                    None => return Ok(None),
                },
            };
            let read = read_from_segment(
                &*file,
                &self
                    .dir
                    .join(format!("{}.log", crate::segment::file_stem(base))),
                start_pos..end_pos,
                seg_offset,
                max_bytes,
                limit,
                oversized_first,
            )
            .await;
            // A cut shortens the file in place and appends then reuse its positions, so the
            // bytes count only if the segment planned on is still there, unchanged (`cut`
            // renews its generation before it touches the file); else the caller plans again.
            if !unfix::undone(unfix::RESHAPED_READ) && !self.has_segment(base, generation) {
                return Ok(None);
            }
            if let Some(bytes) = read? {
                return Ok(Some(bytes));
            }
        }
        Ok(Some(Bytes::new()))
    }

    fn has_segment(&self, base: i64, generation: u64) -> bool {
        find_segment(&self.state.borrow().segments, base)
            .is_some_and(|s| s.generation == generation)
    }

    /// Read handles are opened on the first read that misses the tail cache, so a partition
    /// read only from the cache (most of 10,000 busy partitions) holds one descriptor, not two.
    /// `None` when the segment planned on (`base`, `generation`) is gone or was remade, before
    /// or while its file opened: the handle could be for another file, or none.
    async fn open_segment_reader(
        &self,
        base: i64,
        generation: u64,
    ) -> Result<Option<Rc<F::Reader>>, LogError> {
        let path = self
            .dir
            .join(format!("{}.log", crate::segment::file_stem(base)));
        let opened = open_reader(&self.fs, &path).await;
        let mut st = self.state.borrow_mut();
        if unfix::undone(unfix::RESHAPED_READ) {
            let reader = opened?;
            return Ok(Some(match find_segment_mut(&mut st.segments, base) {
                Some(seg) => seg.reader.get_or_insert(reader).clone(),
                None => reader,
            }));
        }
        let Some(seg) =
            find_segment_mut(&mut st.segments, base).filter(|s| s.generation == generation)
        else {
            return Ok(None);
        };
        let reader = opened?;
        Ok(Some(seg.reader.get_or_insert(reader).clone()))
    }

    /// The first batch, at or after `log_start`, whose largest timestamp is >= `timestamp`.
    pub async fn find_batch_by_timestamp(
        &self,
        timestamp: i64,
        limit_offset: i64,
    ) -> Result<Option<Bytes>, LogError> {
        let start = {
            let st = self.state.borrow();
            let limit = limit_offset.min(st.durable);
            let segment = st.segments.iter().find(|s| {
                s.max_timestamp >= timestamp
                    && s.next_offset > st.log_start
                    && s.base_offset < limit
            });
            match segment {
                None => return Ok(None),
                Some(s) => s.offset_for_timestamp(timestamp).max(st.log_start),
            }
        };
        let mut offset = start;
        // Each round reads at most one index interval worth of batches; bounded by the log end.
        loop {
            let bytes = self.read(offset, 64 * 1024, limit_offset, true).await?;
            if bytes.is_empty() {
                return Ok(None);
            }
            let mut rest = &bytes[..];
            while rest.len() >= HEADER_BYTES {
                let header = BatchHeader::parse(rest).map_err(LogError::InvalidBatch)?;
                let total = header.total_bytes();
                if header.max_timestamp >= timestamp {
                    let at = bytes.len() - rest.len();
                    return Ok(Some(bytes.slice(at..at + total)));
                }
                offset = header.next_offset();
                rest = &rest[total..];
            }
        }
    }

    /// Moves the log start forward (DeleteRecords) and deletes segments wholly below it. (Only
    /// `truncate_from_below_start` and `restart_at` ever move it back.)
    pub async fn advance_start(&self, new_start: i64) -> Result<i64, LogError> {
        Ok(self.advance_start_deleting(new_start).await?.0)
    }

    /// `advance_start`, also telling how many segments it deleted.
    async fn advance_start_deleting(&self, new_start: i64) -> Result<(i64, usize), LogError> {
        // Under the segment-file lock, so concurrent calls (retention beside DeleteRecords)
        // write the start file in the order they move the start: the file never goes back.
        let _files = if unfix::undone(unfix::START_LOCK) {
            None
        } else {
            Some(self.files.lock().await)
        };
        let start = {
            let mut st = self.state.borrow_mut();
            // A failed log's memory may not match its disk (a truncation or restart failed
            // part-way): it moves nothing until a restart reopens what is there.
            if let Some(e) = st
                .failed
                .as_ref()
                .filter(|_| !unfix::undone(unfix::FAILED_START))
            {
                return Err(e.clone());
            }
            if new_start > st.durable {
                return Err(LogError::OffsetOutOfRange {
                    requested: new_start,
                    log_start: st.log_start,
                    log_end: st.durable,
                });
            }
            st.log_start = st.log_start.max(new_start);
            st.log_start
        };
        write_file_on(
            &self.fs,
            &self.dir.join(LOG_START_FILE),
            start.to_string().into_bytes(),
        )
        .await?;
        let deleted = self.delete_segments_below(start).await?;
        Ok((start, deleted))
    }

    /// Applies `retention.ms` and `retention.bytes`: deletes the oldest closed, fully durable
    /// segments that are past either limit, and moves the log start past them.
    pub async fn apply_retention(
        &self,
        now_ms: i64,
        retention_ms: i64,
        retention_bytes: i64,
    ) -> Result<usize, LogError> {
        let new_start = self
            .retention_point(now_ms, retention_ms, retention_bytes)
            .await?;
        match new_start {
            Some(start) if start > self.start_offset() => {
                // Counted by the deletion itself: segments may roll while this waits for
                // the segment-file lock.
                Ok(self.advance_start_deleting(start).await?.1)
            }
            _ => Ok(0),
        }
    }

    /// Where `retention.ms` and `retention.bytes` would start the log: after the oldest
    /// closed, fully durable segments past either limit (a batch boundary), if any.
    pub async fn retention_point(
        &self,
        now_ms: i64,
        retention_ms: i64,
        retention_bytes: i64,
    ) -> Result<Option<i64>, LogError> {
        self.finish_closed_segments().await?;
        let new_start = {
            let st = self.state.borrow();
            let mut total: i64 = st.segments.iter().map(|s| s.size as i64).sum();
            let mut new_start = None;
            for seg in &st.segments {
                let deletable = seg.finalized && seg.next_offset <= st.durable;
                if !deletable {
                    break;
                }
                let too_old = retention_ms >= 0
                    && seg.max_timestamp >= 0
                    && now_ms - seg.max_timestamp > retention_ms;
                let too_big = retention_bytes >= 0 && total - seg.size as i64 >= retention_bytes;
                if !(too_old || too_big) {
                    break;
                }
                total -= seg.size as i64;
                new_start = Some(seg.next_offset);
            }
            new_start
        };
        Ok(new_start)
    }

    /// Deletes the closed segments wholly below `start` and says how many; the caller holds
    /// `files`.
    async fn delete_segments_below(&self, start: i64) -> Result<usize, LogError> {
        let doomed: Vec<Segment<F>> = {
            let mut st = self.state.borrow_mut();
            let keep_from = st
                .segments
                .iter()
                .position(|s| s.next_offset > start || !s.closed)
                .unwrap_or(st.segments.len() - 1);
            let doomed: Vec<Segment<F>> = st.segments.drain(..keep_from).collect();
            while st.cache.front().is_some_and(|(_, next, _)| *next <= start) {
                let (_, _, b) = st.cache.pop_front().expect("non-empty");
                st.cache_bytes -= b.len();
            }
            doomed
        };
        if doomed.is_empty() {
            return Ok(0);
        }
        for seg in &doomed {
            remove_files(&self.fs, &seg.paths())?;
            tracing::info!(dir = %self.dir.display(), base = seg.base_offset, "deleted segment");
        }
        // The new log start is already durable, so any subset of these deletions may come
        // back after a power loss without harm (open keeps segments below the start); the
        // sync frees their space for good.
        sync_dir(&self.fs, &self.dir).await?;
        Ok(doomed.len())
    }

    /// Removes every batch at or after `offset`, which must be a batch boundary in
    /// `[log start, log end]`. Raft uses it to drop a follower's uncommitted entries that
    /// conflict with the leader's log. The caller must not append until it returns.
    ///
    /// Later segments are deleted newest first and the segment holding `offset` is cut and
    /// fsynced, so a crash part-way leaves a prefix of the old log, never a hole. The cut
    /// segment becomes the active one and is rescanned (with CRC checks) to rebuild its
    /// indexes: a cost proportional to the segment, paid only on a conflict.
    pub async fn truncate(&self, offset: i64, now_ms: i64) -> Result<(), LogError> {
        if !self.truncation_needed(offset)? {
            return Ok(());
        }
        self.quiesce("truncating").await?;
        let _files = self.files.lock().await;
        // Again under the lock: the start may have moved past `offset` (or the log failed)
        // while this waited, and `cut` relies on a segment at or below `offset`.
        if !self.truncation_needed(offset)? {
            return Ok(());
        }
        // From here on the files change: an error part-way leaves memory and disk
        // disagreeing, so the log takes nothing more until a restart reopens what is on disk.
        let cut = self.cut(offset, now_ms).await;
        if let Err(e) = &cut {
            self.fail(e.clone());
        }
        cut
    }

    /// `truncate` at the base of the batch that holds the log start (DeleteRecords moved the
    /// start inside it), or of an earlier batch of the first segment: the start comes down to
    /// `offset` first, durably, then the log is cut there, under one hold of the segment-file
    /// lock. A crash part-way leaves the batches from `offset` on under the old or the new
    /// start, or the cut log: never a start past the log end, which the next open would take
    /// for an empty log at that start. Raft uses it when it truncates every entry of a log
    /// whose start lies inside the first entry's batch. Kafka's log start moves back the same
    /// way when a follower truncates below it (truncate-fully-and-start-at).
    pub async fn truncate_from_below_start(
        &self,
        offset: i64,
        now_ms: i64,
    ) -> Result<(), LogError> {
        self.quiesce("truncating").await?;
        let _files = self.files.lock().await;
        {
            let st = self.state.borrow();
            if let Some(e) = &st.failed {
                return Err(e.clone());
            }
            let floor = st.segments[0].base_offset.min(st.log_start);
            if offset < floor || offset > st.end {
                return Err(LogError::OffsetOutOfRange {
                    requested: offset,
                    log_start: st.log_start,
                    log_end: st.end,
                });
            }
        }
        if offset < self.start_offset() {
            // Atomic and durable: either start is consistent with the batches on disk, but
            // after an error memory may not say which, so the log takes nothing more until a
            // restart reopens what is there (as after a failed truncation).
            let written = write_file_on(
                &self.fs,
                &self.dir.join(LOG_START_FILE),
                offset.to_string().into_bytes(),
            )
            .await;
            if let Err(e) = written {
                self.fail(e.clone());
                return Err(e);
            }
            // No await from here to the cut's lowering of the end: no read sees the start
            // moved back with the batches past it still there.
            self.state.borrow_mut().log_start = offset;
        }
        if offset == self.end_offset() {
            return Ok(());
        }
        let cut = self.cut(offset, now_ms).await;
        if let Err(e) = &cut {
            self.fail(e.clone());
        }
        cut
    }

    /// Whether a truncation at `offset` has anything to remove; an error when the log failed
    /// or `offset` is outside `[log start, log end]`.
    fn truncation_needed(&self, offset: i64) -> Result<bool, LogError> {
        let st = self.state.borrow();
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        if offset < st.log_start || offset > st.end {
            return Err(LogError::OffsetOutOfRange {
                requested: offset,
                log_start: st.log_start,
                log_end: st.end,
            });
        }
        Ok(offset < st.end)
    }

    /// `truncate` once the flusher is idle.
    async fn cut(&self, offset: i64, now_ms: i64) -> Result<(), LogError> {
        let (doomed, keep, config, was_closed) = {
            let mut st = self.state.borrow_mut();
            let keep = st
                .segments
                .iter()
                .rposition(|s| s.base_offset <= offset)
                .expect("a segment at or below an offset >= log start");
            let doomed: Vec<Segment<F>> = st.segments.drain(keep + 1..).collect();
            // Reads planned from now on stop below the cut: the bytes past it may change at
            // any await below (a read already under way plans again, by the generation).
            if !unfix::undone(unfix::CUT_READ) {
                lower_end(&mut st, offset);
            }
            let config = st.config.clone();
            let seg = &mut st.segments[keep];
            seg.renew_generation();
            (
                doomed,
                (seg.base_offset, seg.position_for(offset)),
                config,
                seg.closed,
            )
        };
        // The deletions must be durable before the cut, and each before the next: after a
        // power loss, a segment that came back past a cut or deleted one would put dropped
        // entries back behind a hole. (A file system may keep any subset of the unsynced
        // deletions of a directory, so one sync after all of them is not enough.)
        self.delete_newest_first(&doomed).await?;
        let (base, scan_from) = keep;
        let mut seg = Segment::new(&self.dir, base, now_ms);
        if was_closed && !unfix::undone(unfix::STALE_INDEXES) {
            // A closed segment's index files describe batches about to go: they go first,
            // durably, or a power loss could bring them back beside the cut log file.
            remove_files(&self.fs, &[seg.index_path(), seg.time_index_path()])?;
            sync_dir(&self.fs, &self.dir).await?;
        }
        let path = seg.log_path();
        let cut = if offset == base {
            0
        } else {
            let reader = open_reader(&self.fs, &path).await?;
            batch_position(&*reader, &path, scan_from, offset).await?
        };
        let file = self
            .fs
            .open_rw(&path)
            .await
            .map_err(|e| io_error("opening", &path, e))?;
        file.truncate(cut)
            .await
            .map_err(|e| io_error("truncating", &path, e))?;
        file.fdatasync()
            .await
            .map_err(|e| io_error("syncing", &path, e))?;
        let _ = file.close().await;
        recover_segment(&self.fs, &mut seg, true, &config).await?;
        if seg.next_offset != offset || seg.size != cut {
            // The file changed under the log (or the disk returned other bytes): the caller
            // fails the log rather than trust either picture.
            return Err(LogError::Corrupt(format!(
                "{}: cut at byte {cut} for offset {offset}, but the rescan found {} bytes \
                 ending at offset {}",
                path.display(),
                seg.size,
                seg.next_offset
            )));
        }
        let mut st = self.state.borrow_mut();
        let kept = st.segments.last_mut().expect("kept segment");
        // Its aborted transactions below the cut, those recorded while this awaited too; the
        // flusher writes the file again before anything appended from here on is durable.
        seg.aborted = std::mem::take(&mut kept.aborted);
        seg.aborted.retain(|e| e.last_offset < offset);
        seg.aborted_synced = false;
        *kept = seg;
        lower_end(&mut st, offset);
        for (_, tx) in st.durable_waiters.drain(..) {
            let _ = tx.send(Err(LogError::Truncated));
        }
        for w in st.change_waiters.drain(..) {
            let _ = w.send(());
        }
        tracing::info!(dir = %self.dir.display(), offset, "truncated the log");
        Ok(())
    }

    /// Deletes `doomed` (whole segments, oldest first in the slice) newest first, syncing the
    /// directory after each, so that a power loss at any moment leaves a prefix of them.
    async fn delete_newest_first(&self, doomed: &[Segment<F>]) -> Result<(), LogError> {
        for seg in doomed.iter().rev() {
            remove_files(&self.fs, &seg.paths())?;
            if !unfix::undone(unfix::TRUNCATE_DIR_SYNC) {
                sync_dir(&self.fs, &self.dir).await?;
            }
        }
        Ok(())
    }

    /// Waits until everything appended is on disk (or failed) and the flusher is idle, so
    /// files can change under it. The caller must not append meanwhile.
    async fn quiesce(&self, doing: &str) -> Result<(), LogError> {
        let end = self.end_offset();
        self.wait_durable(end).await?;
        let mut rounds = 0u32;
        while self.flushing.get() {
            if rounds >= 60_000 {
                return Err(LogError::Io(format!(
                    "{}: the flusher did not finish within a minute; not {doing}",
                    self.dir.display()
                )));
            }
            self.fs.sleep(std::time::Duration::from_millis(1)).await;
            rounds += 1;
        }
        assert_eq!(self.end_offset(), end, "append while {doing}");
        Ok(())
    }

    /// Empties the log and starts it again at `offset`, which may lie past its end (Kafka's
    /// truncate-fully-and-start-at): Raft uses it when a follower takes a leader's snapshot
    /// because the entries it lacks are gone from the leader. The caller must not append
    /// until it returns.
    ///
    /// Segments are deleted newest first and the new start is written last, so a crash
    /// part-way leaves a prefix of the old log (as a truncation would) or an empty log at
    /// the old start, and the caller starts again.
    pub async fn restart_at(&self, offset: i64, now_ms: i64) -> Result<(), LogError> {
        assert!(offset >= 0, "a log cannot start at {offset}");
        if let Some(e) = &self.state.borrow().failed {
            return Err(e.clone());
        }
        self.quiesce("restarting").await?;
        let _files = self.files.lock().await;
        let doomed: Vec<Segment<F>> = self.state.borrow_mut().segments.drain(..).collect();
        {
            let mut st = self.state.borrow_mut();
            st.segments.push(Segment::new(&self.dir, offset, now_ms));
            st.log_start = offset;
            st.end = offset;
            st.durable = offset;
            st.cache.clear();
            st.cache_bytes = 0;
            for (_, tx) in st.durable_waiters.drain(..) {
                let _ = tx.send(Err(LogError::Truncated));
            }
            for w in st.change_waiters.drain(..) {
                let _ = w.send(());
            }
        }
        // The deletions are made durable before the new start is written: old segments
        // that came back after a power loss would overlap the new one's offsets.
        let removed = async {
            self.delete_newest_first(&doomed).await?;
            write_file_on(
                &self.fs,
                &self.dir.join(LOG_START_FILE),
                offset.to_string().into_bytes(),
            )
            .await
        }
        .await;
        if let Err(e) = removed {
            // Memory and disk disagree now: the log takes nothing more until a restart, whose
            // open sees a prefix of the old log or an empty one at the old start (and the
            // caller's recovery starts again).
            self.fail(e.clone());
            return Err(e);
        }
        tracing::info!(dir = %self.dir.display(), offset, "restarted the log empty");
        Ok(())
    }

    /// Stops taking appends, waits until everything appended is on disk and the flusher is
    /// idle, and finishes rolled segments. The active segment keeps its zero padding:
    /// recovery strips it, and truncating under a running flush could cut acknowledged data.
    pub async fn close(&self) -> Result<(), LogError> {
        self.closing.set(true);
        let end = self.end_offset();
        self.wait_durable(end).await?;
        // The flusher may still be finishing rolled segments; it stops on its own.
        let mut rounds = 0u32;
        while self.flushing.get() {
            assert!(
                rounds < 60_000,
                "flusher did not stop within a minute of close"
            );
            self.fs.sleep(std::time::Duration::from_millis(1)).await;
            rounds += 1;
        }
        self.finish_closed_segments().await
    }
}

/// Cuts the zero padding after the last batch and writes both index files.
#[allow(clippy::too_many_arguments)]
async fn finish_segment_files<F: Fs>(
    fs: &F,
    file: &F::File,
    size: u64,
    index: Vec<u8>,
    time_index: Vec<u8>,
    index_path: &Path,
    time_path: &Path,
    log_path: &Path,
) -> Result<(), LogError> {
    file.truncate(size)
        .await
        .map_err(|e| io_error("truncating", log_path, e))?;
    file.fdatasync()
        .await
        .map_err(|e| io_error("syncing", log_path, e))?;
    write_file_on(fs, index_path, index).await?;
    write_file_on(fs, time_path, time_index).await?;
    Ok(())
}

/// Makes `offset` the log end (and durable end), dropping cached batches at or past it.
fn lower_end<F: Fs>(st: &mut State<F>, offset: i64) {
    st.end = offset;
    st.durable = offset;
    st.cache.retain(|(b, _, _)| *b < offset);
    st.cache_bytes = st.cache.iter().map(|(_, _, b)| b.len()).sum();
}

fn find_segment<F: Fs>(segments: &[Segment<F>], base: i64) -> Option<&Segment<F>> {
    segments.iter().rev().find(|s| s.base_offset == base)
}

fn find_segment_mut<F: Fs>(segments: &mut [Segment<F>], base: i64) -> Option<&mut Segment<F>> {
    segments.iter_mut().rev().find(|s| s.base_offset == base)
}

fn collect_cached(
    cache: &VecDeque<(i64, i64, Bytes)>,
    offset: i64,
    max_bytes: usize,
    limit: i64,
) -> Bytes {
    let first = cache.partition_point(|(_, next, _)| *next <= offset);
    let mut parts: Vec<&Bytes> = Vec::new();
    let mut total = 0;
    for (base, _, bytes) in cache.iter().skip(first) {
        if *base >= limit || (!parts.is_empty() && total + bytes.len() > max_bytes) {
            break;
        }
        total += bytes.len();
        parts.push(bytes);
    }
    match parts.len() {
        0 => Bytes::new(),
        1 => parts[0].clone(),
        _ => {
            let parts: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
            crate::pool::concat(&parts, total)
        }
    }
}

/// A segment to read from: its base and generation, its read handle if already open, the position to start
/// at, the durable end, and the offset to look for.
type ReadPlan<R> = (i64, u64, Option<Rc<R>>, u64, u64, i64);

/// How many times in a row a read plans again after segments change under it.
const RESHAPED_READ_ROUNDS: usize = 3;

/// For a read at `offset`: the segments to try in order. Usually one; more when the offset
/// falls in a gap.
fn plan_disk_read<F: Fs>(segments: &[Segment<F>], offset: i64) -> Vec<ReadPlan<F::Reader>> {
    let i = segments
        .partition_point(|s| s.base_offset <= offset)
        .saturating_sub(1);
    segments[i..]
        .iter()
        .filter(|s| s.synced > 0)
        .map(|s| {
            let target = offset.max(s.base_offset);
            (
                s.base_offset,
                s.generation,
                s.reader.clone(),
                s.position_for(target),
                s.synced,
                target,
            )
        })
        .take(4)
        .collect()
}

/// Reads from one segment; `None` when `offset` lies beyond this segment's batches.
async fn read_from_segment<R: FsReader>(
    file: &R,
    path: &Path,
    span: std::ops::Range<u64>,
    offset: i64,
    max_bytes: usize,
    limit: i64,
    oversized_first: bool,
) -> Result<Option<Bytes>, LogError> {
    let (mut pos, end) = (span.start, span.end);
    // Find the batch that contains `offset`: at most one index interval of headers.
    let first = loop {
        if pos + HEADER_BYTES as u64 > end {
            return Ok(None);
        }
        let r = file
            .read_at(pos, HEADER_BYTES)
            .await
            .map_err(|e| io_error("reading", path, e))?;
        let header = BatchHeader::parse(&r).map_err(LogError::InvalidBatch)?;
        if header.next_offset() > offset {
            break header;
        }
        pos += header.total_bytes() as u64;
    };
    if first.base_offset >= limit || (!oversized_first && first.total_bytes() > max_bytes) {
        return Ok(Some(Bytes::new()));
    }
    let want = (first.total_bytes().max(max_bytes) as u64).min(end - pos) as usize;
    let r = file
        .read_at(pos, want)
        .await
        .map_err(|e| io_error("reading", path, e))?;
    // Keep whole batches below the limit; the first is always whole (it fits `want`).
    let mut keep = 0;
    let mut rest = &r[..];
    while rest.len() >= HEADER_BYTES {
        // Past the first batch, bytes that are no batch end the read rather than fail it:
        // while a truncation cuts this file and appends reuse it, whatever lies past the
        // cut (at or past `limit`, which the cut lowered) may be padding or half-written. A
        // read that starts there meets them as its first batch, and fails.
        let header = match BatchHeader::parse(rest) {
            Ok(header) => header,
            Err(_) if keep > 0 && !unfix::undone(unfix::CUT_READ) => break,
            Err(e) => return Err(LogError::InvalidBatch(e)),
        };
        if header.base_offset >= limit || header.total_bytes() > rest.len() {
            break;
        }
        if keep > 0 && keep + header.total_bytes() > max_bytes {
            break;
        }
        keep += header.total_bytes();
        rest = &rest[header.total_bytes()..];
    }
    // The bytes hold on to the whole buffer read: copied when they would waste most of it.
    if keep < r.len() / 2 {
        return Ok(Some(crate::pool::concat(&[&r[..keep]], keep)));
    }
    Ok(Some(r.slice(..keep)))
}

/// Copies the tail-page head and then the pending chunks into write buffers, in order.
struct ChunkCursor<'a> {
    parts: Vec<&'a [u8]>,
    part: usize,
    at: usize,
}

impl<'a> ChunkCursor<'a> {
    fn new(head: &'a [u8], chunks: &'a [Pending]) -> Self {
        let mut parts = vec![head];
        parts.extend(chunks.iter().map(|c| &c.bytes[..]));
        ChunkCursor {
            parts,
            part: 0,
            at: 0,
        }
    }

    fn copy_to(&mut self, mut dst: &mut [u8]) {
        while !dst.is_empty() {
            let src = &self.parts[self.part][self.at..];
            let n = src.len().min(dst.len());
            dst[..n].copy_from_slice(&src[..n]);
            dst = &mut dst[n..];
            self.at += n;
            if self.at == self.parts[self.part].len() {
                self.part += 1;
                self.at = 0;
            }
        }
    }
}

/// Makes the entries of `dir` (files created, deleted or renamed in it) durable.
async fn sync_dir<F: Fs>(fs: &F, dir: &Path) -> Result<(), LogError> {
    fs.sync_dir(dir)
        .await
        .map_err(|e| io_error("syncing", dir, e))
}

/// Deletes `paths`; one already gone is fine.
fn remove_files<F: Fs>(fs: &F, paths: &[PathBuf]) -> Result<(), LogError> {
    for path in paths {
        match fs.remove(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_error("deleting", path, e)),
        }
    }
    Ok(())
}

/// The log start that `advance_start` or `restart_at` wrote, if any. Only a missing file
/// means none: a file that cannot be read (EIO, too many open files) or holds no number
/// fails the open, since guessing would start the log at its first segment and bring back
/// records deleted below the start.
fn read_log_start<F: Fs>(fs: &F, path: &Path) -> Result<Option<i64>, LogError> {
    let bytes = match fs.read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error("reading", path, e)),
    };
    let start = std::str::from_utf8(&bytes)
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .filter(|start| *start >= 0);
    match start {
        Some(start) => Ok(Some(start)),
        None => Err(LogError::Corrupt(format!(
            "{}: not a log start offset: {:?}",
            path.display(),
            String::from_utf8_lossy(&bytes)
        ))),
    }
}

/// The base offset a segment file's stem names (20 digits), if it is one.
fn segment_base(stem: &str) -> Option<i64> {
    stem.parse::<i64>().ok().filter(|_| stem.len() == 20)
}

/// Removes index files whose segment's log file is gone. A power loss can keep any subset
/// of a directory's unsynced deletions, so a deleted segment's index files may come back
/// without its log file; a segment made later at the same base would then trust an index
/// of other batches and fail to open. (Kafka's log loader deletes such orphans too.)
fn remove_orphan_indexes<F: Fs>(
    fs: &F,
    dir: &Path,
    names: &[String],
    bases: &[i64],
) -> Result<(), LogError> {
    let orphans: Vec<PathBuf> = names
        .iter()
        .filter(|name| {
            let stem = name
                .strip_suffix(".index")
                .or_else(|| name.strip_suffix(".timeindex"))
                .or_else(|| name.strip_suffix(".txnindex"));
            stem.and_then(segment_base)
                .is_some_and(|base| bases.binary_search(&base).is_err())
        })
        .map(|name| dir.join(name))
        .collect();
    for path in &orphans {
        tracing::info!(path = %path.display(), "deleting an index file whose segment is gone");
    }
    remove_files(fs, &orphans)
}

/// Deletes what a crash inside `Fs::write_file` left behind: its temp files
/// (`<name>.<n>.tmp`), never renamed over `<name>`. Nothing writes in the directory while
/// the log opens, so none of them is a write in progress.
fn remove_temp_files<F: Fs>(fs: &F, dir: &Path, names: &[String]) -> Result<(), LogError> {
    let temps: Vec<PathBuf> = names
        .iter()
        .filter(|name| {
            let seq = name.strip_suffix(".tmp").and_then(|s| s.rsplit_once('.'));
            seq.is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|name| dir.join(name))
        .collect();
    for path in &temps {
        tracing::info!(path = %path.display(), "deleting a temp file a crash left behind");
    }
    remove_files(fs, &temps)
}

/// Byte position of the batch starting at `offset`, walking headers from `from`. The offset
/// must be a batch boundary: anything else is a caller bug.
async fn batch_position<R: FsReader>(
    reader: &R,
    path: &Path,
    from: u64,
    offset: i64,
) -> Result<u64, LogError> {
    let mut pos = from;
    loop {
        let bytes = reader
            .read_at(pos, HEADER_BYTES)
            .await
            .map_err(|e| io_error("reading", path, e))?;
        let header = BatchHeader::parse(&bytes).map_err(LogError::InvalidBatch)?;
        if header.base_offset == offset {
            return Ok(pos);
        }
        assert!(
            header.next_offset() <= offset,
            "truncate offset {offset} is inside the batch at {}",
            header.base_offset
        );
        pos += header.total_bytes() as u64;
    }
}

async fn open_reader<F: Fs>(fs: &F, path: &Path) -> Result<Rc<F::Reader>, LogError> {
    fs.open_read(path)
        .await
        .map_err(|e| io_error("opening", path, e))
}

/// Writes a small file atomically and durably (temp file, fsync, rename, directory fsync).
pub async fn write_file(path: &Path, contents: Vec<u8>) -> Result<(), LogError> {
    write_file_on(&GlommioFs, path, contents).await
}

async fn write_file_on<F: Fs>(fs: &F, path: &Path, contents: Vec<u8>) -> Result<(), LogError> {
    fs.write_file(path, contents)
        .await
        .map_err(|e| LogError::Io(format!("writing small file: {e}")))
}

/// Loads a segment's aborted transactions (none without a `.txnindex`); false when the file
/// does not decode, which leaves the segment without them. The active segment's file is
/// written before the markers it lists are durable (`Log::sync_txn_indexes`), so entries
/// past its recovered end are dropped.
fn load_txn_index<F: Fs>(fs: &F, seg: &mut Segment<F>, last: bool) -> bool {
    let path = seg.txn_index_path();
    let bytes = match fs.read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return true,
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e,
                "cannot read a transaction index: its aborted transactions are lost");
            seg.aborted_synced = false;
            return false;
        }
    };
    let upper = if last { i64::MAX } else { seg.next_offset };
    match txn_index::decode(&bytes, seg.base_offset, upper) {
        Ok(mut entries) => {
            let all = entries.len();
            entries.retain(|e| e.last_offset < seg.next_offset);
            seg.aborted_synced = entries.len() == all;
            seg.aborted = entries;
            true
        }
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e,
                "damaged transaction index: its aborted transactions are lost");
            seg.aborted_synced = false;
            false
        }
    }
}

/// Opens a segment's log file and restores its in-memory state. The last segment is scanned
/// and CRC-checked batch by batch and cut at the first bad batch; closed segments load their
/// index files when those fit, and are scanned otherwise.
async fn recover_segment<F: Fs>(
    fs: &F,
    seg: &mut Segment<F>,
    last: bool,
    config: &LogConfig,
) -> Result<bool, LogError> {
    let path = seg.log_path();
    let file = fs
        .open_rw(&path)
        .await
        .map_err(|e| io_error("opening", &path, e))?;
    let file_size = file
        .file_size()
        .await
        .map_err(|e| io_error("sizing", &path, e))?;
    let reader = open_reader(fs, &path).await?;
    let mut scan_from = 0u64;
    if last {
        // The active segment's index files are written when it closes, so any found now are
        // stale: left by a truncation whose deletion a power loss undid. Trusted once this
        // segment closes, they would point into batches that are no longer there.
        if !unfix::undone(unfix::STALE_INDEXES) {
            remove_files(fs, &[seg.index_path(), seg.time_index_path()])?;
        }
    } else {
        let index = fs.read(&seg.index_path()).unwrap_or_default();
        let times = fs.read(&seg.time_index_path()).unwrap_or_default();
        if seg.load_indexes(&index, &times, file_size) {
            scan_from = u64::from(seg.index.last().expect("loaded index").1);
        }
    }
    let index_loaded = !seg.index.is_empty();
    // Scan from `scan_from`: with loaded indexes only the tail after the last index entry is
    // walked (headers only); otherwise everything, with CRC checks on the last segment.
    let mut pos = scan_from;
    let mut buf: Vec<u8> = Vec::new();
    let mut buf_start = pos;
    let mut cut: Option<String> = None;
    if index_loaded {
        // Recompute size and next offset from the last indexed batch on.
        seg.size = pos;
    }
    loop {
        if pos >= file_size {
            break;
        }
        let in_buf = (pos - buf_start) as usize;
        if in_buf + HEADER_BYTES > buf.len() {
            buf_start = pos;
            let n = SCAN_CHUNK_BYTES.min((file_size - pos) as usize);
            let r = reader
                .read_at(pos, n)
                .await
                .map_err(|e| io_error("reading", &path, e))?;
            buf = r.to_vec();
            if buf.len() < HEADER_BYTES {
                cut = Some(format!("{} trailing bytes", buf.len()));
                break;
            }
        }
        let in_buf = (pos - buf_start) as usize;
        let header = match BatchHeader::parse(&buf[in_buf..]) {
            Ok(h) => h,
            Err(e) => {
                cut = Some(e.to_string());
                break;
            }
        };
        let total = header.total_bytes();
        if pos + total as u64 > file_size {
            cut = Some(format!("batch at {pos} runs past the end of the file"));
            break;
        }
        if !seg.fits(&header, pos) {
            cut = Some(format!(
                "batch at {pos} has offsets {}..={} that do not follow {}",
                header.base_offset,
                header.last_offset(),
                seg.next_offset
            ));
            break;
        }
        if last {
            if in_buf + total > buf.len() {
                let r = reader
                    .read_at(pos, total)
                    .await
                    .map_err(|e| io_error("reading", &path, e))?;
                buf = r.to_vec();
                buf_start = pos;
            }
            let in_buf = (pos - buf_start) as usize;
            if let Err(e) = batch::verify(&buf[in_buf..in_buf + total]) {
                cut = Some(e.to_string());
                break;
            }
        }
        if index_loaded && pos == scan_from {
            // The indexed batch itself: already in the index; just account for it.
            seg.size = pos + total as u64;
            seg.next_offset = header.next_offset();
            seg.bytes_since_index = total as u32;
        } else {
            seg.track_batch(&header, pos, config.index_interval_bytes);
        }
        pos += total as u64;
    }
    if let Some(reason) = cut {
        // What follows the cut: Direct I/O pads the last page with zeros, so a segment that
        // was rolled just before a crash may still end in padding; that is not damage.
        let rest = (file_size - pos) as usize;
        let zeros_only = rest <= ALIGN as usize && {
            let r = reader
                .read_at(pos, rest)
                .await
                .map_err(|e| io_error("reading", &path, e))?;
            r.iter().all(|&x| x == 0)
        };
        if !last && !zeros_only {
            return Err(LogError::Corrupt(format!(
                "{}: closed segment is damaged at byte {pos}: {reason}",
                path.display()
            )));
        }
        if pos < file_size {
            if zeros_only {
                tracing::debug!(path = %path.display(), pos, "dropping zero padding after the last batch");
            } else {
                tracing::warn!(path = %path.display(), pos, file_size, %reason,
                    "truncating torn or corrupt tail of the log");
            }
        }
    }
    if pos < file_size {
        file.truncate(pos)
            .await
            .map_err(|e| io_error("truncating", &path, e))?;
    }
    if (last && !unfix::undone(unfix::OPEN_SYNC)) || pos < file_size {
        // The log calls everything it holds durable once open, but the tail may have been
        // written and never synced before a crash of the process: sync it now.
        file.fdatasync()
            .await
            .map_err(|e| io_error("syncing", &path, e))?;
    }
    seg.size = pos;
    seg.synced = pos;
    seg.allocated = pos;
    let aligned = pos / ALIGN * ALIGN;
    if aligned < pos {
        let r = reader
            .read_at(aligned, (pos - aligned) as usize)
            .await
            .map_err(|e| io_error("reading", &path, e))?;
        assert_eq!(r.len() as u64, pos - aligned, "short read of the tail page");
        seg.tail = r.to_vec();
    }
    seg.file = Some(Rc::new(file));
    // The scan's read handle is dropped here; reads reopen one when they need the disk.
    Ok(index_loaded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::make_batch;

    /// Runs a test on a glommio executor, reading with Direct I/O as the broker's shards do
    /// (where the temporary directory's device takes it).
    fn run<F: std::future::Future<Output = ()> + 'static>(f: impl FnOnce() -> F + Send + 'static) {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .spawn(|| async move {
                let dir = std::env::temp_dir();
                crate::fs::probe_direct_reads(&dir).await;
                f().await
            })
            .expect("executor")
            .join()
            .expect("test body");
    }

    fn tmpdir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ferrolog-io-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn small() -> LogConfig {
        LogConfig {
            segment_bytes: 10_000,
            index_interval_bytes: 500,
            preallocate_bytes: 8192,
            cache_bytes_max: 1000,
            ..LogConfig::default()
        }
    }

    async fn append_n(log: &Rc<Log>, n: i64, ts: i64) {
        for i in 0..n {
            let b = make_batch(0, 2, ts + i, 100);
            log.append(BytesMut::from(&b[..]), 3, 0).expect("append");
        }
        log.wait_durable(log.end_offset()).await.expect("durable");
    }

    /// Reads every batch from `from` to the end and checks offsets are contiguous.
    async fn read_all(log: &Log, from: i64) -> Vec<BatchHeader> {
        let mut out = Vec::new();
        let mut offset = from;
        while offset < log.durable_offset() {
            let bytes = log.read(offset, 700, i64::MAX, true).await.expect("read");
            assert!(!bytes.is_empty(), "empty read at {offset}");
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let h = batch::verify(rest).expect("valid batch");
                assert_eq!(h.base_offset, offset, "contiguous offsets");
                offset = h.next_offset();
                rest = &rest[h.total_bytes()..];
                out.push(h);
            }
        }
        out
    }

    #[test]
    fn append_roll_read_reopen() {
        let dir = tmpdir("roll");
        run(move || async move {
            let log = Log::open(&dir, small(), 0).await.unwrap();
            append_n(&log, 100, 1000).await;
            assert_eq!(log.end_offset(), 200);
            assert!(log.state.borrow().segments.len() >= 3, "rolled");
            let all = read_all(&log, 0).await;
            assert_eq!(all.len(), 100);
            assert!(all.iter().all(|h| h.partition_leader_epoch == 3));
            // A read in the middle of a batch returns that whole batch.
            let b = log.read(51, 1, i64::MAX, true).await.unwrap();
            assert_eq!(BatchHeader::parse(&b).unwrap().base_offset, 50);
            let ts = log
                .find_batch_by_timestamp(1040, i64::MAX)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(BatchHeader::parse(&ts).unwrap().base_offset, 80);
            log.close().await.unwrap();
            drop(log);
            let log = Log::open(&dir, small(), 0).await.unwrap();
            assert_eq!(log.end_offset(), 200);
            assert_eq!(read_all(&log, 0).await.len(), 100);
            assert_eq!(log.max_timestamp(), Some((1099, 198)));
            let ts = log
                .find_batch_by_timestamp(1040, i64::MAX)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(BatchHeader::parse(&ts).unwrap().base_offset, 80);
            append_n(&log, 1, 5000).await;
            assert_eq!(read_all(&log, 190).await.len(), 6);
        });
    }

    /// Aborted transactions are on disk before the markers after them are durable, come
    /// back at open, go with a truncation below their marker and with their segment.
    #[test]
    fn aborted_transactions_survive_reopen_and_follow_cuts() {
        let dir = tmpdir("txnindex");
        run(move || async move {
            let txn = |pid, first, last| AbortedTxn {
                producer_id: pid,
                first_offset: first,
                last_offset: last,
                last_stable_offset: first,
            };
            let log = Log::open(&dir, small(), 0).await.unwrap();
            append_n(&log, 100, 1000).await; // offsets 0..200, several segments
            log.add_aborted(txn(1, 10, 21));
            log.add_aborted(txn(1, 10, 21)); // again: one entry
            log.add_aborted(txn(2, 150, 181));
            log.add_aborted(txn(3, 182, 191));
            assert_eq!(log.aborted_unsynced(200).len(), 3);
            append_n(&log, 1, 5000).await; // durable after the index
            assert!(
                log.aborted_unsynced(300).is_empty(),
                "synced by the flusher"
            );
            assert_eq!(log.aborted_txns(0, 300).len(), 3);
            assert_eq!(
                log.aborted_txns(22, 300),
                vec![txn(2, 150, 181), txn(3, 182, 191)]
            );
            assert_eq!(
                log.aborted_txns(22, 160),
                vec![txn(2, 150, 181)],
                "began below"
            );
            assert_eq!(log.aborted_txns(192, 300), vec![]);
            log.close().await.unwrap();
            drop(log);
            let log = Log::open(&dir, small(), 0).await.unwrap();
            assert_eq!(log.txn_index_lost_from(), None);
            assert_eq!(log.aborted_txns(0, 300).len(), 3, "back after a reopen");
            // A cut below a marker drops its entry, on disk too.
            log.truncate(186, 0).await.unwrap();
            assert_eq!(log.aborted_txns(0, 300).len(), 2);
            append_n(&log, 1, 6000).await;
            log.close().await.unwrap();
            drop(log);
            let log = Log::open(&dir, small(), 0).await.unwrap();
            assert_eq!(
                log.aborted_txns(0, 300),
                vec![txn(1, 10, 21), txn(2, 150, 181)]
            );
            // A damaged index is reported, and its entries are gone.
            let first = log.state.borrow().segments[0].txn_index_path();
            log.close().await.unwrap();
            drop(log);
            std::fs::write(&first, b"damaged").unwrap();
            let log = Log::open(&dir, small(), 0).await.unwrap();
            assert_eq!(log.txn_index_lost_from(), Some(0));
            assert_eq!(log.aborted_txns(0, 300), vec![txn(2, 150, 181)]);
            // Deleting the segment takes its entries and file with it.
            assert!(log.apply_retention(0, -1, 0).await.unwrap() > 0);
            assert!(!first.exists());
        });
    }

    #[test]
    fn truncate_within_and_across_segments() {
        let dir = tmpdir("truncate");
        run(move || async move {
            let log = Log::open(&dir, small(), 0).await.unwrap();
            append_n(&log, 100, 1000).await;
            let segments = log.state.borrow().segments.len();
            assert!(segments >= 3, "rolled");
            // Inside the active segment: only its tail goes.
            log.truncate(196, 0).await.unwrap();
            assert_eq!(log.end_offset(), 196);
            assert_eq!(read_all(&log, 0).await.len(), 98);
            // Across segments: later segment files go, the earlier one is cut and reopened.
            log.truncate(40, 0).await.unwrap();
            assert_eq!(log.end_offset(), 40);
            assert_eq!(log.state.borrow().segments.len(), 1);
            assert_eq!(read_all(&log, 0).await.len(), 20);
            assert!(matches!(
                log.truncate(41, 0).await,
                Err(LogError::OffsetOutOfRange { .. })
            ));
            // Appends continue at the cut, and the result survives a reopen.
            append_n(&log, 5, 9000).await;
            assert_eq!(log.end_offset(), 50);
            let tail = read_all(&log, 40).await;
            assert!(
                tail.iter().all(|h| h.base_timestamp >= 9000),
                "old batches gone"
            );
            log.close().await.unwrap();
            drop(log);
            let log = Log::open(&dir, small(), 0).await.unwrap();
            assert_eq!(log.end_offset(), 50);
            assert_eq!(read_all(&log, 0).await.len(), 25);
            // Down to the start: an empty log that keeps its offsets.
            log.truncate(0, 0).await.unwrap();
            assert_eq!(log.end_offset(), 0);
            append_n(&log, 1, 0).await;
            assert_eq!(read_all(&log, 0).await.len(), 1);
        });
    }

    #[test]
    fn restart_at_past_the_end_and_within() {
        let dir = tmpdir("restart");
        run(move || async move {
            let log = Log::open(&dir, small(), 0).await.unwrap();
            append_n(&log, 30, 0).await;
            assert_eq!(log.end_offset(), 60);
            // Past the end: an empty log whose next batch lands at the new start.
            log.restart_at(500, 0).await.unwrap();
            assert_eq!((log.start_offset(), log.end_offset()), (500, 500));
            assert!(read_all(&log, 500).await.is_empty());
            append_n(&log, 2, 0).await;
            assert_eq!(log.end_offset(), 504);
            log.close().await.unwrap();
            drop(log);
            let log = Log::open(&dir, small(), 0).await.unwrap();
            assert_eq!((log.start_offset(), log.end_offset()), (500, 504));
            assert_eq!(read_all(&log, 500).await.len(), 2);
            // Below the end: the batches there are gone too.
            log.restart_at(502, 0).await.unwrap();
            assert_eq!((log.start_offset(), log.end_offset()), (502, 502));
            log.close().await.unwrap();
            drop(log);
            let log = Log::open(&dir, small(), 0).await.unwrap();
            assert_eq!((log.start_offset(), log.end_offset()), (502, 502));
            let files = std::fs::read_dir(&dir).unwrap().filter_map(Result::ok);
            let logs = files.filter(|e| e.path().extension().is_some_and(|x| x == "log"));
            assert!(logs.count() <= 1, "old segment files are gone");
        });
    }

    #[test]
    fn torn_tail_is_cut_and_missing_index_rebuilt() {
        let dir = tmpdir("torn");
        run(move || async move {
            let log = Log::open(&dir, small(), 0).await.unwrap();
            append_n(&log, 30, 0).await;
            log.close().await.unwrap();
            drop(log);
            // Damage the last batch of the last segment and delete a closed segment's index.
            let mut logs: Vec<_> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "log"))
                .collect();
            logs.sort();
            let last = logs.last().unwrap().clone();
            let mut bytes = std::fs::read(&last).unwrap();
            // The file ends in Direct I/O zero padding; find where the batches end.
            let mut end = 0;
            while let Ok(h) = BatchHeader::parse(&bytes[end..]) {
                end += h.total_bytes();
            }
            let keep = end - 50;
            bytes.truncate(keep);
            bytes.extend_from_slice(&[7u8; 20]);
            std::fs::write(&last, &bytes).unwrap();
            let _ = std::fs::remove_file(logs[0].with_extension("index"));
            let log = Log::open(&dir, small(), 0).await.unwrap();
            assert_eq!(log.end_offset(), 58, "only the torn last batch is gone");
            assert_eq!(read_all(&log, 0).await.len(), 29);
            append_n(&log, 1, 0).await;
            assert_eq!(log.end_offset(), 60);
        });
    }

    #[test]
    fn open_deletes_index_files_whose_segment_is_gone() {
        let dir = tmpdir("orphans");
        run(move || async move {
            let log = Log::open(&dir, small(), 0).await.unwrap();
            append_n(&log, 100, 0).await;
            log.close().await.unwrap();
            drop(log);
            let files = |ext: &str| -> Vec<PathBuf> {
                let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
                    .unwrap()
                    .map(|e| e.unwrap().path())
                    .filter(|p| p.extension().is_some_and(|x| x == ext))
                    .collect();
                v.sort();
                v
            };
            let indexes = files("index");
            assert!(indexes.len() >= 2, "closed segments have index files");
            // A segment (past the end: truncated away) deleted before a power loss whose
            // index files came back: a segment later made at that base would trust them.
            let orphan = dir.join(format!("{}.index", crate::segment::file_stem(1000)));
            std::fs::copy(&indexes[0], &orphan).unwrap();
            std::fs::copy(
                indexes[0].with_extension("timeindex"),
                orphan.with_extension("timeindex"),
            )
            .unwrap();
            let log = Log::open(&dir, small(), 0).await.unwrap();
            assert!(!orphan.exists(), "orphaned index deleted");
            assert!(!orphan.with_extension("timeindex").exists());
            assert_eq!(
                files("index"),
                indexes,
                "the segments' own index files stay"
            );
            assert_eq!(read_all(&log, 0).await.len(), 100);
        });
    }

    /// A log whose start lies inside a batch (DeleteRecords) is cut at that batch, with the
    /// start brought down to it first: the next append lands where the batch began, and a
    /// reopen agrees (the start file never says more than the end).
    #[test]
    fn truncating_from_below_the_start_brings_the_start_down() {
        let dir = tmpdir("below-start");
        run(move || async move {
            let log = Log::open(&dir, small(), 0).await.unwrap();
            append_n(&log, 10, 0).await; // batches of 2 records: 0, 2, 4, ...
            log.advance_start(5).await.unwrap();
            assert!(log.truncate(4, 0).await.is_err(), "below the start");
            log.truncate_from_below_start(4, 0).await.unwrap();
            assert_eq!((log.start_offset(), log.end_offset()), (4, 4));
            append_n(&log, 1, 100).await;
            assert_eq!(log.end_offset(), 6);
            log.close().await.unwrap();
            drop(log);
            let log = Log::open(&dir, small(), 0).await.unwrap();
            assert_eq!((log.start_offset(), log.end_offset()), (4, 6));
            let batches = read_all(&log, 4).await;
            assert_eq!(batches.len(), 1);
            assert_eq!(
                batches[0].base_timestamp, 100,
                "the batch appended after the cut"
            );
        });
    }

    #[test]
    fn open_deletes_temp_files_a_crash_left() {
        let dir = tmpdir("temps");
        run(move || async move {
            let log = Log::open(&dir, small(), 0).await.unwrap();
            append_n(&log, 10, 0).await;
            log.advance_start(3).await.unwrap();
            log.close().await.unwrap();
            drop(log);
            // A crash between writing a temp file and renaming it over the real one.
            let temp = dir.join(format!("{LOG_START_FILE}.7.tmp"));
            std::fs::write(&temp, b"partial").unwrap();
            let other = dir.join("notes.tmp");
            std::fs::write(&other, b"not ours").unwrap();
            let log = Log::open(&dir, small(), 0).await.unwrap();
            assert!(!temp.exists(), "the temp file is deleted");
            assert!(other.exists(), "a name write_file never makes stays");
            assert_eq!(log.start_offset(), 3, "the real file is untouched");
        });
    }

    #[test]
    fn an_offset_index_without_its_time_index_is_rebuilt() {
        let dir = tmpdir("lone-index");
        run(move || async move {
            let log = Log::open(&dir, small(), 0).await.unwrap();
            append_n(&log, 100, 1000).await;
            log.close().await.unwrap();
            let first = |log: &Log| {
                let st = log.state.borrow();
                let seg = &st.segments[0];
                (seg.max_timestamp, seg.time_index.clone())
            };
            let before = first(&log);
            assert!(before.0 > 1000 && !before.1.is_empty());
            let stem = log.state.borrow().segments[0].path_stem.clone();
            drop(log);
            // A finish cut short between the two files (or a power loss that kept one of
            // them): the offset index is there, the time index is not.
            std::fs::remove_file(stem.with_extension("timeindex")).unwrap();
            assert!(stem.with_extension("index").exists());
            let log = Log::open(&dir, small(), 0).await.unwrap();
            assert_eq!(
                first(&log),
                before,
                "the segment's timestamps are all known again"
            );
        });
    }

    #[test]
    fn an_unreadable_log_start_fails_the_open() {
        let dir = tmpdir("bad-start");
        run(move || async move {
            let log = Log::open(&dir, small(), 0).await.unwrap();
            append_n(&log, 10, 0).await;
            log.advance_start(6).await.unwrap();
            log.close().await.unwrap();
            drop(log);
            // Guessing would start the log at its first segment, at 0: DeleteRecords undone.
            std::fs::write(dir.join(LOG_START_FILE), b"six").unwrap();
            let opened = Log::open(&dir, small(), 0).await;
            assert!(
                matches!(opened, Err(LogError::Corrupt(_))),
                "{:?}",
                opened.err()
            );
            std::fs::write(dir.join(LOG_START_FILE), b"6").unwrap();
            let log = Log::open(&dir, small(), 0).await.unwrap();
            assert_eq!(log.start_offset(), 6);
        });
    }

    #[test]
    fn retention_and_delete_records() {
        let dir = tmpdir("retention");
        run(move || async move {
            let log = Log::open(&dir, small(), 0).await.unwrap();
            append_n(&log, 100, 1000).await;
            let deleted = log.apply_retention(10_000, -1, 15_000).await.unwrap();
            assert!(deleted > 0);
            assert!(log.size_bytes() >= 15_000 - 10_000);
            let start = log.start_offset();
            assert!(start > 0);
            assert!(matches!(
                log.read(0, 100, i64::MAX, true).await,
                Err(LogError::OffsetOutOfRange { .. })
            ));
            assert_eq!(log.advance_start(start + 3).await.unwrap(), start + 3);
            drop(log);
            let log = Log::open(&dir, small(), 0).await.unwrap();
            assert_eq!(log.start_offset(), start + 3);
            let b = log.read(start + 3, 1, i64::MAX, true).await.unwrap();
            assert_eq!(BatchHeader::parse(&b).unwrap().base_offset, start + 2);
        });
    }

    #[test]
    fn padded_closed_segment_recovers_and_time_index_keeps_running_max() {
        let dir = tmpdir("padded");
        run(move || async move {
            let log = Log::open(&dir, small(), 0).await.unwrap();
            // Out-of-order timestamps: 400, then 1000, then 500s.
            for ts in [400, 1000, 500, 500, 500, 500, 500, 500, 500, 500] {
                let b = make_batch(0, 2, ts, 100);
                log.append(BytesMut::from(&b[..]), 0, 0).unwrap();
            }
            log.wait_durable(log.end_offset()).await.unwrap();
            let hit = log
                .find_batch_by_timestamp(800, i64::MAX)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(
                BatchHeader::parse(&hit).unwrap().base_offset,
                2,
                "the 1000 batch"
            );
            append_n(&log, 60, 2000).await;
            log.close().await.unwrap();
            assert!(matches!(
                log.append(BytesMut::from(&make_batch(0, 1, 0, 1)[..]), 0, 0),
                Err(LogError::Closed)
            ));
            drop(log);
            // A crash right after a roll could leave padding in the closed segment.
            let mut logs: Vec<_> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "log"))
                .collect();
            logs.sort();
            let mut first = std::fs::read(&logs[0]).unwrap();
            first.extend_from_slice(&[0u8; 3000]);
            std::fs::write(&logs[0], &first).unwrap();
            let log = Log::open(&dir, small(), 0).await.unwrap();
            assert_eq!(log.end_offset(), 140);
            assert_eq!(read_all(&log, 0).await.len(), 70);
        });
    }
}
