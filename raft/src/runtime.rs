//! `GlommioRuntime`: openraft's `AsyncRuntime` on the glommio executor of the current shard.
//!
//! Tasks are glommio local tasks (`spawn_local(..).detach()`), so a Raft group and everything
//! it spawns stay on the shard that owns the partition. Timers are glommio timers; `Instant` is
//! `std::time::Instant`. Channels and the mutex are tokio's `sync` primitives, which are
//! runtime-agnostic (they only need a waker) and well tested; no tokio runtime is started.
//!
//! Deviation from tokio's semantics: glommio does not catch panics in tasks. With
//! `panic = "abort"` a panicking task ends the process, so a `JoinError` here only ever means
//! "the task was cancelled", and `is_panic` is always false.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use openraft::async_runtime::{
    mpsc::{Mpsc, MpscReceiver, MpscSender, MpscWeakSender, SendError, TryRecvError},
    oneshot::{Oneshot, OneshotSender},
    watch::{self, Watch, WatchReceiver, WatchSender},
    AsyncRuntime, Mutex,
};
use openraft::OptionalSend;
use tokio::sync as ts;

/// openraft's runtime for code that runs inside a glommio `LocalExecutor`.
pub struct GlommioRuntime {
    executor: glommio::LocalExecutor,
}

impl std::fmt::Debug for GlommioRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlommioRuntime").finish_non_exhaustive()
    }
}

/// A task ended without a result: glommio cancelled it (its executor is shutting down).
#[derive(Debug, thiserror::Error)]
#[error("the task was cancelled before it finished")]
pub struct Cancelled;

/// A future did not finish before its deadline.
#[derive(Debug, thiserror::Error)]
#[error("deadline elapsed")]
pub struct Elapsed;

/// Handle of a detached glommio task; dropping it leaves the task running, as tokio's does.
pub struct JoinHandle<T>(glommio::task::JoinHandle<T>);

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, Cancelled>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|out| out.ok_or(Cancelled))
    }
}

/// A glommio timer that resolves to `()`, as openraft's `Sleep` must.
pub struct Sleep(glommio::timer::Timer);

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

pin_project_lite::pin_project! {
    /// `future`, unless `timer` fires first (on glommio's timers, or the simulator's).
    pub struct Timeout<F, S = Sleep> {
        #[pin]
        pub(crate) future: F,
        pub(crate) timer: S,
    }
}

impl<F: Future, S: Future<Output = ()> + Unpin> Future for Timeout<F, S> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(out) = this.future.poll(cx) {
            return Poll::Ready(Ok(out));
        }
        Pin::new(this.timer).poll(cx).map(|()| Err(Elapsed))
    }
}

fn until(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

impl AsyncRuntime for GlommioRuntime {
    type JoinError = Cancelled;
    type JoinHandle<T: OptionalSend + 'static> = JoinHandle<T>;
    type Sleep = Sleep;
    type Instant = Instant;
    type TimeoutError = Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = Timeout<T>;
    type ThreadLocalRng = rand::rngs::ThreadRng;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        JoinHandle(glommio::spawn_local(future).detach())
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        Sleep(glommio::timer::Timer::new(duration))
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        Self::sleep(until(deadline))
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        Timeout {
            future,
            timer: Self::sleep(duration),
        }
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        Self::timeout(until(deadline), future)
    }

    fn is_panic(_: &Self::JoinError) -> bool {
        false
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        rand::rng()
    }

    type Mpsc = Channels;
    type Watch = Channels;
    type Oneshot = Channels;
    type Mutex<T: OptionalSend + 'static> = AsyncMutex<T>;

    /// A fresh executor on this thread, unpinned; `threads` is ignored (one core, one executor).
    fn new(_threads: usize) -> Self {
        let executor = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("a glommio executor (is RLIMIT_MEMLOCK at least 512 KiB?)");
        GlommioRuntime { executor }
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.executor.run(future)
    }
}

/// The channel families, all backed by `tokio::sync`.
pub struct Channels;

/// Sending half of a bounded mpsc channel.
pub struct MpscTx<T>(ts::mpsc::Sender<T>);
/// Receiving half of a bounded mpsc channel.
pub struct MpscRx<T>(ts::mpsc::Receiver<T>);
/// A sender that does not keep the channel open.
pub struct MpscWeakTx<T>(ts::mpsc::WeakSender<T>);

impl<T> Clone for MpscTx<T> {
    fn clone(&self) -> Self {
        MpscTx(self.0.clone())
    }
}

impl<T> Clone for MpscWeakTx<T> {
    fn clone(&self) -> Self {
        MpscWeakTx(self.0.clone())
    }
}

impl Mpsc for Channels {
    type Sender<T: OptionalSend> = MpscTx<T>;
    type Receiver<T: OptionalSend> = MpscRx<T>;
    type WeakSender<T: OptionalSend> = MpscWeakTx<T>;

    fn channel<T: OptionalSend>(buffer: usize) -> (Self::Sender<T>, Self::Receiver<T>) {
        let (tx, rx) = ts::mpsc::channel(buffer);
        (MpscTx(tx), MpscRx(rx))
    }
}

