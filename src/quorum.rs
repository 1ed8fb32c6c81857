//! The controller quorum: cluster metadata in Raft group 0 (KRaft's role), on shard 0 of
//! every node.
//!
//! Every node is a voter (`controller.quorum.voters`, KRaft's combined mode). Without that
//! config a node is a one-voter quorum of itself with no Raft port, and nothing else changes.
//! The log lives in `<metadata.log.dir>/__cluster_metadata-0` (by default in `log.dirs`); each entry is one record batch whose
//! record holds the whole `ClusterState` after a change (metadata is small: topics, their
//! replica assignments and configs, and the registered brokers).
//!
//! Writes: only the leader changes metadata, and only once it has applied everything before
//! its term ("ready"). It changes its working copy under the controller lock and proposes
//! it; a failed proposal resets the copy to the applied state. Other nodes answer admin
//! requests with NOT_CONTROLLER (clients retry at Metadata's controller id), and forward
//! their broker registration to the leader.
//!
//! Every node applies committed entries (the apply hook) and publishes the new image to its
//! shards. The commit point is persisted, so a restarted node serves its last committed
//! metadata at once, before any election.
//!
//! Liveness: the leader fences a broker whose Raft heartbeats it has not had acknowledged for
//! `broker.session.timeout.ms`, and unfences it when they come back.

use std::collections::BTreeMap;
use std::rc::{Rc, Weak};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferrolog_io::batch::{self, BatchHeader};
use ferrolog_io::LogConfig;
use ferrolog_raft::async_runtime::watch::WatchReceiver;
use ferrolog_raft::entry::{Batch, Entry};
use ferrolog_raft::network::{GroupRaft, Transport};
use ferrolog_raft::state_machine::{Applied, PartitionStateMachine};
use ferrolog_raft::store::LogStore;
use ferrolog_raft::wire::GroupId;
use ferrolog_raft::{openraft, GlommioRuntime};
use futures::FutureExt;
use openraft::{AsyncRuntime, BasicNode, EntryPayload, Raft};
use serde::{Deserialize, Serialize};

use crate::errors::BrokerError;
use crate::group::codec;
use crate::kafka::handlers::admin::{
    change_topic, create_topics, delete_topics, TopicChange, TopicSpec,
};
use crate::metadata::{partition_key, BrokerRecord, ClusterState, LeaderRecord};
use crate::shard::Shard;
use crate::types::{now_ms, ShardId};

/// Group 0 is the controller; partition groups use other ids.
pub const CONTROLLER_GROUP: GroupId = GroupId(0);
/// Directory of the controller's log, under `log.dirs` (Kafka's name for it).
pub const METADATA_DIR: &str = "__cluster_metadata-0";
/// Key of the one record in each metadata entry.
const STATE_KEY: &[u8] = b"cluster-state";
/// How often the controller loop looks at leadership, registration and liveness.
const TICK: Duration = Duration::from_millis(200);
/// Least time between two ISR-only reports of one partition.
const ISR_REPORT_INTERVAL: Duration = Duration::from_secs(2);
/// How long a node waits for the controller's answer to a forwarded report.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a proposal may wait for its commit.
const PROPOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// A request a node forwards to the controller leader.
#[derive(Debug, Serialize, Deserialize)]
pub enum Forwarded {
    RegisterBroker {
        id: i32,
        record: BrokerRecord,
    },
    /// CreateTopics, and the topics a broker creates for itself (auto-creation,
    /// `__consumer_offsets`).
    CreateTopics(Vec<TopicSpec>),
    /// DeleteTopics, by name.
    DeleteTopics(Vec<String>),
    /// CreatePartitions, AlterConfigs or IncrementalAlterConfigs on one topic.
    ChangeTopic {
        name: String,
        change: TopicChange,
        validate_only: bool,
    },
    /// Partitions this node leads, with their epoch and ISR (Kafka's AlterPartition).
    ReportLeaders(Vec<(String, LeaderRecord)>),
    /// A transaction coordinator's markers for partitions the receiving node leads (Kafka's
    /// WriteTxnMarkers); served by any node, not only the controller leader.
    WriteTxnMarkers {
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
        partitions: Vec<(String, i32)>,
    },
    /// A partition leader asks a transaction coordinator whether a partition is in a
    /// producer's open transaction (KIP-890 part 1, `txn::verify`).
    VerifyTxn {
        transactional_id: String,
        producer_id: i64,
        epoch: i16,
        partition: (String, i32),
    },
}

