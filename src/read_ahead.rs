//! Read-ahead for consumers working through a backlog on disk. When a Fetch takes records
//! of a partition from below its high watermark and more of them are on disk (past the
//! log's in-memory tail), the partition starts reading its next share at once, in a task of
//! its own on the owning shard, while the response travels and the client works through
//! it. The next Fetch at that offset takes those bytes (waiting for them if the read is
//! still running) instead of going to the disk itself, so disk reads and the network
//! overlap.
//!
//! Only records below the high watermark at the time are read ahead: they are committed,
//! so no truncation changes them later, and a Fetch that takes them has passed the same
//! leader, lease and log-start checks as any read. Each partition keeps one read ahead,
//! which a read at another offset (a second consumer, a retry) leaves alone; each shard
//! reserves at most `SHARD_BYTES_MAX` for them, from when a read starts until both it and
//! its bytes are gone, and one that no Fetch takes within `KEEP` is dropped.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::time::Duration;

use bytes::Bytes;
use ferrolog_io::Log;
use futures::future::{LocalBoxFuture, Shared};
use futures::FutureExt;
use glommio::Task;

use crate::records;

/// Most bytes one shard (one thread) reserves for reads ahead.
const SHARD_BYTES_MAX: usize = 32 << 20;
/// Smaller shares are not read ahead: their fetches are not reading a backlog in bulk.
const SHARE_BYTES_MIN: usize = 64 << 10;
/// How long a read ahead waits for the Fetch that takes it.
const KEEP: Duration = Duration::from_secs(2);

thread_local! {
    /// Bytes this shard has reserved for reads ahead.
    static RESERVED: Cell<usize> = const { Cell::new(0) };
}

/// Bytes counted against the shard's budget until dropped.
struct Reserved(usize);

impl Reserved {
    fn take(bytes: usize) -> Option<Reserved> {
        RESERVED.with(|r| {
            let now = r.get().checked_add(bytes)?;
            (now <= SHARD_BYTES_MAX).then(|| {
                r.set(now);
                Reserved(bytes)
            })
        })
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        RESERVED.with(|r| r.set(r.get() - self.0));
    }
}

/// A read ahead from `offset`: its bytes once read, and the task that drops it after `KEEP`
/// (dropping this cancels that task).
struct Ahead {
    offset: i64,
    generation: u64,
    records: Shared<LocalBoxFuture<'static, Bytes>>,
    expiry: Option<Task<()>>,
    _reserved: Rc<Reserved>,
}

/// A partition's read ahead: at most one, from the offset where a read ended.
#[derive(Default)]
pub struct ReadAhead {
    slot: Rc<RefCell<Option<Ahead>>>,
    generation: Cell<u64>,
}

impl ReadAhead {
    /// The records read ahead from `offset` (once read: empty when the read found nothing
    /// or failed), taking them; `None` when the read ahead is from elsewhere or there is
    /// none.
    pub async fn take(&self, offset: i64) -> Option<Bytes> {
        let ahead = {
            let mut slot = self.slot.borrow_mut();
            if slot.as_ref()?.offset != offset {
                return None;
            }
            slot.take()?
        };
        Some(ahead.records.clone().await)
    }

    /// After a read of `log` from `from` returned `records` (whole batches) below `limit`,
    /// the high watermark: starts reading the next `share` bytes, if there are more below
    /// `limit` that the log does not hold in memory, the shard's budget allows, and no read
    /// ahead is kept from elsewhere. One from inside what this read returned (a shorter
    /// read of the same reader's) is replaced.
    pub fn after_read(&self, log: &Rc<Log>, from: i64, records: &[u8], share: usize, limit: i64) {
        // A batch larger than the share: a read ahead of that size would find nothing.
        if share < SHARE_BYTES_MIN || records.len() > share {
            return;
        }
        let Some(next) = records::next_offset(records) else {
            return;
        };
        if next >= limit || log.is_cached(next) {
            return;
        }
        {
            let mut slot = self.slot.borrow_mut();
            match slot.as_ref() {
                Some(a) if (from..next).contains(&a.offset) => *slot = None,
                Some(_) => return,
                None => {}
            }
        }
        let Some(reserved) = Reserved::take(share).map(Rc::new) else {
            return;
        };
        let log: Weak<Log> = Rc::downgrade(log);
        let held = reserved.clone();
        // Detached, holding the reservation: a read ahead dropped before its read ends
        // still counts until the read has finished.
        let read = glommio::spawn_local(async move {
            let _held = held;
            match log.upgrade() {
                Some(log) => log
                    .read(next, share, limit, false)
                    .await
                    .unwrap_or_default(),
                None => Bytes::new(),
            }
        })
        .detach()
        .map(Option::unwrap_or_default);
        let generation = self.generation.get() + 1;
        self.generation.set(generation);
        let slot = Rc::downgrade(&self.slot);
        let expiry = glommio::spawn_local(async move {
            glommio::timer::sleep(KEEP).await;
            let Some(slot) = slot.upgrade() else {
                return;
            };
            let expired = slot.borrow_mut().take_if(|a| a.generation == generation);
            if let Some(mut ahead) = expired {
                // This task is the expiry being dropped: let it finish rather than cancel it.
                if let Some(task) = ahead.expiry.take() {
                    task.detach();
                }
            }
        });
        *self.slot.borrow_mut() = Some(Ahead {
            offset: next,
            generation,
            records: read.boxed_local().shared(),
            expiry: Some(expiry),
            _reserved: reserved,
        });
    }
}
