//! The shards' mesh: one bounded channel for each ordered pair of shards, over which a
//! shard sends another the jobs that must run where a partition lives.
//!
//! Every channel is made before the shard threads start; each thread then takes one shard's
//! ends (its id is theirs) and connects them on its own executor. glommio's own
//! `channel_mesh::MeshBuilder` is not used: its clones share a `Rc` (not an `Arc`) across
//! the shard threads, and dropping them at once on two threads freed it twice
//! (AddressSanitizer: heap-use-after-free in `MeshBuilder::join`; in release builds, a
//! broker aborting at start-up with "malloc(): unaligned tcache chunk detected"). Here each
//! end has one owner from the moment it is made.

use std::sync::{Arc, Mutex};

use glommio::channels::shared_channel::{self, ConnectedReceiver, ConnectedSender};
use glommio::channels::shared_channel::{SharedReceiver, SharedSender};

/// One shard's ends, not yet connected: a sender to every other shard, a receiver from each.
pub struct Ends<T: Send + 'static> {
    id: usize,
    to: Vec<Option<SharedSender<T>>>,
    from: Vec<SharedReceiver<T>>,
}

/// Every shard's ends, for the shard threads to take one set each.
pub struct Plan<T: Send + 'static> {
    ends: Mutex<Vec<Ends<T>>>,
}

/// Makes the channels of a mesh of `shards`, each holding up to `capacity` items.
pub fn plan<T: Send + 'static>(shards: usize, capacity: usize) -> Arc<Plan<T>> {
    let mut ends: Vec<Ends<T>> = (0..shards)
        .map(|id| Ends {
            id,
            to: (0..shards).map(|_| None).collect(),
            from: Vec::new(),
        })
        .collect();
    for from in 0..shards {
        for to in (0..shards).filter(|&to| to != from) {
            let (tx, rx) = shared_channel::new_bounded(capacity);
            ends[from].to[to] = Some(tx);
            ends[to].from.push(rx);
        }
    }
    // Taken from the back: the first thread to ask is shard 0.
    ends.reverse();
    Arc::new(Plan {
        ends: Mutex::new(ends),
    })
}

impl<T: Send + 'static> Plan<T> {
    /// This thread's ends; each set goes to one thread only.
    pub fn take(&self) -> Ends<T> {
        self.ends
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .expect("one set of mesh ends per shard thread")
    }
}

/// A shard's connected ends.
pub struct Mesh<T: Send + 'static> {
    id: usize,
    to: Vec<Option<ConnectedSender<T>>>,
}

impl<T: Send + 'static> Ends<T> {
    /// Connects every end on this thread's executor, and returns the senders and the
    /// receivers. A channel's end connects once the other end connected too (or was dropped:
    /// sends on it then fail), so every connect is started before any is awaited.
    pub async fn connect(self) -> (Mesh<T>, Vec<ConnectedReceiver<T>>) {
        let to: Vec<_> = self
            .to
            .into_iter()
            .map(|tx| tx.map(|tx| glommio::spawn_local(tx.connect()).detach()))
            .collect();
        let from: Vec<_> = self
            .from
            .into_iter()
            .map(|rx| glommio::spawn_local(rx.connect()).detach())
            .collect();
        let mut senders = Vec::with_capacity(to.len());
        for tx in to {
            senders.push(match tx {
                Some(tx) => Some(tx.await.expect("a mesh sender connects")),
                None => None,
            });
        }
        let mut receivers = Vec::with_capacity(from.len());
        for rx in from {
            receivers.push(rx.await.expect("a mesh receiver connects"));
        }
        (
            Mesh {
                id: self.id,
                to: senders,
            },
            receivers,
        )
    }
}

impl<T: Send + 'static> Mesh<T> {
    /// This shard's id.
    pub fn id(&self) -> usize {
        self.id
    }

    /// How many shards the mesh joins.
    pub fn shards(&self) -> usize {
        self.to.len()
    }

    /// Queues `item` for shard `to`, waiting while its channel is full; fails if that shard's
    /// receiver is gone.
    pub async fn send_to(&self, to: usize, item: T) -> Result<(), glommio::GlommioError<T>> {
        let tx = self.to[to]
            .as_ref()
            .unwrap_or_else(|| panic!("shard {} sends to itself over the mesh", self.id));
        tx.send(item).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shard_reaches_every_other() {
        const SHARDS: usize = 3;
        let plan = plan::<(usize, usize)>(SHARDS, 4);
        let handles =
            glommio::LocalExecutorPoolBuilder::new(glommio::PoolPlacement::Unbound(SHARDS))
                .on_all_shards(move || {
                    let plan = plan.clone();
                    async move {
                        let (mesh, receivers) = plan.take().connect().await;
                        assert_eq!(mesh.shards(), SHARDS);
                        for to in (0..SHARDS).filter(|&to| to != mesh.id()) {
                            mesh.send_to(to, (mesh.id(), to)).await.unwrap();
                        }
                        let mut got = Vec::new();
                        for rx in &receivers {
                            let (from, to) = rx.recv().await.expect("one item from each shard");
                            assert_eq!(to, mesh.id());
                            got.push(from);
                        }
                        got.sort();
                        let others: Vec<_> = (0..SHARDS).filter(|&s| s != mesh.id()).collect();
                        assert_eq!(got, others);
                        mesh.id()
                    }
                })
                .expect("executors start");
        let mut ids: Vec<_> = handles
            .join_all()
            .into_iter()
            .map(|r| r.expect("shard ran"))
            .collect();
        ids.sort();
        assert_eq!(ids, (0..SHARDS).collect::<Vec<_>>());
    }
}
