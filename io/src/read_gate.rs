//! Disk reads give way to the shard's log writes. A consumer reading a backlog keeps many
//! Direct I/O reads in the device's queue (every partition of a Fetch, and a read ahead for
//! each); a log flush behind them waits for all of them, once for the write and again for
//! each metadata write and cache flush its `fdatasync` makes. Measured on the benchmark
//! machine (virtio disk, ext4): with ~32 MiB of reads queued, each flush took 20-105 ms and
//! producers at half of Kafka's max rate saw p50 latencies of a second while a 2 GiB backlog
//! drained; with at most 2 MiB of reads in flight, produce p99 stayed under 90 ms.
//!
//! So each shard (thread) admits its Direct I/O reads through one gate: while the shard has
//! written or synced a log file within the last `WRITE_HOLD`, reads may have at most
//! `BYTES_WHILE_WRITING` in flight together (a single larger read goes alone); otherwise they
//! are not limited, so a catch-up with no producers reads at the disk's full depth. Reads
//! that must wait are admitted in arrival order as earlier ones finish; one whose caller
//! gives up (drops the future) gives its place up too, before or after it was admitted.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures::channel::oneshot;

/// Most bytes of reads in flight on a shard that is writing.
pub const BYTES_WHILE_WRITING: u64 = 2 << 20;
/// How long after its last write or sync ended a shard still counts as writing: producers
/// flush again within milliseconds, and a read admitted in the gap would delay that flush.
pub const WRITE_HOLD: Duration = Duration::from_millis(10);

thread_local! {
    static GATE: Gate = Gate::default();
}

/// Where a queued read stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Turn {
    Waiting,
    /// Counted in `reading`; the read owns that count from here.
    Admitted,
    /// Its caller gave up while it waited: skipped when its turn comes.
    Abandoned,
}

struct Waiter {
    bytes: u64,
    turn: Rc<Cell<Turn>>,
    go: oneshot::Sender<()>,
}

#[derive(Default)]
struct Gate {
    /// Bytes of admitted reads not yet finished.
    reading: Cell<u64>,
    /// Writes and syncs under way.
    writing: Cell<u32>,
    last_write_end: Cell<Option<Instant>>,
    /// Reads waiting for their turn, oldest first. Never non-empty while `reading` is 0.
    waiting: RefCell<VecDeque<Waiter>>,
}

impl Gate {
    fn is_writing(&self, now: Instant) -> bool {
        self.writing.get() > 0
            || self
                .last_write_end
                .get()
                .is_some_and(|end| now.duration_since(end) < WRITE_HOLD)
    }

    /// Whether a read of `bytes` may start beside the reads in flight now.
    fn fits(&self, bytes: u64, now: Instant) -> bool {
        let reading = self.reading.get();
        reading == 0 || !self.is_writing(now) || reading + bytes <= BYTES_WHILE_WRITING
    }

    /// Admits waiting reads from the front while they fit.
    fn admit_waiting(&self) {
        let now = Instant::now();
        loop {
            let mut waiting = self.waiting.borrow_mut();
            let Some(front) = waiting.front() else {
                return;
            };
            if front.turn.get() == Turn::Waiting && !self.fits(front.bytes, now) {
                return;
            }
            let w = waiting.pop_front().expect("front exists");
            drop(waiting);
            if w.turn.get() == Turn::Abandoned {
                continue;
            }
            self.reading.set(self.reading.get() + w.bytes);
            w.turn.set(Turn::Admitted);
            // The receiver lives as long as the waiting read; if it is gone, the read's
            // guard saw `Admitted` and gave the bytes back itself.
            let _ = w.go.send(());
        }
    }

