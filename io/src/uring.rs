//! Direct I/O reads on an io_uring of the thread's own, into pooled aligned buffers that
//! leave as they are: the `Bytes` a read returns are the memory the disk wrote, with no copy
//! on the way to a Fetch response.
//!
//! glommio reads into buffers of its own, reference-counted per thread, which cannot become
//! `Bytes` (those may cross shards); every byte read was copied out of them once more. This
//! ring reads into [`crate::pool`]'s buffers instead. glommio does not let anyone else
//! submit to its rings, so the ring is separate, and glommio learns of completions through
//! a socket: each read is hard-linked to a one-byte write to a socket pair whose other end
//! a task of this thread reads with glommio. By the time that byte arrives, the read's
//! completion is in the ring, and the task hands it to the waiting read.
//!
//! Each thread has at most one ring, made by [`init`] (which `probe_direct_reads` calls), at
//! most `IN_FLIGHT_MAX` reads in flight on it, and a buffer stays owned by the ring until
//! its read completed, whatever became of the read's future. A read is pushed and submitted
//! without an await in between, so its descriptor is the kernel's before the caller can
//! close it (a linked request's descriptor is looked up only when it runs, so the wake-up
//! socket is a file registered with the ring, which holds it as long as it lives). Should
//! anything about the ring fail (a submission, the wake-up socket), the thread retires it
//! for good, and reads, those waiting included, go through glommio again.

