//! `SimRuntime`: openraft's `AsyncRuntime` on a deterministic, single-threaded executor with
//! simulated time.
//!
//! Every task belongs to a simulated node (the node of the task that spawned it). The
//! executor polls one ready task at a time, chosen by the seeded generator, so a seed fixes
//! the interleaving; when no task is ready, time jumps to the next timer. A crash drops all
//! tasks of a node (its futures are dropped, so the channels they held close), and a pause
//! leaves its tasks unpolled until it resumes. Channels and the mutex are the ones of
//! [`crate::runtime`], which only need a waker.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::ops::{Add, AddAssign, Sub, SubAssign};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use openraft::async_runtime::AsyncRuntime;
use openraft::OptionalSend;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use crate::runtime::{AsyncMutex, Cancelled, Channels, Elapsed};

/// `future` unless a simulated deadline passes first.
pub type Timeout<F> = crate::runtime::Timeout<F, Sleep>;

/// A simulated node.
pub type NodeId = u64;

/// A point in simulated time, in nanoseconds since the run began.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SimInstant(u64);

impl SimInstant {
    /// Since the run began.
    pub fn since_start(self) -> Duration {
        Duration::from_nanos(self.0)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Add<Duration> for SimInstant {
    type Output = SimInstant;
    fn add(self, d: Duration) -> SimInstant {
        SimInstant(self.0.saturating_add(nanos(d)))
    }
}
impl AddAssign<Duration> for SimInstant {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}
impl Sub<Duration> for SimInstant {
    type Output = SimInstant;
    fn sub(self, d: Duration) -> SimInstant {
        SimInstant(self.0.saturating_sub(nanos(d)))
    }
}
impl SubAssign<Duration> for SimInstant {
    fn sub_assign(&mut self, d: Duration) {
        *self = *self - d;
    }
}
impl Sub<SimInstant> for SimInstant {
    type Output = Duration;
    fn sub(self, earlier: SimInstant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl openraft::async_runtime::Instant for SimInstant {
    fn now() -> Self {
        with(|e| e.now)
    }
}

type Task = Pin<Box<dyn Future<Output = ()>>>;

/// Task ids woken since the executor last looked (wakers must be `Send`, so this one set is
/// behind a mutex; only the simulation thread ever takes it).
#[derive(Default)]
struct Woken(Mutex<BTreeSet<u64>>);

struct TaskWaker {
    id: u64,
    woken: Arc<Woken>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.0.lock().expect("one thread").insert(self.id);
    }
}

struct Executor {
    now: SimInstant,
    rng: SmallRng,
    next_id: u64,
    /// Live tasks and their node; `None` while the task is being polled.
    tasks: BTreeMap<u64, (NodeId, Option<Task>)>,
    ready: BTreeSet<u64>,
    woken: Arc<Woken>,
    /// Timers by (deadline, id), with the waker of the future waiting on each.
    timers: BTreeMap<(SimInstant, u64), Waker>,
    paused: BTreeSet<NodeId>,
    /// The node of the task being polled; tasks spawned now belong to it.
    current: NodeId,
}

thread_local! {
    static EXECUTOR: RefCell<Option<Executor>> = const { RefCell::new(None) };
}

fn with<T>(f: impl FnOnce(&mut Executor) -> T) -> T {
    EXECUTOR.with(|e| f(e.borrow_mut().as_mut().expect("inside a simulation")))
}

/// The simulation's executor on this thread, for the world that drives it.
pub struct Sim(());

impl Sim {
    /// Installs a fresh executor whose choices all follow `seed`.
    pub fn new(seed: u64) -> Sim {
        EXECUTOR.with(|e| {
            let mut e = e.borrow_mut();
            assert!(e.is_none(), "one simulation per thread at a time");
            *e = Some(Executor {
                now: SimInstant(0),
                rng: SmallRng::seed_from_u64(seed),
                next_id: 0,
                tasks: BTreeMap::new(),
                ready: BTreeSet::new(),
                woken: Arc::default(),
                timers: BTreeMap::new(),
                paused: BTreeSet::new(),
                current: 0,
            });
        });
        Sim(())
    }

    pub fn now(&self) -> SimInstant {
        with(|e| e.now)
    }

    /// Drops every task of `node`, as a crash does.
    pub fn crash(&self, node: NodeId) {
        let dropped: Vec<Task> = with(|e| {
            let ids: Vec<u64> = e
                .tasks
                .iter()
                .filter(|(_, (n, _))| *n == node)
                .map(|(id, _)| *id)
                .collect();
            ids.iter()
                .filter_map(|id| {
                    e.ready.remove(id);
                    e.tasks.remove(id).and_then(|(_, t)| t)
                })
                .collect()
        });
        // Dropped outside the borrow: their destructors may touch the executor.
        drop(dropped);
    }

    pub fn pause(&self, node: NodeId, paused: bool) {
        with(|e| {
            if paused {
                e.paused.insert(node)
            } else {
                e.paused.remove(&node)
            }
        });
    }

    /// Runs tasks and timers until simulated time reaches `until`.
    pub fn run_until(&self, until: SimInstant) {
        loop {
            if let Some((id, node, mut task)) = self.pick() {
                let waker = Waker::from(Arc::new(TaskWaker {
                    id,
                    woken: with(|e| e.woken.clone()),
                }));
                let done = task
                    .as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_ready();
                let finished = with(|e| {
                    e.current = 0;
                    match e.tasks.get_mut(&id) {
                        Some(slot) if !done => {
                            slot.1 = Some(task);
                            None
                        }
                        Some(_) => {
                            e.tasks.remove(&id);
                            Some(task)
                        }
                        None => Some(task), // its node crashed while it ran
                    }
                });
                drop(finished);
                let _ = node;
                continue;
            }
            // Nothing runnable: time moves to the next timer.
            let fired: Vec<Waker> = with(|e| {
                let Some((&(deadline, _), _)) = e.timers.first_key_value() else {
                    e.now = e.now.max(until);
                    return Vec::new();
                };
                if deadline > until {
                    e.now = e.now.max(until);
                    return Vec::new();
                }
                e.now = e.now.max(deadline);
                let mut fired = Vec::new();
                while let Some(entry) = e.timers.first_entry() {
                    if entry.key().0 > e.now {
                        break;
                    }
                    fired.push(entry.remove());
                }
                fired
            });
            if fired.is_empty() {
                return;
            }
            fired.into_iter().for_each(Waker::wake);
        }
    }

    /// A ready task of a running node, chosen at random, taken out of its slot.
    fn pick(&self) -> Option<(u64, NodeId, Task)> {
        with(|e| {
            let woken = std::mem::take(&mut *e.woken.0.lock().expect("one thread"));
            e.ready
                .extend(woken.into_iter().filter(|id| e.tasks.contains_key(id)));
            let runnable: Vec<u64> = e
                .ready
                .iter()
                .copied()
                .filter(|id| e.tasks.get(id).is_some_and(|(n, _)| !e.paused.contains(n)))
                .collect();
            if runnable.is_empty() {
                return None;
            }
            let id = runnable[e.rng.random_range(0..runnable.len())];
            e.ready.remove(&id);
            let (node, slot) = e.tasks.get_mut(&id).expect("a live task");
            let node = *node;
            let task = slot.take()?;
            e.current = node;
            Some((id, node, task))
        })
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        // Tasks are dropped before the executor goes, outside its borrow.
        let tasks: Vec<Task> = with(|e| {
            e.ready.clear();
            std::mem::take(&mut e.tasks)
                .into_values()
                .filter_map(|(_, t)| t)
                .collect()
        });
        drop(tasks);
        let timers = with(|e| std::mem::take(&mut e.timers));
        drop(timers);
        EXECUTOR.with(|e| e.borrow_mut().take());
    }
}

/// Spawns a task on `node`.
pub fn spawn_on(node: NodeId, future: impl Future<Output = ()> + 'static) {
    spawn_task(node, Box::pin(future));
}

/// Spawns a task on the node of the task being polled.
pub fn spawn_here(future: impl Future<Output = ()> + 'static) {
    let node = with(|e| e.current);
    spawn_task(node, Box::pin(future));
}

fn spawn_task(node: NodeId, task: Task) -> u64 {
    with(|e| {
        let id = e.next_id;
        e.next_id += 1;
        e.tasks.insert(id, (node, Some(task)));
        e.ready.insert(id);
        id
    })
}

/// The seeded generator's next value, for the world's own choices.
pub fn random_u64() -> u64 {
    with(|e| e.rng.random())
}

/// A timer in simulated time.
pub struct Sleep {
    deadline: SimInstant,
    key: Option<(SimInstant, u64)>,
}

impl Sleep {
    fn until(deadline: SimInstant) -> Sleep {
        Sleep {
            deadline,
            key: None,
        }
    }
}

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = self.deadline;
        let key = self.key;
        let (ready, key) = with(|e| {
            if e.now >= deadline {
                if let Some(k) = key {
                    e.timers.remove(&k);
                }
                return (true, None);
            }
            let k = key.unwrap_or_else(|| {
                e.next_id += 1;
                (deadline, e.next_id)
            });
            e.timers.insert(k, cx.waker().clone());
            (false, Some(k))
        });
        self.key = key;
        if ready {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(k) = self.key {
            EXECUTOR.with(|e| {
                if let Ok(mut e) = e.try_borrow_mut() {
                    if let Some(e) = e.as_mut() {
                        e.timers.remove(&k);
                    }
                }
            });
        }
    }
}

/// The result slot of a spawned task.
struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
}

/// Handle of a spawned task; resolves to `Cancelled` if the task's node crashed.
pub struct JoinHandle<T>(Rc<RefCell<Slot<T>>>, Rc<()>);

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, Cancelled>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = self.0.borrow_mut();
        if let Some(v) = slot.value.take() {
            return Poll::Ready(Ok(v));
        }
        // The task holds the other strong count of the marker while it lives.
        if Rc::strong_count(&self.1) == 1 {
            return Poll::Ready(Err(Cancelled));
        }
        slot.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// Wakes the joiner when the task ends, whether it finished or was dropped.
struct WakeOnDrop<T>(Rc<RefCell<Slot<T>>>, Option<Rc<()>>);

impl<T> Drop for WakeOnDrop<T> {
    fn drop(&mut self) {
        self.1.take();
        if let Ok(mut slot) = self.0.try_borrow_mut() {
            if let Some(w) = slot.waker.take() {
                w.wake();
            }
        }
    }
}

/// openraft's runtime inside a simulation.
#[derive(Debug)]
pub struct SimRuntime;

impl AsyncRuntime for SimRuntime {
    type JoinError = Cancelled;
    type JoinHandle<T: OptionalSend + 'static> = JoinHandle<T>;
    type Sleep = Sleep;
    type Instant = SimInstant;
    type TimeoutError = Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = Timeout<T>;
    type ThreadLocalRng = SmallRng;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        let slot = Rc::new(RefCell::new(Slot {
            value: None,
            waker: None,
        }));
        let alive = Rc::new(());
        let guard = WakeOnDrop(slot.clone(), Some(alive.clone()));
        let node = with(|e| e.current);
        spawn_task(
            node,
            Box::pin(async move {
                let v = future.await;
                guard.0.borrow_mut().value = Some(v);
                drop(guard);
            }),
        );
        JoinHandle(slot, alive)
    }

