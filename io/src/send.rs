//! Zero-copy sends: a Fetch's records go from the segment file to the consumer's socket
//! without passing through this process. The connection splices the file's range into a
//! pipe of its own and the pipe into the socket, both on the shard's ring ([`uring`]), so
//! whatever blocks (the disk, a full socket) blocks one of io_uring's workers, never the
//! shard. The socket then sends the file's pages themselves; nothing is copied.
//!
//! Those pages are the page cache's: the log writes with Direct I/O, and a Direct I/O write
//! over a cached page must evict it, which fails while the page is in use (a splice in
//! flight, or a socket that has not yet sent it). The page would then keep its old bytes and
//! serve them to later reads. So [`crate::log::Log::read_to_send`] hands out only ranges
//! that no write touches again: committed batches, in whole pages below the last page of
//! the committed bytes (appends rewrite the partial last page they start in, and a
//! truncation cuts only above the committed ones), or a closed segment committed to its end.

#![allow(unsafe_code)] // descriptor calls libc has and std does not; each says why it is sound

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;

use crate::uring;

/// The pipe each connection splices through: the most a connection has in flight between
/// file and socket, and so the bytes one ring round trip moves. Pipes are 64 KiB unless
/// made larger; the kernel may refuse a user more (`/proc/sys/fs/pipe-user-pages-soft`),
/// and the pipe then stays as it is.
const PIPE_BYTES: usize = 1 << 20;
/// Direct I/O's block alignment.
const ALIGN: u64 = 4096;

/// What a read for a consumer returns ([`crate::log::Log::read_to_send`]).
#[derive(Debug, Clone)]
pub enum Fetched {
    /// Bytes in memory, whole batches.
    Bytes(Bytes),
    /// A range of a segment file, to send with [`Sender`].
    File(FileRange),
}

