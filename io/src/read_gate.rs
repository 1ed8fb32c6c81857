//! Disk reads give way to log writes. A consumer reading a backlog keeps many reads in the
//! device's queue (every partition of a Fetch, and a read ahead for each); a log flush
//! behind them waits for all of them, once for the write and again for each metadata write
//! and cache flush its `fdatasync` makes. Measured on the benchmark machine (virtio disk,
//! ext4): with ~32 MiB of reads queued, each flush took 20-105 ms and producers at half of
//! Kafka's max rate saw p50 latencies of a second while a 2 GiB backlog drained; with at
//! most 2 MiB of reads in flight, produce p99 stayed under 70 ms.
//!
//! So each shard (thread) admits its segment reads through one gate: Direct I/O reads, or
//! buffered ones where those fail (they miss the page cache all the same, as the log writes
//! with Direct I/O). While any shard of the process (they share the disks) has a write or
//! sync under way, or ended one within the last `WRITE_HOLD`, a shard's reads may have at
//! most `BYTES_WHILE_WRITING` in flight together (a single larger read goes alone);
//! otherwise they are not limited, so a catch-up with no producers reads at the disk's full
//! depth. Reads that must wait are admitted in arrival order as earlier ones finish; one
//! whose caller gives up (drops the future) gives its place up too, before or after it was
//! admitted.
//!
//! A turn is held only around the one read it admits: a caller must not await anything
//! else, least of all another turn, while it holds one.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use futures::channel::oneshot;

/// Most bytes of reads in flight on one shard while the process is writing.
pub const BYTES_WHILE_WRITING: u64 = 2 << 20;
/// How long after a write or sync ended the process still counts as writing: producers
/// that flush less often than this keep reads limited between their flushes too.
pub const WRITE_HOLD: Duration = Duration::from_millis(200);

/// Log writes and syncs of the whole process.
#[derive(Default)]
struct Writes {
    under_way: AtomicU32,
    /// When the last one ended, in nanoseconds after `epoch()` plus one (0: never).
    last_end: AtomicU64,
}

static WRITES: Writes = Writes {
    under_way: AtomicU32::new(0),
    last_end: AtomicU64::new(0),
};