    fn finish(&self, bytes: u64) {
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

/// An admitted read's place in the gate, given back when dropped.
pub struct ReadTurn(u64);

impl Drop for ReadTurn {
    fn drop(&mut self) {
        GATE.with(|g| g.finish(self.0));
    }
}

/// Gives a place back if its read was dropped while it waited.
struct WaitGuard {
    bytes: u64,
    turn: Rc<Cell<Turn>>,
    /// Cleared once the admitted read took its turn over.
    armed: bool,
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        match self.turn.get() {
            Turn::Waiting => self.turn.set(Turn::Abandoned),
            Turn::Admitted => GATE.with(|g| g.finish(self.bytes)),
            Turn::Abandoned => unreachable!("only this guard abandons its turn"),
        }
    }
}

/// Waits until a Direct I/O read of `bytes` may start on this shard; the read is in flight
/// until the returned turn is dropped.
pub async fn read_turn(bytes: u64) -> ReadTurn {
    let queued = GATE.with(|g| {
        if g.waiting.borrow().is_empty() && g.fits(bytes, Instant::now()) {
            g.reading.set(g.reading.get() + bytes);
            return None;
        }
        let (go, wait) = oneshot::channel();
        let turn = Rc::new(Cell::new(Turn::Waiting));
        g.waiting.borrow_mut().push_back(Waiter {
            bytes,
            turn: turn.clone(),
            go,
        });
        Some((
            wait,
            WaitGuard {
                bytes,
                turn,
                armed: true,
            },
        ))
    });
    if let Some((wait, mut guard)) = queued {
        // The sender is dropped unsent only with the gate (the thread) itself.
        let _ = wait.await;
        assert_eq!(guard.turn.get(), Turn::Admitted, "woken before admitted");
        guard.armed = false;
    }
    ReadTurn(bytes)
}

/// A write or sync under way on this shard, from creation to drop.
pub struct Writing(());

impl Writing {
    pub fn start() -> Writing {
        GATE.with(|g| g.writing.set(g.writing.get() + 1));
        Writing(())
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        GATE.with(|g| {
            g.writing.set(g.writing.get() - 1);
            g.last_write_end.set(Some(Instant::now()));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    fn reading() -> u64 {
        GATE.with(|g| g.reading.get())
    }

    fn waiting() -> usize {
        GATE.with(|g| g.waiting.borrow().len())
    }

    /// Runs a test body that never waits except inside `now_or_never` (each test runs on a
    /// thread of its own, so each starts with a fresh gate).
    fn run(f: impl std::future::Future<Output = ()>) {
        f.now_or_never().expect("the test body does not wait");
    }

    #[test]
    fn unlimited_without_writes() {
        run(async {
            let turns: Vec<ReadTurn> =
                futures::future::join_all((0..8).map(|_| read_turn(4 << 20))).await;
            assert_eq!(reading(), 32 << 20);
            drop(turns);
            assert_eq!(reading(), 0);
        });
    }

    #[test]
    fn limited_while_writing_and_admitted_in_order() {
        run(async {
            let w = Writing::start();
            // A read larger than the limit goes alone.
            let big = read_turn(3 << 20).await;
            let mut second = Box::pin(read_turn(1 << 20));
            let mut third = Box::pin(read_turn(1 << 20));
            assert!((&mut second).now_or_never().is_none());
            assert!((&mut third).now_or_never().is_none());
            assert_eq!(waiting(), 2);
            drop(big);
            // Both fit in 2 MiB and are admitted, first the older.
            let second = (&mut second).now_or_never().expect("admitted");
            let third = (&mut third).now_or_never().expect("admitted");
            assert_eq!(reading(), 2 << 20);
            drop((second, third, w));
            assert_eq!((reading(), waiting()), (0, 0));
        });
    }

    #[test]
    fn a_read_given_up_gives_its_place_up() {
        run(async {
            let w = Writing::start();
            let first = read_turn(2 << 20).await;
            // Dropped while waiting: skipped.
            let mut gone = Box::pin(read_turn(1 << 20));
            assert!((&mut gone).now_or_never().is_none());
            drop(gone);
            let mut next = Box::pin(read_turn(2 << 20));
            assert!((&mut next).now_or_never().is_none());
            // Admitted but dropped before it ran: its bytes come back.
            let mut admitted_then_gone = Box::pin(read_turn(1 << 20));
            assert!((&mut admitted_then_gone).now_or_never().is_none());
            drop(first);
            assert_eq!(
                reading(),
                2 << 20,
                "`next` admitted, the dropped one skipped"
            );
            let next = (&mut next).now_or_never().expect("admitted");
            drop(next);
            assert_eq!(reading(), 1 << 20, "the last one admitted in turn");
            drop(admitted_then_gone);
            assert_eq!((reading(), waiting()), (0, 0));
            drop(w);
        });
    }
}