impl Fetched {
    pub fn len(&self) -> usize {
        match self {
            Fetched::Bytes(b) => b.len(),
            Fetched::File(f) => f.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for Fetched {
    fn default() -> Self {
        Fetched::Bytes(Bytes::new())
    }
}

/// Bytes of a segment file, from `pos`, that a Fetch sends as they are; the first batch in
/// them is whole, the last may be cut short (as Kafka's are: clients read the whole batches
/// and fetch the rest again).
#[derive(Clone)]
pub struct FileRange {
    file: Arc<File>,
    pos: u64,
    len: usize,
    first_batch: usize,
}

impl std::fmt::Debug for FileRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FileRange({} bytes at {})", self.len, self.pos)
    }
}

impl FileRange {
    /// `len` bytes of `file` from `pos`, the first `first_batch` of them a whole batch.
    pub fn new(file: Arc<File>, pos: u64, len: usize, first_batch: usize) -> FileRange {
        assert!(
            0 < first_batch && first_batch <= len,
            "the first batch is whole"
        );
        FileRange {
            file,
            pos,
            len,
            first_batch,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the range starts in its file.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Cut to at most `room` bytes: empty when the first batch does not fit and `oversized`
    /// (KIP-74: it may go whole over `room`) is not set.
    pub fn cut(&mut self, room: usize, oversized: bool) {
        if room < self.first_batch {
            self.len = if oversized { self.first_batch } else { 0 };
        } else {
            self.len = self.len.min(room);
        }
    }

    /// Has the kernel read the next `len` bytes past this range into the page cache while
    /// this one travels: a consumer working through a backlog fetches them next.
    pub fn read_ahead(&self) {
        let Ok(len) = u32::try_from(self.len) else {
            return;
        };
        let file = self.file.clone();
        uring::will_need(
            file.as_raw_fd(),
            self.pos + self.len as u64,
            len,
            Box::new(file),
        );
    }

    /// The bytes, read into memory: for a thread without a ring. Blocks on the disk.
    pub fn read(&self) -> io::Result<Bytes> {
        let mut bytes = vec![0u8; self.len];
        self.file.read_exact_at(&mut bytes, self.pos)?;
        Ok(bytes.into())
    }
}

/// A connection's side of zero-copy sends: its socket and pipe, made on first use.
pub struct Sender {
    socket: RawFd,
    ends: Option<Rc<Ends>>,
}

/// A descriptor of the socket of the connection's own, and its pipe: the ring holds them
/// while a splice is in flight, however the connection ends meanwhile.
struct Ends {
    socket: OwnedFd,
    pipe_read: OwnedFd,
    pipe_write: OwnedFd,
    pipe_bytes: usize,
}

impl Sender {
    /// For the connected socket `socket`, which must stay open until the last `send` returns.
    pub fn new(socket: &impl AsRawFd) -> Sender {
        Sender {
            socket: socket.as_raw_fd(),
            ends: None,
        }
    }

    fn ends(&mut self) -> io::Result<Rc<Ends>> {
        if let Some(ends) = &self.ends {
            return Ok(ends.clone());
        }
        // SAFETY: F_DUPFD_CLOEXEC only reads its arguments; a bad descriptor fails.
        let dup = unsafe { libc::fcntl(self.socket, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `dup` is a descriptor just made, which nothing else owns.
        let socket = unsafe { OwnedFd::from_raw_fd(dup) };
        let (read, write) = io::pipe()?;
        let (pipe_read, pipe_write) = (OwnedFd::from(read), OwnedFd::from(write));
        // SAFETY: F_SETPIPE_SZ and F_GETPIPE_SZ only read their arguments.
        let pipe_bytes = unsafe {
            libc::fcntl(
                pipe_write.as_raw_fd(),
                libc::F_SETPIPE_SZ,
                PIPE_BYTES as libc::c_int,
            );
            libc::fcntl(pipe_write.as_raw_fd(), libc::F_GETPIPE_SZ)
        };
        let pipe_bytes = usize::try_from(pipe_bytes).map_err(|_| io::Error::last_os_error())?;
        let ends = Rc::new(Ends {
            socket,
            pipe_read,
            pipe_write,
            pipe_bytes,
        });
        self.ends = Some(ends.clone());
        Ok(ends)
    }

    /// Sends `range` to the socket, after everything written to it before. False, with
    /// nothing sent, when this thread has no ring: send `range.read()` instead. An error
    /// leaves the socket part-way through the range: close the connection.
    ///
    /// The file is open for Direct I/O, whose reads start and end on block boundaries: the
    /// pipe takes whole blocks, and the bytes before and after the range are dropped from
    /// it (spliced to /dev/null, which never blocks) rather than sent.
    pub async fn send(&mut self, range: &FileRange) -> io::Result<bool> {
        if !uring::available() {
            return Ok(false);
        }
        let ends = self.ends()?;
        let lost = || io::Error::other("the shard's io_uring retired during a send");
        let mut at = range.pos / ALIGN * ALIGN;
        let aligned_end = (range.pos + range.len as u64).div_ceil(ALIGN) * ALIGN;
        let mut skip = (range.pos - at) as usize;
        let mut want = range.len;
        while want > 0 {
            let chunk = (aligned_end - at).min(ends.pipe_bytes as u64) as u32;
            let keep = Box::new((range.file.clone(), ends.clone()));
            let fd = range.file.as_raw_fd();
            let n =
                match uring::splice(fd, Some(at), ends.pipe_write.as_raw_fd(), chunk, keep).await {
                    None if want == range.len => return Ok(false),
                    None => return Err(lost()),
                    Some(n) => n?,
                };
            if n <= skip {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "the segment file ends before byte {}",
                        range.pos + range.len as u64
                    ),
                ));
            }
            at += n as u64;
            ends.drop_bytes(skip)?;
            let mut in_pipe = n - skip;
            skip = 0;
            let mut send = in_pipe.min(want);
            want -= send;
            in_pipe -= send;
            while send > 0 {
                let sent = uring::splice(
                    ends.pipe_read.as_raw_fd(),
                    None,
                    ends.socket.as_raw_fd(),
                    send as u32,
                    Box::new(ends.clone()),
                )
                .await
                .ok_or_else(lost)??;
                if sent == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "the socket took no bytes",
                    ));
                }
                send -= sent;
            }
            ends.drop_bytes(in_pipe)?;
        }
        tracing::trace!(bytes = range.len, "records sent from their file");
        Ok(true)
    }
}