impl<T: OptionalSend> MpscSender<Channels, T> for MpscTx<T> {
    async fn send(&self, msg: T) -> Result<(), SendError<T>> {
        self.0.send(msg).await.map_err(|e| SendError(e.0))
    }

    fn downgrade(&self) -> MpscWeakTx<T> {
        MpscWeakTx(self.0.downgrade())
    }
}

impl<T: OptionalSend> MpscReceiver<T> for MpscRx<T> {
    async fn recv(&mut self) -> Option<T> {
        self.0.recv().await
    }

    fn try_recv(&mut self) -> Result<T, TryRecvError> {
        self.0.try_recv().map_err(|e| match e {
            ts::mpsc::error::TryRecvError::Empty => TryRecvError::Empty,
            ts::mpsc::error::TryRecvError::Disconnected => TryRecvError::Disconnected,
        })
    }
}

impl<T: OptionalSend> MpscWeakSender<Channels, T> for MpscWeakTx<T> {
    fn upgrade(&self) -> Option<MpscTx<T>> {
        self.0.upgrade().map(MpscTx)
    }
}

/// Sending half of a watch channel.
pub struct WatchTx<T>(ts::watch::Sender<T>);
/// Receiving half of a watch channel.
pub struct WatchRx<T>(ts::watch::Receiver<T>);

impl<T> Clone for WatchTx<T> {
    fn clone(&self) -> Self {
        WatchTx(self.0.clone())
    }
}

impl<T> Clone for WatchRx<T> {
    fn clone(&self) -> Self {
        WatchRx(self.0.clone())
    }
}

impl Watch for Channels {
    type Sender<T: OptionalSend + openraft::OptionalSync> = WatchTx<T>;
    type Receiver<T: OptionalSend + openraft::OptionalSync> = WatchRx<T>;
    type Ref<'a, T: OptionalSend + 'a> = ts::watch::Ref<'a, T>;

    fn channel<T: OptionalSend + openraft::OptionalSync>(
        init: T,
    ) -> (Self::Sender<T>, Self::Receiver<T>) {
        let (tx, rx) = ts::watch::channel(init);
        (WatchTx(tx), WatchRx(rx))
    }
}

impl<T: OptionalSend + openraft::OptionalSync> WatchSender<Channels, T> for WatchTx<T> {
    fn send(&self, value: T) -> Result<(), watch::SendError<T>> {
        self.0.send(value).map_err(|e| watch::SendError(e.0))
    }

    fn send_if_modified<F>(&self, modify: F) -> bool
    where
        F: FnOnce(&mut T) -> bool,
    {
        self.0.send_if_modified(modify)
    }

    fn borrow_watched(&self) -> ts::watch::Ref<'_, T> {
        self.0.borrow()
    }

    fn subscribe(&self) -> WatchRx<T> {
        WatchRx(self.0.subscribe())
    }
}

impl<T: OptionalSend + openraft::OptionalSync> WatchReceiver<Channels, T> for WatchRx<T> {
    async fn changed(&mut self) -> Result<(), watch::RecvError> {
        self.0.changed().await.map_err(|_| watch::RecvError(()))
    }

    fn borrow_watched(&self) -> ts::watch::Ref<'_, T> {
        self.0.borrow()
    }

    fn borrow_and_update(&mut self) -> ts::watch::Ref<'_, T> {
        self.0.borrow_and_update()
    }
}

/// Sending half of a oneshot channel.
pub struct OneshotTx<T>(ts::oneshot::Sender<T>);

impl Oneshot for Channels {
    type Sender<T: OptionalSend> = OneshotTx<T>;
    type Receiver<T: OptionalSend> = ts::oneshot::Receiver<T>;
    type ReceiverError = ts::oneshot::error::RecvError;

    fn channel<T: OptionalSend>() -> (Self::Sender<T>, Self::Receiver<T>) {
        let (tx, rx) = ts::oneshot::channel();
        (OneshotTx(tx), rx)
    }
}

impl<T: OptionalSend> OneshotSender<T> for OneshotTx<T> {
    fn send(self, t: T) -> Result<(), T> {
        self.0.send(t)
    }
}

/// An async mutex (tokio's, fair and runtime-agnostic).
pub struct AsyncMutex<T>(ts::Mutex<T>);

impl<T: OptionalSend + 'static> Mutex<T> for AsyncMutex<T> {
    type Guard<'a> = ts::MutexGuard<'a, T>;

    fn new(value: T) -> Self {
        AsyncMutex(ts::Mutex::new(value))
    }

    async fn lock(&self) -> ts::MutexGuard<'_, T> {
        self.0.lock().await
    }
}

#[cfg(test)]
mod tests {
    use super::GlommioRuntime;

    /// openraft's own conformance suite for runtimes, including its deterministic-RNG part.
    #[test]
    fn openraft_runtime_suite() {
        openraft::testing::runtime::Suite::<GlommioRuntime>::test_all();
    }
}
