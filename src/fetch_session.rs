//! Incremental fetch sessions (KIP-227), kept per shard.
//!
//! A client's connection stays on one shard, so its sessions live there. A session remembers,
//! per partition, the fetch position and what the last response told the client (HW, log
//! start), so an incremental response carries only partitions with news. The cache is bounded;
//! the least recently used session is evicted, and its client gets FETCH_SESSION_ID_NOT_FOUND
//! and falls back to a full fetch.

use std::collections::HashMap;

use indexmap::IndexMap;

use crate::types::{ShardId, TopicPartition};

/// Sessions kept per shard (Kafka: `max.incremental.fetch.session.cache.slots`, 1000).
const SESSIONS_MAX: usize = 1000;
/// Partitions per session.
pub const SESSION_PARTITIONS_MAX: usize = 50_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPartition {
    pub fetch_offset: i64,
    pub partition_max_bytes: i32,
    /// The leader epoch the client knows (KIP-320), -1 when it does not say.
    pub current_leader_epoch: i32,
    /// What the client last heard: (HW, log start); None before the first response.
    pub last_sent: Option<(i64, i64)>,
}

#[derive(Debug)]
pub struct FetchSession {
    /// The epoch the next request must carry.
    pub next_epoch: i32,
    pub partitions: IndexMap<TopicPartition, SessionPartition>,
    last_used: u64,
}

pub struct FetchSessions {
    sessions: HashMap<i32, FetchSession>,
    next_id: i32,
    clock: u64,
}

impl FetchSessions {
    pub fn new(shard: ShardId) -> FetchSessions {
        // Ids differ between shards so a client that reconnects elsewhere never hits a
        // stranger's session.
        FetchSessions {
            sessions: HashMap::new(),
            next_id: (shard.0 as i32 % 1024) * 1_000_000 + 1,
            clock: 0,
        }
    }

    pub fn remove(&mut self, id: i32) {
        self.sessions.remove(&id);
    }

    /// Creates a session (epoch 0 request) and returns its id.
    pub fn create(&mut self, partitions: IndexMap<TopicPartition, SessionPartition>) -> i32 {
        if self.sessions.len() >= SESSIONS_MAX {
            if let Some((&oldest, _)) = self.sessions.iter().min_by_key(|(_, s)| s.last_used) {
                self.sessions.remove(&oldest);
            }
        }
        let id = self.next_id;
        self.next_id = if self.next_id == i32::MAX {
            1
        } else {
            self.next_id + 1
        };
        self.clock += 1;
        self.sessions.insert(
            id,
            FetchSession {
                next_epoch: 1,
                partitions,
                last_used: self.clock,
            },
        );
        id
    }

    pub fn get_mut(&mut self, id: i32) -> Option<&mut FetchSession> {
        self.clock += 1;
        let clock = self.clock;
        let s = self.sessions.get_mut(&id)?;
        s.last_used = clock;
        Some(s)
    }
}