impl Ends {
    /// Drops `len` bytes the pipe holds.
    fn drop_bytes(&self, mut len: usize) -> io::Result<()> {
        static NULL: std::sync::OnceLock<io::Result<File>> = std::sync::OnceLock::new();
        let null = NULL.get_or_init(|| File::options().write(true).open("/dev/null"));
        let null = null
            .as_ref()
            .map_err(|e| io::Error::new(e.kind(), e.to_string()))?;
        while len > 0 {
            // SAFETY: splice between two descriptors this process holds open; it touches no
            // memory of this process. The pipe holds `len` bytes, so it does not wait.
            let n = unsafe {
                libc::splice(
                    self.pipe_read.as_raw_fd(),
                    std::ptr::null_mut(),
                    null.as_raw_fd(),
                    std::ptr::null_mut(),
                    len,
                    libc::SPLICE_F_NONBLOCK,
                )
            };
            match n {
                n if n > 0 => len -= n as usize,
                0 => return Err(io::Error::other("the pipe ran dry")),
                _ => return Err(io::Error::last_os_error()),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};

    use super::*;

    /// Ranges of a file spliced into a socket arrive as the file holds them, in order with
    /// nothing between: unaligned starts and ends, ranges larger than the pipe, and one byte.
    #[test]
    fn ranges_arrive_as_the_file_holds_them() {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .spawn(|| async move {
                if !uring::init() {
                    eprintln!("no io_uring here: nothing to test");
                    return;
                }
                let path =
                    std::env::temp_dir().join(format!("ferrolog-send-{}", std::process::id()));
                let data: Vec<u8> = (0..5_000_000u32).map(|i| (i % 251) as u8).collect();
                std::fs::write(&path, &data).unwrap();
                let file = Arc::new(File::open(&path).unwrap());
                std::fs::remove_file(&path).unwrap();
                let ranges = [
                    (0, 1),
                    (1, 4095),
                    (4000, 200),
                    (7, 3_000_001),
                    (4_999_999, 1),
                ];
                let expected: Vec<u8> = ranges
                    .iter()
                    .flat_map(|&(pos, len)| data[pos..pos + len].to_vec())
                    .collect();
                let listener = TcpListener::bind("127.0.0.1:0").unwrap();
                let addr = listener.local_addr().unwrap();
                let reader = std::thread::spawn(move || {
                    let mut got = Vec::new();
                    TcpStream::connect(addr)
                        .unwrap()
                        .read_to_end(&mut got)
                        .unwrap();
                    got
                });
                let (socket, _) = listener.accept().unwrap();
                let mut sender = Sender::new(&socket);
                for &(pos, len) in &ranges {
                    let range = FileRange::new(file.clone(), pos as u64, len, len.min(100));
                    assert!(sender.send(&range).await.unwrap(), "sent on the ring");
                }
                drop(sender);
                drop(socket);
                let got = reader.join().unwrap();
                assert_eq!(got.len(), expected.len());
                assert!(got == expected, "the socket carried other bytes");
            })
            .expect("executor")
            .join()
            .expect("test body");
    }

    #[test]
    fn a_range_cut_keeps_its_first_batch_whole() {
        let file = Arc::new(File::open("/dev/null").unwrap());
        let mut range = FileRange::new(file.clone(), 0, 1000, 300);
        range.cut(500, false);
        assert_eq!(range.len(), 500, "cut to the room, the last batch short");
        range.cut(200, true);
        assert_eq!(range.len(), 300, "an oversized first batch goes whole");
        let mut range = FileRange::new(file, 0, 1000, 300);
        range.cut(200, false);
        assert!(
            range.is_empty(),
            "nothing when the first batch does not fit"
        );
    }
}