/// The controller leader's answer to a forwarded request: per item, a value or the Kafka
/// error code and message.
type Reply<T> = Vec<Result<T, (i16, String)>>;

/// Sends `request` to the controller leader and waits up to `ttl` for its `n` results.
/// NOT_CONTROLLER (the leader moved) and REQUEST_TIMED_OUT (no leader known, or no answer)
/// may be asked again.
pub async fn forward_to_controller<T>(
    shard: &Rc<Shard>,
    request: Forwarded,
    n: usize,
    ttl: Duration,
) -> Vec<Result<T, BrokerError>>
where
    T: serde::de::DeserializeOwned,
{
    forward_to(shard, None, request, n, ttl).await
}

/// Sends `request` to node `node` (its shard 0) and waits up to `ttl` for its `n` results;
/// REQUEST_TIMED_OUT when it does not answer.
pub async fn forward_to_node<T>(
    shard: &Rc<Shard>,
    node: i32,
    request: Forwarded,
    n: usize,
    ttl: Duration,
) -> Vec<Result<T, BrokerError>>
where
    T: serde::de::DeserializeOwned,
{
    forward_to(shard, Some(node), request, n, ttl).await
}

/// `forward_to_node`, or to the controller leader when `node` is None.
async fn forward_to<T>(
    shard: &Rc<Shard>,
    node: Option<i32>,
    request: Forwarded,
    n: usize,
    ttl: Duration,
) -> Vec<Result<T, BrokerError>>
where
    T: serde::de::DeserializeOwned,
{
    // Not under the controller lock: the leader serialises the change itself.
    let reply = shard
        .invoke_on(ShardId(0), move |shard| {
            let shard = shard.clone();
            async move {
                let quorum = shard
                    .quorum()
                    .ok_or("the controller quorum is not running")?;
                let to = match node {
                    Some(node) => node,
                    None => quorum.leader().ok_or("no controller leader")?,
                };
                forward(&shard, &quorum, to, &request, ttl).await
            }
            .boxed_local()
        })
        .await;
    let decoded = reply.and_then(|bytes| {
        serde_json::from_slice::<Reply<T>>(&bytes).map_err(|e| format!("bad reply: {e}"))
    });
    match decoded {
        Ok(results) if results.len() == n => results
            .into_iter()
            .map(|r| r.map_err(|(code, m)| BrokerError::from_controller(code, m)))
            .collect(),
        Ok(_) => (0..n)
            .map(|_| {
                Err(BrokerError::RequestTimedOut(
                    "bad reply from the controller".into(),
                ))
            })
            .collect(),
        Err(e) => (0..n)
            .map(|_| {
                Err(BrokerError::RequestTimedOut(format!(
                    "forwarding to the controller: {e}"
                )))
            })
            .collect(),
    }
}

/// A forwarded request's results as the forwarding node decodes them (`Reply`).
fn reply<T: Serialize>(results: Vec<Result<T, BrokerError>>) -> Bytes {
    let results: Reply<T> = results
        .into_iter()
        .map(|r| r.map_err(|e| (e.code(), e.to_string())))
        .collect();
    Bytes::from(serde_json::to_vec(&results).expect("serialises"))
}

pub struct Quorum {
    pub raft: GroupRaft,
    pub transport: Rc<Transport>,
    /// The controller's metadata log (the Raft log of group 0).
    log: Rc<ferrolog_io::Log>,
    node_id: i32,
}

fn members(shard: &Shard) -> BTreeMap<u64, BasicNode> {
    let config = &shard.config;
    if config.voters.is_empty() {
        return BTreeMap::from([(config.node_id as u64, BasicNode::new(""))]);
    }
    config
        .voters
        .iter()
        .map(|(id, addr)| (*id as u64, BasicNode::new(addr.to_string())))
        .collect()
}

