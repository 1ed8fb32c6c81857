//! A simulated file system under io/'s real `Log` ([`ferrolog_io::Fs`]), keeping exactly
//! the durability contract that trait states and nothing more:
//! - a file's bytes and size survive a power loss only up to its last `fdatasync`; what was
//!   written after it comes back torn, 512-byte sector by sector, each the old or the new
//!   contents, and the size anywhere between the synced and the written one;
//! - each directory entry created or deleted since its directory's last `sync_dir` may or may
//!   not be there after a power loss, independently of the others;
//! - `write_file` is atomic and durable;
//! - a process crash loses nothing (the page cache survives it).
//!
//! Every operation takes a little simulated time, so a crash can fall between any two of
//! them, and a write lands at the end of its operation. `fail_syncs` makes fsyncs fail now
//! and then (the log must then refuse writes and acknowledge nothing more); `fail` makes
//! every change fail until `mend` (a disk that died); `sync_latency` makes a disk slow.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use ferrolog_io::fs::{Fs, FsFile, FsReader};
use openraft::async_runtime::Instant as _;
use openraft::AsyncRuntime;
use rand::rngs::SmallRng;
use rand::RngExt;

use super::runtime::{random_u64, spawn_here, SimInstant, SimRuntime};

const SECTOR: usize = 512;

/// A file's contents as reads see them, and as a power loss would find them.
#[derive(Clone, Default)]
struct Contents {
    data: Vec<u8>,
    synced: Vec<u8>,
}

struct Inner {
    /// Files by inode number (an open file keeps its inode after it is deleted).
    files: BTreeMap<u64, Contents>,
    /// Directory entries as they are, and as they were at their directory's last sync.
    names: BTreeMap<PathBuf, u64>,
    synced_names: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    next_inode: u64,
    /// Out of 1000, how many fsyncs fail.
    sync_failures_per_mille: u64,
    /// Every write, sync and removal fails (`fail`, until `mend`).
    failed: bool,
    /// The longest an fsync takes, in microseconds (3000 unless `sync_latency` says).
    sync_max_micros: u64,
    syncs_failed: u64,
    /// Print each operation to stderr (`ferrolog-sim --log --trace`).
    trace: bool,
}

/// A simulated disk, shared by every life of the node that owns it.
#[derive(Clone)]
pub struct SimFs(Rc<RefCell<Inner>>);

impl Default for SimFs {
    fn default() -> SimFs {
        SimFs(Rc::new(RefCell::new(Inner {
            files: BTreeMap::new(),
            names: BTreeMap::new(),
            synced_names: BTreeMap::new(),
            dirs: BTreeSet::new(),
            next_inode: 0,
            sync_failures_per_mille: 0,
            failed: false,
            sync_max_micros: 3000,
            syncs_failed: 0,
            trace: false,
        })))
    }
}

impl SimFs {
    pub fn new() -> SimFs {
        SimFs::default()
    }

    /// From now on, about `per_mille` of 1000 fsyncs (files and directories) fail with EIO.
    pub fn fail_syncs(&self, per_mille: u64) {
        self.0.borrow_mut().sync_failures_per_mille = per_mille;
    }

    /// From now on every write, fsync, creation and removal fails with EIO; reads still
    /// work. What was not synced never will be.
    pub fn fail(&self) {
        self.0.borrow_mut().failed = true;
    }

    /// The disk works again (for a node restarted on it after `fail`).
    pub fn mend(&self) {
        self.0.borrow_mut().failed = false;
    }

    pub fn failed(&self) -> bool {
        self.0.borrow().failed
    }

    /// Fsyncs take up to `max` from now on.
    pub fn sync_latency(&self, max: Duration) {
        self.0.borrow_mut().sync_max_micros = (max.as_micros() as u64).max(1);
    }

    /// Whether nothing was ever written here (a new node).
    pub fn is_empty(&self) -> bool {
        self.0.borrow().names.is_empty()
    }

    fn check_failed(&self, what: &str) -> io::Result<()> {
        match self.0.borrow().failed {
            true => Err(eio(what)),
            false => Ok(()),
        }
    }

    /// From now on, print every operation that changes what is on the disk, with its
    /// simulated time: what a failing seed did to its files, step by step.
    pub fn trace(&self, on: bool) {
        self.0.borrow_mut().trace = on;
    }

    fn note(&self, what: impl FnOnce() -> String) {
        if self.0.borrow().trace {
            eprintln!("[{:?}] {}", SimInstant::now().since_start(), what());
        }
    }

    pub fn syncs_failed(&self) -> u64 {
        self.0.borrow().syncs_failed
    }

