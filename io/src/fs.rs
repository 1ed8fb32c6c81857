//! The file system under a log: every file operation `Log` makes, and the spawning and
//! sleeping it needs, as one trait. The broker runs logs on [`GlommioFs`] (Direct I/O writes
//! and reads through io_uring, once [`probe_direct_reads`] found that this thread's Direct
//! I/O reads work; buffered reads otherwise); the simulator in ferrolog-raft runs the same log code
//! on a simulated disk that loses what was not synced when the power goes, in simulated
//! time, so a seed replays every crash exactly.
//!
//! The durability contract a log relies on, which an implementation must keep:
//! - bytes written with `write_at` are read back at once, and survive a power loss only once
//!   a later `fdatasync` of that file returns (the file's size likewise);
//! - a file created, deleted or renamed survives a power loss only once `sync_dir` of its
//!   directory returns;
//! - `write_file` replaces a small file atomically and durably (old contents or new, never a
//!   mix, and the new ones for good once it returns);
//! - a process crash (kill -9) loses nothing that was written, synced or not.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use glommio::io::{BufferedFile, DmaBuffer, DmaFile};

use crate::{pool, read_gate, uring};

/// What a log needs of its disk and executor. Everything runs on one thread, so nothing here
/// needs to be `Send`.
#[allow(async_fn_in_trait)] // single-threaded by design: no caller needs `Send` futures
pub trait Fs: Clone + 'static {
    /// A segment's write handle.
    type File: FsFile;
    /// A read handle.
    type Reader: FsReader;

    /// Creates `path`, which must not exist, for reading and writing.
    async fn create_new(&self, path: &Path) -> io::Result<Self::File>;
    /// Opens an existing `path` for reading and writing.
    async fn open_rw(&self, path: &Path) -> io::Result<Self::File>;
    async fn open_read(&self, path: &Path) -> io::Result<Rc<Self::Reader>>;
    fn is_dir(&self, dir: &Path) -> bool;
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// The names of the entries of `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// The whole contents of a small file.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Deletes a file; durable only after `sync_dir`.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Makes the entries of `dir` (files created, deleted or renamed in it) durable.
    async fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Replaces a small file atomically and durably.
    async fn write_file(&self, path: &Path, contents: Vec<u8>) -> io::Result<()>;
    /// Runs `task` on this thread's executor, detached.
    fn spawn(&self, task: impl Future<Output = ()> + 'static);
    async fn sleep(&self, duration: Duration);
}

/// A write handle: aligned writes at aligned positions (Direct I/O in the broker).
#[allow(async_fn_in_trait)]
pub trait FsFile: 'static {
    /// A write buffer of the alignment the file needs.
    type Buf: WriteBuf;
    fn alloc(&self, len: usize) -> Self::Buf;
    /// Writes the whole buffer at `pos`; returns the bytes written.
    async fn write_at(&self, buf: Self::Buf, pos: u64) -> io::Result<usize>;
    async fn fdatasync(&self) -> io::Result<()>;
    /// Reserves space up to `size` without changing the file's size.
    async fn pre_allocate(&self, size: u64) -> io::Result<()>;
    async fn truncate(&self, size: u64) -> io::Result<()>;
    async fn file_size(&self) -> io::Result<u64>;
    async fn close(self) -> io::Result<()>;
}

/// A read handle.
#[allow(async_fn_in_trait)]
pub trait FsReader: 'static {
    /// Up to `len` bytes at `pos` (fewer at the end of the file).
    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Bytes>;
}

/// The bytes of a write buffer.
pub trait WriteBuf {
    fn bytes_mut(&mut self) -> &mut [u8];
}

/// The broker's file system: glommio on the shard's executor. Its reads give way to the
/// process's log writes through [`read_gate`].
#[derive(Clone, Copy, Debug, Default)]
pub struct GlommioFs;

thread_local! {
    /// Whether `probe_direct_reads` found Direct I/O reads working in every directory it
    /// probed on this thread (None: not probed, so buffered).
    static DIRECT_READS: Cell<Option<bool>> = const { Cell::new(None) };
}

/// The name of the files `probe_direct_reads` writes and deletes, one per call (the
/// executors probe at the same time).
const PROBE_FILE: &str = ".direct-read-probe";