#![allow(unsafe_code)] // submissions to the ring; each says why it is sound

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, RawFd};
use std::rc::{Rc, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures::channel::oneshot;
use futures::future::Either;
use futures::AsyncReadExt;
use glommio::net::UnixStream;
use glommio::sync::Semaphore;
use io_uring::{opcode, squeue, types, IoUring};

use crate::pool::{self, AlignedBuf};

/// Submission entries: two per read (the read and its wake-up).
const ENTRIES: u32 = 64;
/// Reads in flight at once on one thread's ring.
const IN_FLIGHT_MAX: usize = (ENTRIES / 2) as usize;
/// The `user_data` of the wake-up writes, whose completions are only counted.
const WAKE: u64 = u64::MAX;
/// The byte each wake-up writes.
static WAKE_BYTE: [u8; 1] = [1];

/// How often the reaper looks at the ring without a wake-up while reads are in flight: a
/// safety net, should a wake-up not come (a read refused at submission cancels its link).
/// An idle ring is not looked at.
const REAP_EVERY: Duration = Duration::from_millis(100);

thread_local! {
    static RING: RefCell<Option<Rc<Ring>>> = const { RefCell::new(None) };
    /// Set once this thread's ring failed: no other is made.
    static REFUSED: Cell<bool> = const { Cell::new(false) };
}

/// A read in flight: its buffer, and where its result goes.
struct Op {
    buf: AlignedBuf,
    done: oneshot::Sender<(AlignedBuf, i32)>,
}

struct Ring {
    ring: RefCell<IoUring>,
    /// Reads in flight, by `user_data`; `None` where free.
    ops: RefCell<Vec<Option<Op>>>,
    /// Free entries of `ops`: taken by a read before it pushes, given back by the reaper.
    /// Closed when the ring retires.
    slots: Semaphore,
    /// Set when the ring retires: nothing is pushed or submitted to it any more (entries a
    /// failed submission left would go to the kernel with descriptors closed since).
    retired: Cell<bool>,
}

impl Ring {
    fn retire(&self) {
        self.retired.set(true);
        self.slots.close();
        REFUSED.with(|r| r.set(true));
        RING.with(|r| r.borrow_mut().take());
    }

    fn in_flight(&self) -> bool {
        self.ops.borrow().iter().any(Option::is_some)
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // The kernel may still write into the buffers of reads in flight after the ring's
        // descriptor closed: leak them (this happens only as the thread ends, or after the
        // ring retired).
        for op in self.ops.get_mut().drain(..).flatten() {
            std::mem::forget(op.buf);
        }
    }
}

/// Makes this thread's ring and starts the task that reaps it; false (and logged) when the
/// kernel refuses a ring, or one failed before on this thread, and reads then stay with
/// glommio. Idempotent.
pub fn init() -> bool {
    if REFUSED.with(Cell::get) {
        return false;
    }
    if RING.with(|r| r.borrow().is_some()) {
        return true;
    }
    let made = (|| {
        let ring = IoUring::new(ENTRIES)?;
        let (wake_tx, wake_rx) = std::os::unix::net::UnixStream::pair()?;
        // The ring holds the sending end from here on (`types::Fixed(0)`); this descriptor
        // of it closes at the end of this closure.
        ring.submitter().register_files(&[wake_tx.as_raw_fd()])?;
        // SAFETY: `into_raw_fd` gives up the descriptor, which the glommio stream now owns
        // alone.
        let wake_rx = unsafe { UnixStream::from_raw_fd(wake_rx.into_raw_fd()) };
        Ok::<_, io::Error>((ring, wake_rx))
    })();
    let (ring, wake_rx) = match made {
        Ok(made) => made,
        Err(e) => {
            tracing::warn!(error = %e, "no io_uring of the shard's own: Direct I/O reads go through glommio, with one more copy");
            REFUSED.with(|r| r.set(true));
            return false;
        }
    };
    let ring = Rc::new(Ring {
        ring: RefCell::new(ring),
        ops: RefCell::new((0..IN_FLIGHT_MAX).map(|_| None).collect()),
        slots: Semaphore::new(IN_FLIGHT_MAX as u64),
        retired: Cell::new(false),
    });
    glommio::spawn_local(reap(Rc::downgrade(&ring), wake_rx)).detach();
    RING.with(|r| *r.borrow_mut() = Some(ring));
    true
}

/// Retires this thread's ring, for good: later reads, and those waiting, go through glommio.
pub fn disable() {
    let ring = RING.with(|r| r.borrow().clone());
    match ring {
        Some(ring) => ring.retire(),
        None => REFUSED.with(|r| r.set(true)),
    }
}

/// Whether this thread has a ring (`init` succeeded on it, and it has not retired).
pub fn available() -> bool {
    RING.with(|r| r.borrow().is_some())
}

/// Reads up to `len` bytes at `pos` of `fd`, both multiples of [`pool::ALIGN`] (fewer at the
/// end of the file). `fd` must stay open until this returns or is dropped. `None` when this
/// thread has no ring, or it retired before the read was submitted: read elsewhere.
pub async fn read(fd: RawFd, pos: u64, len: usize) -> Option<io::Result<Bytes>> {
    assert!(
        pos.is_multiple_of(pool::ALIGN as u64) && len.is_multiple_of(pool::ALIGN),
        "unaligned Direct I/O read of {len} bytes at {pos}"
    );
    let Ok(len32) = u32::try_from(len) else {
        return Some(Err(io::Error::other("a read over 4 GiB")));
    };
    let ring = RING.with(|r| r.borrow().clone())?;
    // The slot is the reaper's to give back, once the read completed. A retired ring
    // closed the semaphore.
    ring.slots.acquire(1).await.ok()?;
    if ring.retired.get() {
        return None;
    }
    let mut buf = pool::buffer(len);
    let (done, result) = oneshot::channel();
    {
        let mut ops = ring.ops.borrow_mut();
        let i = ops
            .iter()
            .position(Option::is_none)
            .expect("a free slot: the semaphore counts the free ones");
        let read = opcode::Read::new(types::Fd(fd), buf.as_mut_ptr(), len32)
            .offset(pos)
            .build()
            .flags(squeue::Flags::IO_HARDLINK)
            .user_data(i as u64);
        let wake = opcode::Write::new(types::Fixed(0), WAKE_BYTE.as_ptr(), 1)
            .build()
            .user_data(WAKE);
        let mut uring = ring.ring.borrow_mut();
        // SAFETY: the read's buffer is `buf`, which moves into `ops[i]` below (its memory
        // stays put) and leaves it only when the read's completion is reaped, or never (a
        // ring dropped with reads in flight leaks their buffers); the wake-up writes a
        // static byte to the file registered at 0.
        unsafe { uring.submission().push_multiple(&[read, wake]) }
            .expect("room: every submission is submitted before the next one is pushed");
        ops[i] = Some(Op { buf, done });
        if let Err(e) = submit_all(&mut uring) {
            tracing::error!(error = %e, "io_uring submission failed: Direct I/O reads go through glommio from now on");
            drop((uring, ops));
            ring.retire();
            return None;
        }
    }
    let Ok((mut buf, res)) = result.await else {
        return Some(Err(io::Error::other(
            "the shard's io_uring retired under a read",
        )));
    };
    if res < 0 {
        return Some(Err(io::Error::from_raw_os_error(-res)));
    }
    // SAFETY: the kernel wrote the `res` bytes the read returned.
    unsafe { buf.set_len(res as usize) };
    Some(Ok(buf.into_bytes()))
}

/// Submits everything pushed, retrying only on EINTR: nothing awaits in between.
fn submit_all(uring: &mut IoUring) -> io::Result<()> {
    for _ in 0..100 {
        match uring.submit() {
            Ok(_) if uring.submission().is_empty() => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other(
        "the ring took no submissions in 100 tries",
    ))
}

/// Reads the wake-up bytes and hands each completed read its result, until the ring goes.
async fn reap(ring: Weak<Ring>, mut wake_rx: UnixStream) {
    let mut woken = [0u8; 256];
    loop {
        let in_flight = match ring.upgrade() {
            Some(ring) => ring.in_flight(),
            None => return,
        };
        let woke = {
            let read = wake_rx.read(&mut woken);
            futures::pin_mut!(read);
            if in_flight {
                let timer = glommio::timer::sleep(REAP_EVERY);
                futures::pin_mut!(timer);
                match futures::future::select(read, timer).await {
                    Either::Left((read, _)) => Some(read),
                    Either::Right(_) => None,
                }
            } else {
                Some(read.await)
            }
        };
        let Some(ring) = ring.upgrade() else {
            return;
        };
        match woke {
            Some(Ok(0)) => return,
            Some(Err(e)) => {
                tracing::error!(error = %e, "the io_uring wake-up socket failed: Direct I/O reads go through glommio from now on");
                ring.retire();
                // Fail the reads waiting; their buffers stay, for the kernel may still
                // write into them.
                for op in ring.ops.borrow_mut().iter_mut().filter_map(Option::take) {
                    std::mem::forget(op.buf);
                }
                return;
            }
            Some(Ok(_)) | None => {}
        }
        let mut completed = Vec::new();
        for cqe in ring.ring.borrow_mut().completion() {
            match cqe.user_data() {
                WAKE if cqe.result() < 0 => {
                    tracing::error!(errno = -cqe.result(), "an io_uring wake-up write failed");
                }
                WAKE => {}
                i => completed.push((i as usize, cqe.result())),
            }
        }
        for (i, res) in completed {
            let op = ring.ops.borrow_mut()[i]
                .take()
                .expect("a completion for a read in flight");
            ring.slots.signal(1);
            // The read's future may be gone; its buffer is then dropped here.
            let _ = op.done.send((op.buf, res));
        }
    }
}