    /// The power goes: each unsynced directory entry is kept or lost at random, and each file
    /// comes back as its synced contents with a torn part of what was written after.
    pub fn power_loss(&self, rng: &mut SmallRng) {
        let mut inner = self.0.borrow_mut();
        let paths: BTreeSet<PathBuf> = inner
            .names
            .keys()
            .chain(inner.synced_names.keys())
            .cloned()
            .collect();
        let mut names = BTreeMap::new();
        for path in paths {
            let now = inner.names.get(&path).copied();
            let synced = inner.synced_names.get(&path).copied();
            let kept = if now == synced || rng.random_bool(0.5) {
                now
            } else {
                synced
            };
            if let Some(inode) = kept {
                names.insert(path, inode);
            }
        }
        let live: BTreeSet<u64> = names.values().copied().collect();
        let files: BTreeMap<u64, Contents> = std::mem::take(&mut inner.files)
            .into_iter()
            .filter(|(inode, _)| live.contains(inode))
            .map(|(inode, c)| {
                let data = torn(&c.synced, &c.data, rng);
                (
                    inode,
                    Contents {
                        synced: data.clone(),
                        data,
                    },
                )
            })
            .collect();
        if inner.trace {
            for (path, inode) in &names {
                let len = files.get(inode).map_or(0, |c: &Contents| c.data.len());
                eprintln!("  kept {} (inode {inode}, {len} bytes)", path.display());
            }
        }
        inner.files = files;
        inner.synced_names = names.clone();
        inner.names = names;
    }

    fn inode(&self, path: &Path) -> io::Result<u64> {
        self.0
            .borrow()
            .names
            .get(path)
            .copied()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, path.display().to_string()))
    }

    /// Whether this fsync fails.
    fn sync_fails(&self) -> bool {
        let mut inner = self.0.borrow_mut();
        let fails = inner.failed
            || inner.sync_failures_per_mille > 0
                && random_u64() % 1000 < inner.sync_failures_per_mille;
        if fails {
            inner.syncs_failed += 1;
        }
        fails
    }

    fn file(&self, inode: u64) -> SimFile {
        SimFile {
            fs: self.clone(),
            inode,
        }
    }
}

/// What a power loss leaves of a file synced as `old` and written as `new`.
fn torn(old: &[u8], new: &[u8], rng: &mut SmallRng) -> Vec<u8> {
    let len = if old.len() == new.len() {
        old.len()
    } else {
        let (lo, hi) = (old.len().min(new.len()), old.len().max(new.len()));
        rng.random_range(lo..=hi)
    };
    let mut out = vec![0u8; len];
    for start in (0..len).step_by(SECTOR) {
        let end = (start + SECTOR).min(len);
        let source = if rng.random_bool(0.5) { new } else { old };
        for (i, byte) in out[start..end].iter_mut().enumerate() {
            *byte = source.get(start + i).copied().unwrap_or(0);
        }
    }
    out
}

/// Where the record batches in a write start, by their length fields (for the trace).
fn batch_starts(buf: &[u8], pos: u64) -> Vec<(u64, i64, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while let (Some(base), Some(len)) = (buf.get(at..at + 8), buf.get(at + 8..at + 12)) {
        let base = i64::from_be_bytes(base.try_into().expect("8 bytes"));
        let len = i32::from_be_bytes(len.try_into().expect("4 bytes"));
        if len <= 0 {
            break;
        }
        out.push((pos + at as u64, base, 12 + len as usize));
        at += 12 + len as usize;
    }
    out
}

/// A little simulated time, up to `max_micros`.
async fn latency(max_micros: u64) {
    SimRuntime::sleep(Duration::from_micros(random_u64() % max_micros + 1)).await;
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("simulated EIO on {what}"))
}

impl Fs for SimFs {
    type File = SimFile;
    type Reader = SimFile;

