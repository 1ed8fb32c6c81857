//! Built-in probes of the machine's limits, measured in the same run as the brokers:
//! sequential Direct I/O write and read bandwidth of the data disk, the latency of a
//! small append followed by fdatasync (buffered, as Kafka writes, and Direct I/O, as
//! ferrolog writes), and loopback TCP bandwidth of one stream.
//!
//! No fio or iperf3: nothing to install, and the probes do the same I/O shapes the
//! brokers do.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use serde::Serialize;

use crate::stats::{self, LatencySummary};

/// Direct I/O needs buffers, offsets and sizes aligned to the logical block size; 4 KiB
/// covers every device here.
const DIRECT_IO_ALIGN: usize = 4096;

#[derive(Clone, Debug, Serialize)]
pub struct HwOpts {
    pub dir: PathBuf,
    pub file_bytes: u64,
    pub block_bytes: usize,
    pub fsync_count: u64,
    pub tcp_duration: Duration,
}

#[derive(Serialize, Debug)]
pub struct HwResult {
    pub options: HwOpts,
    /// Sequential O_DIRECT writes of `block_bytes`, then one fdatasync, MB/s (10^6 bytes).
    pub direct_write_mbps: f64,
    /// Sequential O_DIRECT reads of the same file, MB/s.
    pub direct_read_mbps: f64,
    /// 4 KiB buffered append + fdatasync, as a broker that writes through the page cache.
    pub fdatasync_buffered_4k: LatencySummary,
    /// 4 KiB O_DIRECT append + fdatasync, as a broker that writes with Direct I/O.
    pub fdatasync_direct_4k: LatencySummary,
    /// One TCP stream over 127.0.0.1, 1 MiB writes, MB/s.
    pub loopback_tcp_mbps: f64,
}

/// A 4 KiB-aligned window of `bytes` inside a plain `Vec` (no unsafe allocation needed).
struct Aligned {
    buf: Vec<u8>,
    start: usize,
    bytes: usize,
}

impl Aligned {
    fn new(bytes: usize, fill: u8) -> Aligned {
        let buf = vec![fill; bytes + DIRECT_IO_ALIGN];
        let start = buf.as_ptr().align_offset(DIRECT_IO_ALIGN);
        assert!(start < DIRECT_IO_ALIGN, "align_offset failed");
        Aligned { buf, start, bytes }
    }
    fn get(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.bytes]
    }
    fn get_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.bytes]
    }
}

pub fn run(opts: &HwOpts) -> Result<HwResult> {
    ensure!(
        opts.block_bytes.is_multiple_of(DIRECT_IO_ALIGN),
        "block size must be a multiple of {DIRECT_IO_ALIGN}"
    );
    std::fs::create_dir_all(&opts.dir)?;
    let path = opts.dir.join("hwprobe.data");
    let result = (|| -> Result<HwResult> {
        let (direct_write_mbps, direct_read_mbps) = sequential(&path, opts)?;
        let _ = std::fs::remove_file(&path);
        let fdatasync_buffered_4k =
            fsync_latency(&opts.dir.join("hwprobe.fsync"), opts.fsync_count, false)?;
        let fdatasync_direct_4k =
            fsync_latency(&opts.dir.join("hwprobe.fsync"), opts.fsync_count, true)?;
        let loopback_tcp_mbps = loopback(opts.tcp_duration)?;
        Ok(HwResult {
            options: opts.clone(),
            direct_write_mbps,
            direct_read_mbps,
            fdatasync_buffered_4k,
            fdatasync_direct_4k,
            loopback_tcp_mbps,
        })
    })();
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(opts.dir.join("hwprobe.fsync"));
    result
}

fn open_direct(path: &Path, write: bool) -> Result<File> {
    let mut o = OpenOptions::new();
    if write {
        o.write(true).create(true).truncate(true);
    } else {
        o.read(true);
    }
    o.custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("opening {} with O_DIRECT", path.display()))
}

fn sequential(path: &Path, opts: &HwOpts) -> Result<(f64, f64)> {
    let block = Aligned::new(opts.block_bytes, 0x5a);
    let blocks = opts.file_bytes.div_ceil(opts.block_bytes as u64);
    let bytes = blocks * opts.block_bytes as u64;
    let f = open_direct(path, true)?;
    let t = Instant::now();
    for i in 0..blocks {
        f.write_all_at(block.get(), i * opts.block_bytes as u64)?;
    }
    f.sync_data()?;
    let write_mbps = bytes as f64 / 1e6 / t.elapsed().as_secs_f64();
    drop(f);
    let f = open_direct(path, false)?;
    let mut block = Aligned::new(opts.block_bytes, 0);
    let t = Instant::now();
    for i in 0..blocks {
        f.read_exact_at(block.get_mut(), i * opts.block_bytes as u64)?;
    }
    let read_mbps = bytes as f64 / 1e6 / t.elapsed().as_secs_f64();
    Ok((write_mbps, read_mbps))
}

fn fsync_latency(path: &Path, count: u64, direct: bool) -> Result<LatencySummary> {
    let _ = std::fs::remove_file(path);
    let f = if direct {
        open_direct(path, true)?
    } else {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?
    };
    let page = Aligned::new(4096, 0x33);
    let mut h = stats::new_histogram();
    for i in 0..count {
        let t = Instant::now();
        f.write_all_at(page.get(), i * 4096)?;
        f.sync_data()?;
        stats::record_us(&mut h, t.elapsed());
    }
    let _ = std::fs::remove_file(path);
    Ok(LatencySummary::of(&h))
}

fn loopback(duration: Duration) -> Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let server = std::thread::spawn(move || -> Result<(u64, Duration)> {
        let (mut s, _) = listener.accept()?;
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        let mut first: Option<Instant> = None;
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                break;
            }
            first.get_or_insert_with(Instant::now);
            total += n as u64;
        }
        Ok((total, first.map(|f| f.elapsed()).unwrap_or_default()))
    });
    let mut c = TcpStream::connect(addr)?;
    let buf = vec![0x77u8; 1 << 20];
    let t = Instant::now();
    while t.elapsed() < duration {
        c.write_all(&buf)?;
    }
    drop(c);
    let (total, elapsed) = server
        .join()
        .map_err(|_| anyhow::anyhow!("loopback server panicked"))??;
    Ok(total as f64 / 1e6 / elapsed.as_secs_f64().max(1e-9))
}