thread_local! {
    static GATE: Rc<Gate> = Rc::new(Gate::new(&WRITES));
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Writes {
    fn start(&'static self) -> Writing {
        self.under_way.fetch_add(1, Ordering::Relaxed);
        Writing(self)
    }

    fn ended_at(&self, at: Instant) {
        let ns = at.saturating_duration_since(epoch()).as_nanos() as u64 + 1;
        self.last_end.fetch_max(ns, Ordering::Relaxed);
    }

    fn is_writing(&self, now: Instant) -> bool {
        if self.under_way.load(Ordering::Relaxed) > 0 {
            return true;
        }
        match self.last_end.load(Ordering::Relaxed) {
            0 => false,
            ns => {
                let end = epoch() + Duration::from_nanos(ns - 1);
                now.saturating_duration_since(end) < WRITE_HOLD
            }
        }
    }
}

/// A write or sync under way, from `Writing::start` to drop.
#[must_use]
pub struct Writing(&'static Writes);

impl Writing {
    pub fn start() -> Writing {
        WRITES.start()
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        self.0.ended_at(Instant::now());
        self.0.under_way.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Waiter {
    bytes: u64,
    go: oneshot::Sender<ReadTurn>,
}

/// One shard's gate.
struct Gate {
    writes: &'static Writes,
    /// Bytes of admitted reads not yet finished.
    reading: Cell<u64>,
    /// Reads waiting for their turn, oldest first. Never non-empty while `reading` is 0.
    waiting: RefCell<VecDeque<Waiter>>,
}

impl Gate {
    fn new(writes: &'static Writes) -> Gate {
        Gate {
            writes,
            reading: Cell::new(0),
            waiting: RefCell::new(VecDeque::new()),
        }
    }

    /// Whether a read of `bytes` may start beside the reads in flight now.
    fn fits(&self, bytes: u64, now: Instant) -> bool {
        let reading = self.reading.get();
        reading == 0 || reading + bytes <= BYTES_WHILE_WRITING || !self.writes.is_writing(now)
    }

    async fn turn(self: &Rc<Self>, bytes: u64) -> ReadTurn {
        let waiting = {
            let mut waiting = self.waiting.borrow_mut();
            if waiting.is_empty() && self.fits(bytes, Instant::now()) {
                None
            } else {
                let (go, turn) = oneshot::channel();
                waiting.push_back(Waiter { bytes, go });
                Some(turn)
            }
        };
        match waiting {
            None => self.admit(bytes),
            // A turn sent but never taken (this future dropped) is dropped with the
            // channel, and gives its bytes back then.
            Some(turn) => turn.await.expect("the gate outlives its waiters"),
        }
    }

    fn admit(self: &Rc<Self>, bytes: u64) -> ReadTurn {
        self.reading.set(self.reading.get() + bytes);
        ReadTurn {
            gate: self.clone(),
            bytes,
        }
    }

    /// Admits waiting reads from the front while they fit; skips those given up.
    fn admit_waiting(self: &Rc<Self>) {
        let now = Instant::now();
        loop {
            let next = {
                let mut waiting = self.waiting.borrow_mut();
                match waiting.front() {
                    Some(w) if w.go.is_canceled() || self.fits(w.bytes, now) => waiting.pop_front(),
                    _ => None,
                }
            };
            let Some(w) = next else {
                return;
            };
            if !w.go.is_canceled() {
                let turn = self.admit(w.bytes);
                // One thread: the receiver checked above is still there.
                assert!(w.go.send(turn).is_ok(), "read gate: waiter gone");
            }
        }
    }

    fn finish(self: &Rc<Self>, bytes: u64) {
        let reading = self.reading.get();
        assert!(
            reading >= bytes,
            "read gate: more bytes finished than admitted"
        );
        self.reading.set(reading - bytes);
        self.admit_waiting();
        assert!(
            self.waiting.borrow().is_empty() || self.reading.get() > 0,
            "read gate: reads wait with none in flight"
        );
    }
}

/// An admitted read's place, given back when dropped.
#[must_use]
pub struct ReadTurn {
    gate: Rc<Gate>,
    bytes: u64,
}

impl Drop for ReadTurn {
    fn drop(&mut self) {
        self.gate.finish(self.bytes);
    }
}

/// Waits until a disk read of `bytes` may start on this shard; the read is in flight until
/// the returned turn is dropped.
pub async fn read_turn(bytes: u64) -> ReadTurn {
    GATE.with(Rc::clone).turn(bytes).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    /// A gate over write state of its own (tests run in parallel threads).
    fn gate() -> (Rc<Gate>, &'static Writes) {
        let writes: &'static Writes = Box::leak(Box::default());
        (Rc::new(Gate::new(writes)), writes)
    }

    fn state(g: &Gate) -> (u64, usize) {
        (g.reading.get(), g.waiting.borrow().len())
    }

    #[test]
    fn unlimited_without_writes() {
        let (g, _) = gate();
        let turns: Vec<ReadTurn> = (0..8)
            .map(|_| g.turn(4 << 20).now_or_never().expect("admitted"))
            .collect();
        assert_eq!(state(&g), (32 << 20, 0));
        drop(turns);
        assert_eq!(state(&g), (0, 0));
    }

    #[test]
    fn limited_while_writing_and_admitted_in_order() {
        let (g, writes) = gate();
        let w = writes.start();
        // A read larger than the limit goes alone.
        let big = g.turn(3 << 20).now_or_never().expect("admitted");
        let mut second = Box::pin(g.turn(2 << 20));
        let mut small = Box::pin(g.turn(1 << 20));
        assert!((&mut second).now_or_never().is_none());
        // It would fit beside `second` but not jump the queue.
        assert!((&mut small).now_or_never().is_none());
        assert_eq!(state(&g), (3 << 20, 2));
        drop(big);
        // `second` fills the 2 MiB; `small` waits for it.
        let second = (&mut second).now_or_never().expect("admitted");
        assert!((&mut small).now_or_never().is_none());
        drop(second);
        let small = (&mut small).now_or_never().expect("admitted");
        drop((small, w));
        assert_eq!(state(&g), (0, 0));
    }

    #[test]
    fn writing_holds_for_a_while_after_the_last_write() {
        let (_, writes) = gate();
        // Times after the epoch, so none is cut to it.
        let t = epoch() + WRITE_HOLD;
        assert!(!writes.is_writing(t));
        writes.ended_at(t);
        assert!(writes.is_writing(t + WRITE_HOLD / 2));
        assert!(!writes.is_writing(t + WRITE_HOLD + Duration::from_millis(1)));
        let w = writes.start();
        assert!(writes.is_writing(t + 10 * WRITE_HOLD));
        drop(w);
    }

    #[test]
    fn a_read_given_up_gives_its_place_up() {
        let (g, writes) = gate();
        let _w = writes.start();
        let first = g.turn(2 << 20).now_or_never().expect("admitted");
        // Dropped while waiting: skipped.
        let mut gone = Box::pin(g.turn(1 << 20));
        assert!((&mut gone).now_or_never().is_none());
        drop(gone);
        let mut next = Box::pin(g.turn(2 << 20));
        assert!((&mut next).now_or_never().is_none());
        // Admitted, but dropped before it took its turn: the bytes come back.
        let mut admitted_then_gone = Box::pin(g.turn(1 << 20));
        assert!((&mut admitted_then_gone).now_or_never().is_none());
        drop(first);
        assert_eq!(
            state(&g),
            (2 << 20, 1),
            "`next` admitted, the dropped one skipped"
        );
        let next = (&mut next).now_or_never().expect("admitted");
        drop(next);
        assert_eq!(state(&g), (1 << 20, 0), "the last one admitted in turn");
        drop(admitted_then_gone);
        assert_eq!(state(&g), (0, 0));
    }
}