impl Quorum {
    /// Opens the controller log and starts the group on shard 0. Applied states reach the
    /// shards through `Shard::controller_applied`.
    pub async fn start(shard: &Rc<Shard>, transport: Rc<Transport>) -> anyhow::Result<Rc<Quorum>> {
        let config = &shard.config;
        let node_id = config.node_id;
        let dir = config.metadata_dir().join(METADATA_DIR);
        let log_config = LogConfig {
            segment_bytes: 64 << 20,
            preallocate_bytes: 1 << 20,
            ..LogConfig::default()
        };
        let store = LogStore::open(&dir, log_config, Rc::new(now_ms))
            .await
            .map_err(|e| anyhow::anyhow!("opening {}: {e}", dir.display()))?
            .persist_committed();
        let fresh = store.is_fresh();
        let log = store.log().clone();
        let weak: Weak<Shard> = Rc::downgrade(shard);
        let hook = Box::new(move |applied: Applied<'_>| {
            // The controller's log is never purged, so no snapshot ever stands for entries.
            let Applied::Entry(entry) = applied else {
                tracing::error!("the controller was handed a snapshot; its state is in its log");
                return;
            };
            let Some(state) = decode_entry(entry) else {
                return;
            };
            if let Some(shard) = weak.upgrade() {
                shard.controller_applied(state);
            }
        });
        if config.voters.contains_key(&node_id) {
            let weak = Rc::downgrade(shard);
            transport.set_forward_handler(Rc::new(move |payload: Bytes| {
                let shard = weak.upgrade();
                async move {
                    match shard {
                        Some(shard) => serve_forwarded(&shard, &payload).await,
                        None => Err("shutting down".to_string()),
                    }
                }
                .boxed_local()
            }));
        }
        let raft = Raft::new(
            node_id as u64,
            ferrolog_raft::controller_config(),
            transport.factory(CONTROLLER_GROUP),
            store,
            PartitionStateMachine::with_apply_hook(hook),
        )
        .await
        .map_err(|e| anyhow::anyhow!("starting the controller quorum: {e}"))?;
        transport.register(CONTROLLER_GROUP, raft.clone(), log.clone())?;
        let voters = members(shard);
        // The lowest voter of a new cluster starts it; the others join when it calls.
        if fresh && voters.keys().next() == Some(&(node_id as u64)) {
            raft.initialize(voters)
                .await
                .map_err(|e| anyhow::anyhow!("initializing the controller quorum: {e}"))?;
            tracing::info!(node_id, "initialized a new cluster");
        }
        let quorum = Rc::new(Quorum {
            raft,
            transport,
            log,
            node_id,
        });
        glommio::spawn_local(controller_loop(Rc::downgrade(shard), quorum.clone())).detach();
        Ok(quorum)
    }

    /// Why the controller can no longer run, if it cannot: its metadata log failed (a storage
    /// error, with the file and the reason) or its Raft core stopped other than by a clean
    /// shutdown.
    pub fn failure(&self) -> Option<String> {
        if let Some(e) = self.log.failure() {
            return Some(format!("the controller's metadata log failed: {e}"));
        }
        let metrics = self.raft.metrics();
        let state = metrics.borrow_watched().running_state.clone();
        match state {
            Err(openraft::error::Fatal::Stopped) | Ok(()) => None,
            Err(e) => Some(format!("the controller quorum stopped: {e}")),
        }
    }

    /// This node leads the quorum and has applied every entry of earlier terms.
    pub fn is_ready_leader(&self) -> bool {
        let m = self.raft.metrics().borrow_watched().clone();
        m.current_leader == Some(self.node_id as u64)
            && m.last_applied.map(|l| l.leader_id.term) == Some(m.current_term)
    }

    /// This node's view of the quorum (term, vote, last log entry, committed, applied,
    /// leader), for a log line.
    pub fn describe(&self) -> String {
        self.raft.metrics().borrow_watched().to_string()
    }

    /// The node the quorum follows, if any.
    pub fn leader(&self) -> Option<i32> {
        let leader = self.raft.metrics().borrow_watched().current_leader;
        leader.map(|l| l as i32)
    }

    /// Commits `state` as the new cluster metadata; on success it has been applied here.
    pub async fn propose(&self, state: &ClusterState) -> Result<(), BrokerError> {
        if !self.is_ready_leader() {
            return Err(BrokerError::NotController);
        }
        let value = serde_json::to_vec(state).expect("cluster state serialises");
        let batch = codec::encode_key_value_batch(&[(STATE_KEY, Some(&value[..]))], now_ms());
        match GlommioRuntime::timeout(PROPOSE_TIMEOUT, self.raft.client_write(Batch(batch))).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) if e.forward_to_leader().is_some() => Err(BrokerError::NotController),
            Ok(Err(e)) => Err(BrokerError::RequestTimedOut(format!(
                "metadata change failed: {e}"
            ))),
            Err(_) => Err(BrokerError::RequestTimedOut(
                "metadata change not committed in time (no quorum?)".into(),
            )),
        }
    }
}