    fn sleep(duration: Duration) -> Sleep {
        Sleep::until(with(|e| e.now) + duration)
    }

    fn sleep_until(deadline: SimInstant) -> Sleep {
        Sleep::until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Timeout<F> {
        Timeout {
            future,
            timer: Self::sleep(duration),
        }
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: SimInstant,
        future: F,
    ) -> Timeout<F> {
        Timeout {
            future,
            timer: Sleep::until(deadline),
        }
    }

    fn is_panic(_: &Cancelled) -> bool {
        false
    }

    fn thread_rng() -> SmallRng {
        SmallRng::seed_from_u64(random_u64())
    }

    type Mpsc = Channels;
    type Watch = Channels;
    type Oneshot = Channels;
    type Mutex<T: OptionalSend + 'static> = AsyncMutex<T>;

    fn new(_threads: usize) -> Self {
        SimRuntime
    }

    /// Runs `future` as node 0's task in a simulation of its own (seed 0), as openraft's
    /// runtime suite does.
    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        let sim = Sim::new(0);
        let out: Rc<RefCell<Option<T>>> = Rc::default();
        let o = out.clone();
        // The future may borrow from the caller; it is polled to completion before return.
        let local: Pin<Box<dyn Future<Output = ()> + '_>> = Box::pin(async move {
            *o.borrow_mut() = Some(future.await);
        });
        let mut local = local;
        let waker = Waker::noop();
        loop {
            if let Poll::Ready(()) = local.as_mut().poll(&mut Context::from_waker(waker)) {
                break;
            }
            let next = sim.now() + Duration::from_millis(1);
            sim.run_until(next);
        }
        drop(local);
        drop(sim);
        let v = out.borrow_mut().take().expect("finished");
        v
    }
}