/// Finds out, on this thread, whether Direct I/O reads work on the device holding `dir`, and
/// makes the logs this thread opens afterwards read with Direct I/O if they do, and if they
/// did in every directory probed before on this thread (buffered, as before, if not). Call it
/// on each executor thread for each log directory before any log opens. A probe that cannot
/// even write its file (a full disk) counts as a failure and is only logged.
///
/// glommio decides once per thread and device whether the device takes polled I/O, by
/// reading the first file opened for Direct I/O. When that file is empty (a new segment),
/// the read returns at end of file without reaching the device, and glommio takes the device
/// for pollable; on kernels that refuse polled reads from a device without poll queues
/// (6.x on virtio disks), every Direct I/O read then fails with EOPNOTSUPP, and writes
/// go to the polled ring, whose completions the executor spins for. Opening a file that
/// holds data first lets glommio's probe reach the device and see the truth; a read of it
/// checks that Direct I/O reads then return what was written.
pub async fn probe_direct_reads(dir: &Path) -> bool {
    static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("{PROBE_FILE}.{}.{n}", std::process::id()));
    let block: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    let read = async {
        std::fs::write(&path, &block)?;
        let file = glommio::io::OpenOptions::new()
            .read(true)
            .dma_open(&path)
            .await?;
        let bytes = file.read_at(0, block.len()).await;
        // The shard's own ring must read the same block, or is not used.
        if uring::init() {
            let own = uring::read(file.as_raw_fd(), 0, block.len()).await;
            if !own
                .as_ref()
                .is_some_and(|own| own.as_ref().is_ok_and(|own| own[..] == block[..]))
            {
                tracing::warn!(dir = %dir.display(), result = ?own.map(|r| r.map(|b| b.len())), "a Direct I/O read on the shard's own io_uring failed or returned other bytes than written: reading through glommio");
                uring::disable();
            }
        }
        let _ = file.close().await;
        Ok::<_, io::Error>(bytes?)
    };
    let works = match read.await {
        Ok(bytes) if bytes[..] == block[..] => true,
        Ok(_) => {
            tracing::warn!(dir = %dir.display(), "a Direct I/O read returned other bytes than written: reading through the page cache");
            false
        }
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "Direct I/O reads fail: reading through the page cache");
            false
        }
    };
    if let Err(e) = std::fs::remove_file(&path) {
        tracing::warn!(path = %path.display(), error = %e, "cannot delete the Direct I/O probe's file");
    }
    DIRECT_READS.with(|d| d.set(Some(d.get().unwrap_or(true) && works)));
    works
}

/// A segment's read handle: Direct I/O where `probe_direct_reads` found it works, so reads
/// neither fill nor need the page cache (the log writes with Direct I/O, so the cache holds
/// none of it), else buffered.
pub enum GlommioReader {
    Direct(DmaFile),
    Buffered(BufferedFile),
}

impl Fs for GlommioFs {
    type File = DmaFile;
    type Reader = GlommioReader;

    async fn create_new(&self, path: &Path) -> io::Result<DmaFile> {
        glommio::io::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .dma_open(path)
            .await
            .map_err(io::Error::from)
    }

    async fn open_rw(&self, path: &Path) -> io::Result<DmaFile> {
        glommio::io::OpenOptions::new()
            .read(true)
            .write(true)
            .dma_open(path)
            .await
            .map_err(io::Error::from)
    }

    /// Direct I/O where this thread's probe found it works (`probe_direct_reads`). Buffered
    /// readers stay coherent too: Direct writes invalidate the cached pages they cover.
    async fn open_read(&self, path: &Path) -> io::Result<Rc<GlommioReader>> {
        let options = glommio::io::OpenOptions::new().read(true).clone();
        let reader = if DIRECT_READS.with(Cell::get) == Some(true) {
            // glommio's `dma_open` looks the path up again after it opened it, and panics
            // if it is gone by then (retention deleting the segment meanwhile). Opened
            // through this process's descriptor of it, the path stays valid.
            let held = std::fs::File::open(path)?;
            let by_fd = Path::new("/proc/self/fd").join(held.as_raw_fd().to_string());
            let opened = options.dma_open(&by_fd).await;
            drop(held);
            GlommioReader::Direct(opened.map_err(io::Error::from)?)
        } else {
            GlommioReader::Buffered(options.buffered_open(path).await.map_err(io::Error::from)?)
        };
        Ok(Rc::new(reader))
    }

    fn is_dir(&self, dir: &Path) -> bool {
        dir.is_dir()
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        std::fs::read_dir(dir)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect()
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    async fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let handle = glommio::io::Directory::open(dir)
            .await
            .map_err(io::Error::from)?;
        handle.sync().await.map_err(io::Error::from)?;
        let _ = handle.close().await;
        Ok(())
    }

    async fn write_file(&self, path: &Path, contents: Vec<u8>) -> io::Result<()> {
        let path = path.to_path_buf();
        glommio::executor()
            .spawn_blocking(move || -> io::Result<()> {
                use std::io::Write;
                static TMP_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                let seq = TMP_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
                tmp_name.push(format!(".{seq}.tmp"));
                let tmp = path.with_file_name(tmp_name);
                let mut f = std::fs::File::create(&tmp)?;
                f.write_all(&contents)?;
                f.sync_data()?;
                std::fs::rename(&tmp, &path)?;
                if let Some(dir) = path.parent() {
                    std::fs::File::open(dir)?.sync_all()?;
                }
                Ok(())
            })
            .await
    }