/// The state in a committed metadata entry; `None` for Raft's own entries.
fn decode_entry(entry: &Entry) -> Option<ClusterState> {
    let EntryPayload::Normal(Batch(bytes)) = &entry.payload else {
        return None;
    };
    let decoded = BatchHeader::parse(bytes)
        .map_err(|e| e.to_string())
        .and_then(|header| {
            batch::verify(bytes).map_err(|e| e.to_string())?;
            let mut state = None;
            codec::decode_key_value_batch(&header, bytes, |key, value| {
                if key == STATE_KEY {
                    state = value.map(serde_json::from_slice::<ClusterState>);
                }
            })
            .map_err(|e| e.to_string())?;
            match state {
                Some(Ok(s)) => Ok(s),
                Some(Err(e)) => Err(e.to_string()),
                None => Err("no cluster state record".into()),
            }
        });
    match decoded {
        Ok(state) => Some(state),
        Err(e) => {
            // A committed entry that does not decode is damage or a bug: keep serving the
            // last good metadata and say exactly which entry it was.
            tracing::error!(index = entry.log_id.index, error = %e, "controller log entry does not decode; ignored");
            None
        }
    }
}

/// Sends `request` to the controller leader's forward handler.
async fn forward(
    shard: &Shard,
    quorum: &Quorum,
    leader: i32,
    request: &Forwarded,
    ttl: Duration,
) -> Result<Bytes, String> {
    let addr = shard
        .config
        .voters
        .get(&leader)
        .ok_or_else(|| format!("node {leader} is not a configured voter"))?;
    let payload = Bytes::from(serde_json::to_vec(request).expect("serialises"));
    quorum
        .transport
        .forward(leader as u64, &addr.to_string(), payload, ttl)
        .await
}

/// The controller leader's side of a forwarded request.
async fn serve_forwarded(shard: &Rc<Shard>, payload: &[u8]) -> Result<Bytes, String> {
    let request: Forwarded =
        serde_json::from_slice(payload).map_err(|e| format!("bad request: {e}"))?;
    match request {
        Forwarded::RegisterBroker { id, record } => {
            let record = BrokerRecord {
                fenced: false,
                ..record
            };
            register(shard, id, record)
                .await
                .map_err(|e| e.to_string())?;
            Ok(Bytes::new())
        }
        Forwarded::ReportLeaders(reports) => {
            record_leaders(shard, reports)
                .await
                .map_err(|e| e.to_string())?;
            Ok(Bytes::new())
        }
        Forwarded::CreateTopics(specs) => Ok(reply(create_topics(shard, specs, false).await)),
        Forwarded::VerifyTxn {
            transactional_id,
            producer_id,
            epoch,
            partition,
        } => {
            let verified =
                crate::txn::verify_here(shard, transactional_id, producer_id, epoch, partition)
                    .await;
            Ok(reply(vec![verified]))
        }
        Forwarded::WriteTxnMarkers {
            producer_id,
            producer_epoch,
            commit,
            coordinator_epoch,
            partitions,
        } => {
            let marker = crate::producer_state::Marker {
                commit,
                coordinator_epoch,
            };
            let results = crate::txn::write_markers_here(
                shard,
                producer_id,
                producer_epoch,
                marker,
                partitions,
            )
            .await;
            Ok(reply(results))
        }
        Forwarded::DeleteTopics(names) => Ok(reply(delete_topics(shard, names).await)),
        Forwarded::ChangeTopic {
            name,
            change,
            validate_only,
        } => {
            let changed = change_topic(shard, name, change, validate_only).await;
            Ok(reply(vec![changed]))
        }
    }
}

