//! Cluster metadata: topics, their ids, partition counts and config overrides.
//!
//! The controller lives on shard 0 and is the only writer. Each change is persisted
//! (`cluster.json`, written atomically and fsynced) and then published to every shard as an
//! immutable `MetadataImage`; a shard answers Metadata and routes requests from its own copy
//! and opens or drops the partitions it owns when a new image arrives. On a single node this is
//! the whole controller; with replication it becomes Raft group 0 (DESIGN.md).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::config::TopicSettings;
use crate::types::ShardId;

/// Producer ids are handed out in blocks; the persisted counter is always ahead of every id
/// given out, so a restart never reuses one.
const PRODUCER_ID_BLOCK: i64 = 1000;

/// Kafka's legal topic names (`Topic.validate`): 1..=249 of `[a-zA-Z0-9._-]`, not `.`/`..`.
pub fn validate_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("Topic name is illegal, it can't be empty".into());
    }
    if name == "." || name == ".." {
        return Err("Topic name cannot be \".\" or \"..\"".into());
    }
    if name.len() > 249 {
        return Err(format!(
            "Topic name is illegal, it can't be longer than 249 characters, topic name: {name}"
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Err(format!(
            "Topic name \"{name}\" is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'"
        ));
    }
    Ok(())
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TopicRecord {
    pub name: String,
    pub id: Uuid,
    pub partitions: i32,
    pub configs: BTreeMap<String, String>,
}

/// What `cluster.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterState {
    pub cluster_id: String,
    pub next_producer_id: i64,
    pub topics: Vec<TopicRecord>,
}

/// A topic as shards see it.
#[derive(Debug, Clone)]
pub struct TopicMeta {
    pub name: String,
    pub id: Uuid,
    pub partitions: i32,
    pub configs: BTreeMap<String, String>,
    pub settings: TopicSettings,
}

/// Immutable snapshot of the cluster metadata, shared by all shards.
#[derive(Debug, Clone)]
pub struct MetadataImage {
    pub cluster_id: String,
    pub version: u64,
    pub topics: BTreeMap<String, TopicMeta>,
    pub topic_ids: HashMap<Uuid, String>,
}

impl MetadataImage {
    pub fn topic(&self, name: &str) -> Option<&TopicMeta> {
        self.topics.get(name)
    }

    pub fn topic_by_id(&self, id: &Uuid) -> Option<&TopicMeta> {
        self.topic_ids.get(id).and_then(|n| self.topics.get(n))
    }
}

/// The shard that owns a partition: a stable function of (topic id, partition).
pub fn shard_for(topic_id: &Uuid, partition: i32, shard_count: usize) -> ShardId {
    let mut key = [0u8; 20];
    key[..16].copy_from_slice(topic_id.as_bytes());
    key[16..].copy_from_slice(&partition.to_be_bytes());
    ShardId((crc32c::crc32c(&key) as usize) % shard_count)
}

/// The single writer of cluster metadata (shard 0).
pub struct Controller {
    path: PathBuf,
    pub state: ClusterState,
    /// Producer ids below this are free to hand out without touching the disk.
    producer_id_limit: i64,
    version: u64,
}

impl Controller {
    /// Loads `cluster.json` from `dir`, or starts a new cluster.
    pub fn load(dir: &std::path::Path) -> anyhow::Result<Controller> {
        let path = dir.join("cluster.json");
        let state = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| anyhow::anyhow!("{} is damaged: {e}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => ClusterState {
                cluster_id: new_cluster_id(),
                next_producer_id: 0,
                topics: Vec::new(),
            },
            Err(e) => return Err(anyhow::anyhow!("reading {}: {e}", path.display())),
        };
        Ok(Controller {
            path,
            producer_id_limit: state.next_producer_id,
            state,
            version: 0,
        })
    }

    pub fn image(&mut self, defaults: &BTreeMap<&'static str, String>) -> MetadataImage {
        self.version += 1;
        let mut topics = BTreeMap::new();
        let mut topic_ids = HashMap::new();
        for t in &self.state.topics {
            topic_ids.insert(t.id, t.name.clone());
            topics.insert(
                t.name.clone(),
                TopicMeta {
                    name: t.name.clone(),
                    id: t.id,
                    partitions: t.partitions,
                    configs: t.configs.clone(),
                    settings: TopicSettings::resolve(defaults, &t.configs),
                },
            );
        }
        MetadataImage {
            cluster_id: self.state.cluster_id.clone(),
            version: self.version,
            topics,
            topic_ids,
        }
    }

    pub fn topic_mut(&mut self, name: &str) -> Option<&mut TopicRecord> {
        self.state.topics.iter_mut().find(|t| t.name == name)
    }

    /// Whether another topic's name equals this one once '.' and '_' are unified (Kafka
    /// refuses such pairs because their metric names collide).
    pub fn collides(&self, name: &str) -> Option<String> {
        let norm = |s: &str| s.replace('.', "_");
        self.state
            .topics
            .iter()
            .find(|t| t.name != name && norm(&t.name) == norm(name))
            .map(|t| t.name.clone())
    }

    /// Returns the next producer id; `Some(state)` when the caller must persist first.
    pub fn next_producer_id(&mut self) -> (i64, bool) {
        let id = self.state.next_producer_id;
        self.state.next_producer_id += 1;
        if self.state.next_producer_id > self.producer_id_limit {
            self.producer_id_limit = self.state.next_producer_id + PRODUCER_ID_BLOCK;
            return (id, true);
        }
        (id, false)
    }

    /// Serialises the state to persist; the persisted producer-id counter is the block limit.
    pub fn snapshot(&self) -> (PathBuf, Vec<u8>) {
        let mut state = self.state.clone();
        state.next_producer_id = self.producer_id_limit.max(state.next_producer_id);
        (
            self.path.clone(),
            serde_json::to_vec_pretty(&state).expect("cluster state serialises"),
        )
    }
}

/// A Kafka-style cluster id: 16 random bytes in URL-safe base64 without padding.
fn new_cluster_id() -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bytes = *Uuid::new_v4().as_bytes();
    let mut out = String::with_capacity(22);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for b in bytes {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 6 {
            bits -= 6;
            out.push(ALPHABET[((acc >> bits) & 63) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (6 - bits)) & 63) as usize] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names() {
        assert!(validate_topic_name("orders.v1_x-y").is_ok());
        assert!(validate_topic_name("").is_err());
        assert!(validate_topic_name("..").is_err());
        assert!(validate_topic_name("a b").is_err());
        assert!(validate_topic_name(&"a".repeat(250)).is_err());
        assert!(validate_topic_name(&"a".repeat(249)).is_ok());
    }

    #[test]
    fn cluster_id_shape() {
        let id = new_cluster_id();
        assert_eq!(id.len(), 22);
    }

    #[test]
    fn shard_assignment_is_stable_and_in_range() {
        let id = Uuid::from_u128(7);
        for p in 0..100 {
            let s = shard_for(&id, p, 3);
            assert!(s.0 < 3);
            assert_eq!(s, shard_for(&id, p, 3));
        }
    }
}