    async fn create_new(&self, path: &Path) -> io::Result<SimFile> {
        latency(200).await;
        self.check_failed("create")?;
        let mut inner = self.0.borrow_mut();
        if inner.names.contains_key(path) {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, "file exists"));
        }
        let inode = inner.next_inode;
        inner.next_inode += 1;
        inner.files.insert(inode, Contents::default());
        inner.names.insert(path.to_path_buf(), inode);
        drop(inner);
        self.note(|| format!("create {} (inode {inode})", path.display()));
        Ok(self.file(inode))
    }

    async fn open_rw(&self, path: &Path) -> io::Result<SimFile> {
        latency(50).await;
        Ok(self.file(self.inode(path)?))
    }

    async fn open_read(&self, path: &Path) -> io::Result<Rc<SimFile>> {
        latency(50).await;
        Ok(Rc::new(self.file(self.inode(path)?)))
    }

    fn is_dir(&self, dir: &Path) -> bool {
        self.0.borrow().dirs.contains(dir)
    }

    /// Directories are made durable at once: the broker syncs `log.dirs` at start-up.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.0.borrow_mut().dirs.insert(dir.to_path_buf());
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let inner = self.0.borrow();
        if !inner.dirs.contains(dir) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                dir.display().to_string(),
            ));
        }
        Ok(inner
            .names
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect())
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let inode = self.inode(path)?;
        Ok(self.0.borrow().files[&inode].data.clone())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.check_failed("remove")?;
        self.note(|| format!("remove {}", path.display()));
        match self.0.borrow_mut().names.remove(path) {
            Some(_) => Ok(()),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                path.display().to_string(),
            )),
        }
    }

    async fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        latency(2000).await;
        if self.sync_fails() {
            self.note(|| format!("sync {} failed", dir.display()));
            return Err(eio("directory sync"));
        }
        self.note(|| format!("sync {}", dir.display()));
        let mut inner = self.0.borrow_mut();
        let Inner {
            names,
            synced_names,
            ..
        } = &mut *inner;
        synced_names.retain(|p, _| p.parent() != Some(dir));
        synced_names.extend(
            names
                .iter()
                .filter(|(p, _)| p.parent() == Some(dir))
                .map(|(p, i)| (p.clone(), *i)),
        );
        Ok(())
    }

    async fn write_file(&self, path: &Path, contents: Vec<u8>) -> io::Result<()> {
        let max = self.0.borrow().sync_max_micros;
        latency(max).await;
        if self.sync_fails() {
            self.note(|| format!("write_file {} failed", path.display()));
            return Err(eio("small file write"));
        }
        self.note(|| format!("write_file {} ({} bytes)", path.display(), contents.len()));
        let mut inner = self.0.borrow_mut();
        let inode = inner.next_inode;
        inner.next_inode += 1;
        inner.files.insert(
            inode,
            Contents {
                data: contents.clone(),
                synced: contents,
            },
        );
        inner.names.insert(path.to_path_buf(), inode);
        inner.synced_names.insert(path.to_path_buf(), inode);
        Ok(())
    }

    fn spawn(&self, task: impl Future<Output = ()> + 'static) {
        spawn_here(task);
    }

    async fn sleep(&self, duration: Duration) {
        SimRuntime::sleep(duration).await;
    }
}

/// A handle on one simulated file (reads and writes alike).
pub struct SimFile {
    fs: SimFs,
    inode: u64,
}

impl SimFile {
    fn with<T>(&self, f: impl FnOnce(&mut Contents) -> T) -> T {
        let mut inner = self.fs.0.borrow_mut();
        f(inner
            .files
            .get_mut(&self.inode)
            .expect("an open file's inode"))
    }
}

impl FsFile for SimFile {
    type Buf = Vec<u8>;

    fn alloc(&self, len: usize) -> Vec<u8> {
        vec![0; len]
    }

    async fn write_at(&self, buf: Vec<u8>, pos: u64) -> io::Result<usize> {
        latency(500).await;
        self.fs.check_failed("write")?;
        self.fs.note(|| {
            let batches = batch_starts(&buf, pos);
            format!("write inode {} at {pos}, {} bytes, batches (position, base offset, bytes) {batches:?}", self.inode, buf.len())
        });
        let pos = pos as usize;
        self.with(|c| {
            if c.data.len() < pos + buf.len() {
                c.data.resize(pos + buf.len(), 0);
            }
            c.data[pos..pos + buf.len()].copy_from_slice(&buf);
        });
        Ok(buf.len())
    }

    async fn fdatasync(&self) -> io::Result<()> {
        let max = self.fs.0.borrow().sync_max_micros;
        latency(max).await;
        if self.fs.sync_fails() {
            self.fs
                .note(|| format!("fdatasync inode {} failed", self.inode));
            return Err(eio("fdatasync"));
        }
        self.fs.note(|| format!("fdatasync inode {}", self.inode));
        self.with(|c| c.synced = c.data.clone());
        Ok(())
    }

    async fn pre_allocate(&self, _size: u64) -> io::Result<()> {
        Ok(())
    }

    async fn truncate(&self, size: u64) -> io::Result<()> {
        latency(200).await;
        self.fs.check_failed("truncate")?;
        self.fs
            .note(|| format!("truncate inode {} to {size} bytes", self.inode));
        self.with(|c| c.data.resize(size as usize, 0));
        Ok(())
    }

    async fn file_size(&self) -> io::Result<u64> {
        Ok(self.with(|c| c.data.len() as u64))
    }

    async fn close(self) -> io::Result<()> {
        Ok(())
    }
}

impl FsReader for SimFile {
    async fn read_at(&self, pos: u64, len: usize) -> io::Result<bytes::Bytes> {
        latency(100).await;
        Ok(self.with(|c| {
            let start = (pos as usize).min(c.data.len());
            let end = (start + len).min(c.data.len());
            bytes::Bytes::copy_from_slice(&c.data[start..end])
        }))
    }
}