/// Records what partition leaders reported, as the controller leader. A report of an older
/// epoch than the one recorded comes from a deposed leader and is dropped.
async fn record_leaders(
    shard: &Rc<Shard>,
    reports: Vec<(String, LeaderRecord)>,
) -> Result<(), BrokerError> {
    shard
        .on_controller(move |shard| {
            async move {
                let changed = shard.with_controller(|c| {
                    let mut changed = false;
                    for (key, record) in reports {
                        let current = c.state.leaders.get(&key);
                        if current.is_some_and(|cur| cur.epoch > record.epoch || *cur == record) {
                            continue;
                        }
                        c.state.leaders.insert(key, record);
                        changed = true;
                    }
                    changed
                });
                if changed {
                    shard.commit_metadata().await?;
                }
                Ok(())
            }
            .boxed_local()
        })
        .await
}

/// The leaderships this node holds, on any of its shards, that their metadata image does
/// not show yet.
async fn leader_reports(shard: &Rc<Shard>) -> Vec<(String, LeaderRecord)> {
    let asks = (0..shard.count).map(|s| {
        shard.invoke_on(ShardId(s), |shard| {
            let reports = shard_leader_reports(shard);
            async move { reports }.boxed_local()
        })
    });
    futures::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// `leader_reports` of one shard's replicated partitions.
fn shard_leader_reports(shard: &Shard) -> Vec<(String, LeaderRecord)> {
    let me = shard.config.node_id;
    let image = shard.image();
    shard
        .replicated_partitions()
        .iter()
        .filter_map(|p| {
            let replica = p.replication.raft()?;
            if !replica.is_leader() {
                return None;
            }
            let record = LeaderRecord {
                leader: me,
                epoch: replica.leader_epoch(),
                isr: replica.in_sync_replicas(),
            };
            let key = partition_key(&p.topic_id, p.index);
            let current = image.leaders.get(&key);
            if current == Some(&record) {
                return None;
            }
            // Leadership changes go at once; ISR-only changes at most every 2 s, so a
            // flapping follower does not flood the metadata log.
            let isr_only =
                current.is_some_and(|c| c.leader == record.leader && c.epoch == record.epoch);
            if isr_only
                && replica
                    .isr_reported_at
                    .get()
                    .is_some_and(|t| t.elapsed() < ISR_REPORT_INTERVAL)
            {
                return None;
            }
            replica.isr_reported_at.set(Some(Instant::now()));
            Some((key, record))
        })
        .collect()
}

/// This node's broker record, as it registers it.
fn this_broker(shard: &Shard) -> BrokerRecord {
    BrokerRecord {
        host: shard.config.advertised_host.clone(),
        port: shard.config.advertised_port,
        fenced: false,
        shards: shard.count as u32,
    }
}

/// Sets broker `id`'s record, as the controller leader.
async fn register(shard: &Rc<Shard>, id: i32, record: BrokerRecord) -> Result<(), BrokerError> {
    shard
        .on_controller(move |shard| {
            async move {
                let changed = shard.with_controller(|c| {
                    if c.state.brokers.get(&id) == Some(&record) {
                        return false;
                    }
                    c.state.brokers.insert(id, record);
                    true
                });
                if changed {
                    shard.commit_metadata().await?;
                    tracing::info!(broker = id, "registered broker");
                }
                Ok(())
            }
            .boxed_local()
        })
        .await
}

/// Leadership, first state, registration and liveness, every `TICK` on shard 0.
async fn controller_loop(shard: Weak<Shard>, quorum: Rc<Quorum>) {
    let mut last_forward = Instant::now() - Duration::from_secs(10);
    // Since when this node has led: heartbeat acks only mean something after a session.
    let mut leading_since: Option<Instant> = None;
    loop {
        glommio::timer::sleep(TICK).await;
        let Some(shard) = shard.upgrade() else {
            return;
        };
        if let Some(why) = quorum.failure() {
            // Its metadata image can no longer follow the cluster: answering clients from it
            // would send them to leaders long gone. Apache Kafka halts a broker whose metadata
            // log directory failed; so does ferrolog, and its partitions move as after a crash.
            tracing::error!("{why}: the node halts");
            std::process::exit(1);
        }
        let leader = quorum.leader();
        shard
            .cluster
            .controller_id
            .store(leader.unwrap_or(-1), Ordering::Relaxed);
        let me = this_broker(&shard);
        let applied = shard.with_controller(|c| c.applied().cloned());
        if !quorum.is_ready_leader() {
            leading_since = None;
        }
        if quorum.is_ready_leader() {
            let since = *leading_since.get_or_insert_with(Instant::now);
            if applied.is_none() {
                let result = shard
                    .on_controller(|shard| {
                        async move {
                            if shard.with_controller(|c| c.applied().is_some()) {
                                return Ok(());
                            }
                            let node_id = shard.config.node_id;
                            let me = this_broker(&shard);
                            shard.with_controller(|c| c.state = c.initial_state(node_id, me));
                            shard.commit_metadata().await
                        }
                        .boxed_local()
                    })
                    .await;
                if let Err(e) = result {
                    tracing::warn!(error = %e, "could not commit the first cluster state");
                }
                continue;
            }
            if applied
                .as_ref()
                .and_then(|s| s.brokers.get(&quorum.node_id))
                != Some(&me)
            {
                if let Err(e) = register(&shard, quorum.node_id, me).await {
                    tracing::warn!(error = %e, "could not register this broker");
                }
                continue;
            }
            if applied.is_some() {
                let reports = leader_reports(&shard).await;
                if !reports.is_empty() {
                    if let Err(e) = record_leaders(&shard, reports).await {
                        tracing::warn!(error = %e, "could not record partition leaders");
                    }
                }
            }
            let session = Duration::from_millis(shard.config.broker_session_timeout_ms as u64);
            if since.elapsed() >= session {
                if let Err(e) = fence_silent_brokers(&shard, &quorum).await {
                    tracing::warn!(error = %e, "could not update broker liveness");
                }
            }
        } else if let (Some(state), Some(leader)) = (&applied, leader) {
            let reports = leader_reports(&shard).await;
            if !reports.is_empty() && leader != quorum.node_id {
                let request = Forwarded::ReportLeaders(reports);
                if let Err(e) = forward(&shard, &quorum, leader, &request, FORWARD_TIMEOUT).await {
                    // Expected while the controller fails over; the next tick retries.
                    tracing::debug!(leader, error = %e, "reporting partition leaders failed; retrying");
                }
            }
            let registered = state.brokers.get(&quorum.node_id) == Some(&me);
            if !registered
                && leader != quorum.node_id
                && last_forward.elapsed() > Duration::from_secs(1)
            {
                last_forward = Instant::now();
                let request = Forwarded::RegisterBroker {
                    id: quorum.node_id,
                    record: me.clone(),
                };
                if let Err(e) = forward(&shard, &quorum, leader, &request, FORWARD_TIMEOUT).await {
                    tracing::info!(leader, error = %e, "registration with the controller failed; retrying");
                }
            }
        }
    }
}

/// Fences brokers whose heartbeats the leader has not had acknowledged within
/// `broker.session.timeout.ms`, unfences those that answer again.
async fn fence_silent_brokers(shard: &Rc<Shard>, quorum: &Rc<Quorum>) -> Result<(), BrokerError> {
    let heartbeats = quorum.raft.metrics().borrow_watched().heartbeat.clone();
    let Some(heartbeats) = heartbeats else {
        return Ok(());
    };
    let timeout = Duration::from_millis(shard.config.broker_session_timeout_ms as u64);
    let node_id = quorum.node_id;
    shard
        .on_controller(move |shard| {
            async move {
                let changed = shard.with_controller(|c| {
                    let mut changed = false;
                    for (id, broker) in c.state.brokers.iter_mut() {
                        if *id == node_id {
                            continue;
                        }
                        let alive = heartbeats
                            .get(&(*id as u64))
                            .and_then(|t| t.as_ref())
                            .is_some_and(|t| t.elapsed() < timeout);
                        if broker.fenced == alive {
                            broker.fenced = !alive;
                            changed = true;
                            tracing::info!(
                                broker = id,
                                fenced = broker.fenced,
                                "broker liveness changed"
                            );
                        }
                    }
                    changed
                });
                if changed {
                    shard.commit_metadata().await?;
                }
                Ok(())
            }
            .boxed_local()
        })
        .await
}