    fn spawn(&self, task: impl Future<Output = ()> + 'static) {
        glommio::spawn_local(task).detach();
    }

    async fn sleep(&self, duration: Duration) {
        glommio::timer::sleep(duration).await;
    }
}

impl FsFile for DmaFile {
    type Buf = DmaBuffer;

    fn alloc(&self, len: usize) -> DmaBuffer {
        self.alloc_dma_buffer(len)
    }

    async fn write_at(&self, buf: DmaBuffer, pos: u64) -> io::Result<usize> {
        let _writing = read_gate::Writing::start();
        DmaFile::write_at(self, buf, pos)
            .await
            .map_err(io::Error::from)
    }

    async fn fdatasync(&self) -> io::Result<()> {
        let _writing = read_gate::Writing::start();
        DmaFile::fdatasync(self).await.map_err(io::Error::from)
    }

    async fn pre_allocate(&self, size: u64) -> io::Result<()> {
        DmaFile::pre_allocate(self, size, true)
            .await
            .map_err(io::Error::from)
    }

    async fn truncate(&self, size: u64) -> io::Result<()> {
        DmaFile::truncate(self, size).await.map_err(io::Error::from)
    }

    async fn file_size(&self) -> io::Result<u64> {
        DmaFile::file_size(self).await.map_err(io::Error::from)
    }

    async fn close(self) -> io::Result<()> {
        DmaFile::close(self).await.map_err(io::Error::from)
    }
}

impl WriteBuf for DmaBuffer {
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.as_bytes_mut()
    }
}

impl WriteBuf for Vec<u8> {
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl FsReader for GlommioReader {
    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Bytes> {
        match self {
            GlommioReader::Buffered(f) => {
                // The log writes with Direct I/O, so these miss the page cache: disk reads too.
                let _turn = read_gate::read_turn(len as u64).await;
                let r = f.read_at(pos, len).await.map_err(io::Error::from)?;
                Ok(pool::concat(&[&r], r.len()))
            }
            GlommioReader::Direct(f) => {
                // Read from an aligned position (at least a page, as the log writes) and cut
                // the front off here: glommio's own cut of an unaligned read near the end of
                // the file can run past what it read.
                let align = f.alignment().max(pool::ALIGN as u64);
                let aligned = pos / align * align;
                let skip = (pos - aligned) as usize;
                // Whole aligned blocks are read: count those.
                let whole = (skip + len).next_multiple_of(align as usize);
                let _turn = read_gate::read_turn(whole as u64).await;
                if let Some(r) = uring::read(f.as_raw_fd(), aligned, whole).await {
                    let r = r?;
                    let len = len.min(r.len().saturating_sub(skip));
                    return Ok(r.slice(skip.min(r.len())..).slice(..len));
                }
                let r = f
                    .read_at(aligned, skip + len)
                    .await
                    .map_err(io::Error::from)?;
                let r = &r[skip.min(r.len())..];
                let len = len.min(r.len());
                Ok(pool::concat(&[&r[..len]], len))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where Direct I/O reads work, they run on the shard's own ring and return exactly the
    /// bytes asked for: unaligned starts and ends, ranges across blocks, and short at the
    /// end of the file.
    #[test]
    fn direct_reads_return_the_bytes_asked_for() {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .spawn(|| async move {
                let dir = std::env::temp_dir();
                if !probe_direct_reads(&dir).await {
                    eprintln!("no Direct I/O reads on {}: nothing to test", dir.display());
                    return;
                }
                assert!(uring::available(), "the probe made the shard's ring");
                let path = dir.join(format!("ferrolog-io-uring-{}", std::process::id()));
                let data: Vec<u8> = (0..3 * 4096 + 100u32).map(|i| (i % 253) as u8).collect();
                std::fs::write(&path, &data).unwrap();
                let reader = GlommioFs.open_read(&path).await.unwrap();
                // On the ring, then through glommio as without one.
                for ring in [true, false] {
                    assert_eq!(uring::available(), ring);
                    for (pos, len) in [(0, 1), (1, 4095), (4000, 200), (4096, 8192), (5, 20_000)] {
                        let got = reader.read_at(pos, len).await.unwrap();
                        let end = (pos as usize + len).min(data.len());
                        assert!(got[..] == data[pos as usize..end], "{len} bytes at {pos}");
                    }
                    let past = reader.read_at(data.len() as u64 + 10, 100).await.unwrap();
                    assert!(past.is_empty(), "nothing past the end");
                    uring::disable();
                }
                std::fs::remove_file(&path).unwrap();
            })
            .expect("executor")
            .join()
            .expect("test body");
    }
}
