//! Shards: one glommio executor per core, each owning a set of partitions end to end.
//!
//! Shards share nothing mutable. They talk through a glommio `channel_mesh` of bounded
//! channels carrying jobs (`invoke_on`): a closure that runs on the target shard, whose result
//! comes back over a oneshot. A job's synchronous part runs in the order jobs arrive, which is
//! what keeps appends from one connection in order. Shard 0 also runs the controller quorum
//! (cluster metadata in Raft group 0, `quorum`) and publishes each committed `MetadataImage`
//! to every shard. Partitions, replicated or not, are spread over the shards; each shard runs
//! the Raft groups of its replicated partitions (`replication::raft`) on its own Raft
//! transport (`replication::peers`).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::channel::oneshot;
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use glommio::sync::Semaphore;
use tokio::sync::Notify;

use crate::config::BrokerConfig;
use crate::errors::BrokerError;
use crate::fetch_session::FetchSessions;
use crate::group::{self, GroupCoordinator, OFFSETS_TOPIC};
use crate::mesh::{self, Mesh};
use crate::metadata::{shard_for, ClusterState, Controller, MetadataImage, ProducerIds};
use crate::partition::Partition;
use crate::quorum::Quorum;
use crate::replication::Placement;
use crate::txn::{self, TxnCoordinator, TRANSACTION_TOPIC};
use crate::types::{now_ms, ShardId, TopicPartition};

/// A closure sent to another shard.
pub type Job = Box<dyn FnOnce(&Rc<Shard>) + Send>;

/// Jobs queued per pair of shards before senders wait.
const MESH_CHANNEL_JOBS: usize = 1024;
/// Request bytes a shard holds in memory at once (reserved before a frame is read).
pub const REQUEST_MEMORY_BYTES: u64 = 512 << 20;
/// How often shards look for a shutdown request.
const SHUTDOWN_POLL_MS: u64 = 50;
/// How long a clean shutdown may take before the process exits anyway.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// How often shard 0 looks for a failed controller while the broker starts.
const STARTUP_WATCH_INTERVAL: Duration = Duration::from_millis(100);
/// How long the shards may take to start and join their mesh.
const MESH_JOIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a node still waiting for its first metadata image says so.
const STARTUP_REPORT_INTERVAL: Duration = Duration::from_secs(10);

/// Set by the signal thread on SIGTERM/SIGINT; every shard then closes its logs.
static SHUTDOWN: AtomicBool = AtomicBool::new(false);
/// Shards that finished closing their logs.
static SHARDS_CLOSED: AtomicUsize = AtomicUsize::new(0);

/// What every shard of a node may read about the cluster without a hop to shard 0.
#[derive(Debug)]
pub struct ClusterView {
    /// The controller quorum's leader (Metadata's controller id), -1 when there is none.
    pub controller_id: std::sync::atomic::AtomicI32,
}

pub struct Shard {
    pub id: ShardId,
    pub count: usize,
    pub config: Arc<BrokerConfig>,
    pub cluster: Arc<ClusterView>,
    senders: Mesh<Job>,
    image: RefCell<Arc<MetadataImage>>,
    partitions: RefCell<HashMap<TopicPartition, Rc<Partition>>>,
    /// Present on shard 0 only.
    controller: Option<RefCell<Controller>>,
    /// The controller quorum (Raft group 0); shard 0 only, set once it has started.
    quorum: RefCell<Option<Rc<Quorum>>>,
    /// This shard's Raft transport: its replicated partitions' groups (and on shard 0 the
    /// controller quorum's).
    pub raft_transport: Rc<ferrolog_raft::network::Transport>,
    /// Woken when a replica on this shard applies a log-start entry: followers then act on
    /// it at once rather than at the next retention pass.
    log_start_asked: Rc<Notify>,
    /// This node's producer-id allocator; shard 0 only.
    pub producer_ids: Option<ProducerIds>,
    /// Serialises controller changes (persist + publish) on shard 0.
    controller_lock: Semaphore,
    /// Serialises image installs: two concurrent ones would both open a new partition.
    image_lock: Semaphore,
    pub fetch_sessions: RefCell<FetchSessions>,
    /// The groups of the `__consumer_offsets` partitions this shard owns.
    pub groups: RefCell<GroupCoordinator>,
    /// The transactional ids of the `__transaction_state` partitions this shard owns.
    pub txns: RefCell<TxnCoordinator>,
    /// Bounds the bytes of requests being read or served on this shard.
    pub request_memory: Rc<Semaphore>,
    ready: RefCell<Option<oneshot::Sender<()>>>,
}

impl Shard {
    pub fn image(&self) -> Arc<MetadataImage> {
        self.image.borrow().clone()
    }

    /// The controller id clients are told (Metadata, DescribeCluster): the controller
    /// quorum's leader; while none is known, this node (or another live one), which takes
    /// CreateTopics and forwards it once a leader is elected, as any Kafka broker does. A
    /// client told -1 waits for a controller, librdkafka until its request times out.
    pub fn controller_for_clients(&self, image: &MetadataImage) -> i32 {
        let leader = self.cluster.controller_id.load(Ordering::Relaxed);
        let live = |id: &i32| image.brokers.get(id).is_some_and(|b| !b.fenced);
        if leader >= 0 {
            return leader;
        }
        let me = self.config.node_id;
        if live(&me) {
            return me;
        }
        image.brokers.keys().copied().find(live).unwrap_or(-1)
    }

    pub fn partition(&self, tp: &TopicPartition) -> Option<Rc<Partition>> {
        self.partitions.borrow().get(tp).cloned()
    }

    /// Whether this node holds a replica of `topic`'s `partition`.
    pub fn hosts(&self, topic: &crate::metadata::TopicMeta, partition: i32) -> bool {
        topic
            .replicas
            .get(partition as usize)
            .is_some_and(|r| r.contains(&self.config.node_id))
    }

    /// The shard that owns `tp`, UNKNOWN_TOPIC_OR_PARTITION, or NOT_LEADER_OR_FOLLOWER when
    /// another node has it.
    pub fn owner_of(
        &self,
        image: &MetadataImage,
        tp: &TopicPartition,
    ) -> Result<ShardId, BrokerError> {
        let topic = image
            .topic(&tp.topic)
            .ok_or(BrokerError::UnknownTopicOrPartition)?;
        if tp.partition < 0 || tp.partition >= topic.partitions {
            return Err(BrokerError::UnknownTopicOrPartition);
        }
        if !self.hosts(topic, tp.partition) {
            return Err(BrokerError::NotLeaderOrFollower);
        }
        Ok(self.owning_shard(topic, tp.partition))
    }

    /// The shard of this node that owns the partition: a replicated one is where its Raft
    /// group lives (`GroupId::shard`, which peers compute too), the others are spread by
    /// `shard_for`.
    pub fn owning_shard(&self, topic: &crate::metadata::TopicMeta, partition: i32) -> ShardId {
        let replicated = topic
            .replicas
            .get(partition as usize)
            .is_some_and(|r| r.len() > 1);
        if replicated {
            ShardId(topic.raft_group(partition).shard(self.count))
        } else {
            shard_for(&topic.id, partition, self.count)
        }
    }

    /// Runs `f` on shard `target` and returns its result. The synchronous part of `f` runs
    /// on the target in the order jobs were sent from here.
    pub async fn invoke_on<T, F>(self: &Rc<Self>, target: ShardId, f: F) -> T
    where
        T: Send + 'static,
        F: FnOnce(&Rc<Shard>) -> LocalBoxFuture<'static, T> + Send + 'static,
    {
        if target == self.id {
            return f(self).await;
        }
        self.submit(target, f)
            .await
            .await
            .expect("target shard dropped a job")
    }

    /// Sends `f` to run on shard `target` and returns once it is queued there, with a
    /// receiver for its result. Jobs queued by successive `submit` calls from one task run
    /// their synchronous part in that order, even when the channel was full for a while.
    pub async fn submit<T, F>(self: &Rc<Self>, target: ShardId, f: F) -> oneshot::Receiver<T>
    where
        T: Send + 'static,
        F: FnOnce(&Rc<Shard>) -> LocalBoxFuture<'static, T> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let run = move |shard: &Rc<Shard>| {
            let fut = f(shard);
            glommio::spawn_local(async move {
                let _ = tx.send(fut.await);
            })
            .detach();
        };
        if target == self.id {
            run(self);
        } else if self.senders.send_to(target.0, Box::new(run)).await.is_err() {
            panic!(
                "shard {} cannot reach shard {}: mesh closed",
                self.id.0, target.0
            );
        }
        rx
    }

    /// Runs `f` on the partition's owner with the partition, or fails with
    /// UNKNOWN_TOPIC_OR_PARTITION.
    pub async fn on_partition<T, F>(
        self: &Rc<Self>,
        tp: TopicPartition,
        f: F,
    ) -> Result<T, BrokerError>
    where
        T: Send + 'static,
        F: FnOnce(Rc<Partition>) -> LocalBoxFuture<'static, Result<T, BrokerError>>
            + Send
            + 'static,
    {
        let image = self.image();
        let owner = self.owner_of(&image, &tp)?;
        self.invoke_on(owner, move |shard| match shard.partition(&tp) {
            Some(p) => f(p),
            None => async { Err(BrokerError::UnknownTopicOrPartition) }.boxed_local(),
        })
        .await
    }

    /// Runs `f` with the controller on shard 0, holding the controller lock.
    pub async fn on_controller<T, F>(self: &Rc<Self>, f: F) -> T
    where
        T: Send + 'static,
        F: FnOnce(Rc<Shard>) -> LocalBoxFuture<'static, T> + Send + 'static,
    {
        self.invoke_on(ShardId(0), move |shard| {
            let shard = shard.clone();
            async move {
                let _guard = shard
                    .controller_lock
                    .acquire_permit(1)
                    .await
                    .expect("controller lock never closes");
                f(shard.clone()).await
            }
            .boxed_local()
        })
        .await
    }

    /// Controller only: mutable access to the cluster state.
    pub fn with_controller<T>(&self, f: impl FnOnce(&mut Controller) -> T) -> T {
        let controller = self
            .controller
            .as_ref()
            .expect("controller lives on shard 0");
        f(&mut controller.borrow_mut())
    }

    /// Controller only: commits the working copy of the cluster state through the controller
    /// quorum and publishes it to every shard, returning when all of them have applied it.
    /// Fails with NOT_CONTROLLER on a node that does not lead the quorum; the working copy
    /// is then back at the last committed state.
    pub async fn commit_metadata(self: &Rc<Self>) -> Result<(), BrokerError> {
        let quorum = self.quorum.borrow().clone();
        let Some(quorum) = quorum else {
            self.with_controller(|c| c.reset_to_applied());
            return Err(BrokerError::NotController);
        };
        let state = self.with_controller(|c| c.proposal());
        if let Err(e) = quorum.propose(&state).await {
            self.with_controller(|c| c.reset_to_applied());
            return Err(e);
        }
        // Committed, but applied only if no earlier proposal on the same base (one that
        // timed out, then committed) came first.
        if !self.with_controller(|c| c.applied() == Some(&state)) {
            self.with_controller(|c| c.reset_to_applied());
            return Err(BrokerError::RequestTimedOut(
                "the cluster metadata changed while this change was proposed; try again".into(),
            ));
        }
        self.publish_image().await;
        Ok(())
    }

    /// Controller only: a committed state arrived from the quorum's log.
    pub fn controller_applied(self: &Rc<Self>, state: ClusterState) {
        let seq = state.seq;
        if !self.with_controller(|c| c.set_applied(state)) {
            tracing::debug!(seq, "skipped a metadata entry built on an older state");
            return;
        }
        let me = self.clone();
        glommio::spawn_local(async move { me.publish_image().await }).detach();
    }

    /// Controller only: sends the image of the committed state to every shard.
    async fn publish_image(self: &Rc<Self>) {
        let image = Arc::new(self.with_controller(|c| c.image(&self.config.topic_defaults)));
        let mut waits = Vec::with_capacity(self.count);
        for s in 0..self.count {
            let image = image.clone();
            waits.push(self.invoke_on(ShardId(s), move |shard| {
                let shard = shard.clone();
                async move { shard.apply_image(image).await }.boxed_local()
            }));
        }
        futures::future::join_all(waits).await;
    }

    /// This shard's replicated partitions.
    pub fn replicated_partitions(&self) -> Vec<Rc<Partition>> {
        self.partitions
            .borrow()
            .values()
            .filter(|p| p.replication.raft().is_some())
            .cloned()
            .collect()
    }

    /// Controller only: the quorum, once started.
    pub fn quorum(&self) -> Option<Rc<Quorum>> {
        self.quorum.borrow().clone()
    }

    /// Installs a new image: opens partitions this shard now owns, drops (and deletes) those
    /// of deleted topics, pushes changed configs to open partitions.
    async fn apply_image(self: &Rc<Self>, image: Arc<MetadataImage>) {
        let _installing = self
            .image_lock
            .acquire_permit(1)
            .await
            .expect("image lock never closes");
        if image.version <= self.image.borrow().version && self.image.borrow().version != 0 {
            return;
        }
        *self.image.borrow_mut() = image.clone();
        crate::replication::peers::learn_peers(self, &image);
        let now = now_ms();
        let mut to_open = Vec::new();
        for topic in image.topics.values() {
            for p in 0..topic.partitions {
                if self.owning_shard(topic, p) != self.id || !self.hosts(topic, p) {
                    continue;
                }
                let tp = TopicPartition {
                    topic: topic.name.clone(),
                    partition: p,
                };
                match self.partition(&tp) {
                    Some(existing) if existing.topic_id == topic.id => {
                        if existing.settings() != topic.settings {
                            existing.set_settings(topic.settings.clone());
                        }
                    }
                    _ => to_open.push((
                        tp,
                        topic.id,
                        topic.raft_group(p),
                        topic.settings.clone(),
                        topic.replicas[p as usize].clone(),
                    )),
                }
            }
        }
        let gone: Vec<(TopicPartition, Rc<Partition>)> = self
            .partitions
            .borrow()
            .iter()
            .filter(|(tp, p)| image.topic(&tp.topic).is_none_or(|t| t.id != p.topic_id))
            .map(|(tp, p)| (tp.clone(), p.clone()))
            .collect();
        for (tp, p) in gone {
            self.partitions.borrow_mut().remove(&tp);
            if let Some(replica) = p.replication.raft() {
                self.raft_transport.unregister(replica.group());
            }
            p.replication.shutdown().await;
            if tp.topic == OFFSETS_TOPIC {
                self.groups.borrow_mut().unload(tp.partition);
            }
            if tp.topic == TRANSACTION_TOPIC {
                self.txns.borrow_mut().unload(tp.partition);
            }
            let _ = p.log.close().await;
            let dir = p.log.dir().to_path_buf();
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "could not delete partition directory");
            } else {
                tracing::info!(topic = %tp.topic, partition = tp.partition, "deleted partition");
            }
        }
        for (tp, id, group, settings, replicas) in to_open {
            let config = &self.config;
            let placement = Placement {
                node_id: config.node_id,
                replicas: &replicas,
                addrs: &config.voters,
                group,
                lag_max: Duration::from_millis(config.replica_lag_time_max_ms),
                log_start_asked: self.log_start_asked.clone(),
                transport: &self.raft_transport,
            };
            let opened = Partition::open(
                &config.log_dir,
                &tp.topic,
                id,
                tp.partition,
                settings,
                placement,
                now,
            )
            .await;
            match opened {
                Ok(p) => {
                    self.partitions.borrow_mut().insert(tp.clone(), p.clone());
                    if tp.topic == OFFSETS_TOPIC {
                        // Its groups are replayed in the background once this node leads it
                        // (at once with one replica); other partitions are served meanwhile.
                        group::follow_leadership(self);
                    }
                    if tp.topic == TRANSACTION_TOPIC {
                        txn::follow_leadership(self);
                    }
                }
                Err(e) => {
                    tracing::error!(topic = %tp.topic, partition = tp.partition, error = %e,
                        "cannot open partition; it stays offline");
                }
            }
        }
        if let Some(tx) = self.ready.borrow_mut().take() {
            let _ = tx.send(());
        }
    }

    /// Closes every partition log (flushes and writes indexes) for a clean shutdown.
    pub async fn close_all(&self) {
        let parts: Vec<Rc<Partition>> = self.partitions.borrow().values().cloned().collect();
        self.raft_transport.shutdown();
        if let Some(quorum) = self.quorum() {
            let _ = quorum.raft.shutdown().await;
        }
        for p in &parts {
            p.replication.shutdown().await;
        }
        for p in parts {
            if let Err(e) = p.log.close().await {
                tracing::warn!(topic = %p.topic, partition = p.index, error = %e, "close failed");
            }
        }
    }

    /// Applies retention to this shard's partitions every `log.retention.check.interval.ms`,
    /// and moves followers' log starts as soon as they apply a log-start entry.
    async fn retention_loop(self: Rc<Self>) {
        let interval = Duration::from_millis(self.config.retention_check_interval_ms);
        let mut next_pass = Instant::now() + interval;
        loop {
            let timer = glommio::timer::sleep(next_pass.saturating_duration_since(Instant::now()));
            let asked = self.log_start_asked.notified();
            futures::future::select(std::pin::pin!(timer), std::pin::pin!(asked)).await;
            let full = Instant::now() >= next_pass;
            if full {
                next_pass = Instant::now() + interval;
            }
            let parts: Vec<Rc<Partition>> = self.partitions.borrow().values().cloned().collect();
            let now = now_ms();
            for p in parts {
                let Some(done) = p.apply_retention(now, full).await else {
                    continue;
                };
                if let Err(e) = done {
                    tracing::warn!(topic = %p.topic, partition = p.index, error = %e, "retention failed");
                }
            }
        }
    }
}

/// Starts `cores` shards and serves until the process is killed. Blocks the calling thread.
pub fn run(mut config: BrokerConfig, cores: usize) -> anyhow::Result<()> {
    config.log_dir = open_dir(&config.log_dir, "log.dirs")?;
    // All held until the process exits (the kernel drops them with it).
    let _lock = lock_log_dir(&config.log_dir)?;
    let _metadata_lock = match config.metadata_log_dir.take() {
        Some(dir) => {
            let dir = open_dir(&dir, "metadata.log.dir")?;
            let misplaced = config.log_dir.join(crate::quorum::METADATA_DIR);
            if dir != config.log_dir && misplaced.exists() {
                anyhow::bail!(
                    "{} holds this node's metadata log, but metadata.log.dir is {}: move it \
                     there, or unset metadata.log.dir",
                    misplaced.display(),
                    dir.display()
                );
            }
            let lock = (dir != config.log_dir)
                .then(|| lock_log_dir(&dir))
                .transpose()?;
            config.metadata_log_dir = Some(dir);
            lock
        }
        None => None,
    };
    let _ports = claim_ports(&config, cores)?;
    // Load (and validate) the cluster state before any executor starts, so a damaged file
    // stops start-up with a clear message.
    let controller = Controller::load(&config.log_dir)?;
    let producer_ids = ProducerIds::load(
        &config.log_dir,
        config.node_id,
        controller.legacy_next_producer_id(),
    )?;
    let controller = Arc::new(std::sync::Mutex::new(Some((controller, producer_ids))));
    let cluster = Arc::new(ClusterView {
        controller_id: std::sync::atomic::AtomicI32::new(-1),
    });
    let config = Arc::new(config);
    let mesh = mesh::plan::<Job>(cores, MESH_CHANNEL_JOBS);
    spawn_signal_thread(cores)?;
    tracing::info!(cores, listen = %config.listen_addr, log_dir = %config.log_dir.display(), "starting ferrolog");
    let handles = glommio::LocalExecutorPoolBuilder::new(glommio::PoolPlacement::Unbound(cores))
        .name("ferrolog-shard")
        .on_all_shards(move || {
            let config = config.clone();
            let mesh = mesh.clone();
            let controller = controller.clone();
            let cluster = cluster.clone();
            async move {
                if let Err(e) = shard_main(config, cluster, mesh, controller).await {
                    tracing::error!("ferrolog stops: {e:#}");
                    std::process::exit(1);
                }
            }
        })
        .map_err(|e| anyhow::anyhow!("cannot start shards: {e}"))?;
    for r in handles.join_all() {
        r.map_err(|e| anyhow::anyhow!("shard thread failed: {e}"))?;
    }
    Ok(())
}

/// Creates directory `dir` (config `key`) if need be and returns its absolute path. Every
/// path of the broker is derived from one of these, and glommio opens a directory relative to
/// no directory at all (`openat(-1, ..)`), so a relative one (the default `ferrolog-data`
/// among them) must never reach it. Syncs it once for every partition directory in it: one
/// created just before a crash may not have had its entry synced yet (io syncs it when it
/// creates one).
fn open_dir(dir: &std::path::Path, key: &str) -> anyhow::Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("cannot create {key} {}: {e}", dir.display()))?;
    let dir = std::fs::canonicalize(dir)
        .map_err(|e| anyhow::anyhow!("cannot resolve {key} {}: {e}", dir.display()))?;
    std::fs::File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| anyhow::anyhow!("cannot sync {key} {}: {e}", dir.display()))?;
    Ok(dir)
}

/// Takes an exclusive lock (flock) on `log.dirs/.lock`, as Kafka takes one on its own: a
/// second ferrolog on the same directory (a node started twice) stops here instead of
/// writing the same logs. (Kafka's lock is an fcntl lock, which this one does not exclude.)
fn lock_log_dir(dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    let path = dir.join(".lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
    file.try_lock().map_err(|e| match e {
        std::fs::TryLockError::WouldBlock => anyhow::anyhow!(
            "failed to acquire the lock on {}: another broker is using log.dirs {}",
            path.display(),
            dir.display()
        ),
        std::fs::TryLockError::Error(e) => {
            anyhow::anyhow!("cannot lock {}: {e}", path.display())
        }
    })?;
    Ok(file)
}

/// Claims this broker's ports, or says another ferrolog holds them: the Kafka port, which the
/// shards share (each binds it with SO_REUSEPORT, and so would a second broker, silently
/// taking half the connections), and each shard's Raft port. The claim is an abstract Unix
/// socket named after the address, held for the life of the process (the kernel drops it
/// when the process dies, and it is per network namespace); a second ferrolog fails here even
/// when it starts at the same time, though the Kafka listener binds only once the node has
/// its metadata. Neither a bind nor a connect can tell: SO_REUSEPORT joins a live listener,
/// and a killed broker's listeners live on for a moment after it is gone (io_uring tears
/// its ring down later), accepting connections. A process other than ferrolog on the port
/// makes the shards' own bind fail.
///
/// Returns the claims, to be kept until exit.
fn claim_ports(
    config: &BrokerConfig,
    cores: usize,
) -> anyhow::Result<Vec<std::os::unix::net::UnixListener>> {
    use std::os::linux::net::SocketAddrExt;
    let claim = |addr: std::net::SocketAddr, what: &str| {
        let taken =
            || anyhow::anyhow!("cannot listen on {addr} ({what}): another ferrolog is using it");
        let name =
            std::os::unix::net::SocketAddr::from_abstract_name(format!("ferrolog-port-{addr}"))?;
        std::os::unix::net::UnixListener::bind_addr(&name).map_err(|e| match e.kind() {
            std::io::ErrorKind::AddrInUse => taken(),
            _ => anyhow::anyhow!("cannot claim {addr} ({what}): {e}"),
        })
    };
    let mut claims = vec![claim(config.listen_addr, "listeners")?];
    if let Some(base) = config.voters.get(&config.node_id) {
        for shard in 0..cores {
            if let Some(addr) = crate::replication::peers::shard_addr(*base, shard) {
                claims.push(claim(
                    addr,
                    "Raft traffic of a shard: controller.quorum.voters port + shard",
                )?);
            }
        }
    }
    Ok(claims)
}

/// On SIGTERM or SIGINT: ask every shard to close its logs (flush, write indexes), wait for
/// them, and exit. A second signal, or a timeout, exits at once; recovery handles the rest.
fn spawn_signal_thread(cores: usize) -> anyhow::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])?;
    std::thread::Builder::new()
        .name("ferrolog-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                tracing::info!(signal = sig, "shutting down: closing partition logs");
                SHUTDOWN.store(true, Ordering::SeqCst);
                let deadline = std::time::Instant::now() + SHUTDOWN_TIMEOUT;
                while SHARDS_CLOSED.load(Ordering::SeqCst) < cores
                    && std::time::Instant::now() < deadline
                {
                    if signals.pending().next().is_some() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(SHUTDOWN_POLL_MS));
                }
                let clean = SHARDS_CLOSED.load(Ordering::SeqCst) >= cores;
                tracing::info!(clean, "stopped");
                std::process::exit(if clean { 0 } else { 1 });
            }
        })?;
    Ok(())
}

async fn shutdown_watch(shard: Rc<Shard>) {
    while !SHUTDOWN.load(Ordering::SeqCst) {
        glommio::timer::sleep(Duration::from_millis(SHUTDOWN_POLL_MS)).await;
    }
    shard.close_all().await;
    SHARDS_CLOSED.fetch_add(1, Ordering::SeqCst);
}

async fn shard_main(
    config: Arc<BrokerConfig>,
    cluster: Arc<ClusterView>,
    mesh: Arc<mesh::Plan<Job>>,
    controller_slot: Arc<std::sync::Mutex<Option<(Controller, ProducerIds)>>>,
) -> anyhow::Result<()> {
    // Before any log opens on this thread: glommio learns here how the disks take I/O.
    let dirs = std::iter::once(&config.log_dir).chain(config.metadata_log_dir.as_ref());
    for dir in dirs {
        ferrolog_io::fs::probe_direct_reads(dir).await;
    }
    // A shard whose executor could not be created never connects its ends, and glommio
    // reports that only when every shard thread is joined: the others would wait here for
    // good, silently.
    let join = std::pin::pin!(mesh.take().connect());
    let deadline = std::pin::pin!(glommio::timer::sleep(MESH_JOIN_TIMEOUT));
    let (senders, receivers) = match futures::future::select(join, deadline).await {
        futures::future::Either::Left((joined, _)) => joined,
        futures::future::Either::Right(_) => anyhow::bail!(
            "not every shard started within {} s (a shard's executor could not be created)",
            MESH_JOIN_TIMEOUT.as_secs()
        ),
    };
    let id = ShardId(senders.id());
    let count = senders.shards();
    // Thread names carry glommio's executor id, not the shard's.
    tracing::debug!(
        shard = id.0,
        thread = std::thread::current().name().unwrap_or("?"),
        "shard joined the mesh"
    );
    let (controller, producer_ids) = if id.0 == 0 {
        let (c, p) = controller_slot
            .lock()
            .expect("not poisoned")
            .take()
            .expect("shard 0 takes the controller once");
        (Some(c), Some(p))
    } else {
        (None, None)
    };
    assert_eq!(
        controller.is_some(),
        id.0 == 0,
        "the controller lives on shard 0"
    );
    let (ready_tx, ready_rx) = oneshot::channel();
    let shard = Rc::new(Shard {
        id,
        count,
        config: config.clone(),
        cluster,
        senders,
        image: RefCell::new(Arc::new(MetadataImage {
            cluster_id: String::new(),
            version: 0,
            topics: BTreeMap::new(),
            topic_ids: HashMap::new(),
            brokers: BTreeMap::new(),
            leaders: BTreeMap::new(),
        })),
        partitions: RefCell::new(HashMap::new()),
        controller: controller.map(RefCell::new),
        quorum: RefCell::new(None),
        raft_transport: ferrolog_raft::network::Transport::new(),
        log_start_asked: Rc::new(Notify::new()),
        producer_ids,
        controller_lock: Semaphore::new(1),
        image_lock: Semaphore::new(1),
        fetch_sessions: RefCell::new(FetchSessions::new(id)),
        groups: RefCell::new(GroupCoordinator::default()),
        txns: RefCell::new(TxnCoordinator::default()),
        request_memory: Rc::new(Semaphore::new(REQUEST_MEMORY_BYTES)),
        ready: RefCell::new(Some(ready_tx)),
    });
    for receiver in receivers {
        let shard = shard.clone();
        glommio::spawn_local(async move {
            while let Some(job) = receiver.recv().await {
                job(&shard);
            }
        })
        .detach();
    }
    crate::replication::peers::start(&shard)?;
    let quorum = if id.0 == 0 {
        // Committed metadata is applied (and published) as the quorum starts; a new cluster
        // gets its first state once a leader is elected.
        let quorum = Quorum::start(&shard, shard.raft_transport.clone()).await?;
        tracing::info!(quorum = %quorum.describe(), "controller quorum started");
        *shard.quorum.borrow_mut() = Some(quorum.clone());
        Some(quorum)
    } else {
        None
    };
    wait_ready(ready_rx, quorum).await?;
    if id.0 == 0 && shard.config.auto_leader_rebalance {
        let interval = Duration::from_secs(shard.config.leader_imbalance_check_interval_s);
        let balance =
            crate::replication::preferred::balance_leaders(Rc::downgrade(&shard), interval);
        glommio::spawn_local(balance).detach();
    }
    glommio::spawn_local(shard.clone().retention_loop()).detach();
    glommio::spawn_local(group::tick_loop(shard.clone())).detach();
    glommio::spawn_local(txn::tick_loop(shard.clone())).detach();
    glommio::spawn_local(shutdown_watch(shard.clone())).detach();
    crate::kafka::server::serve(shard).await
}

/// Waits for the shard's first metadata image. Shard 0 also watches the controller meanwhile:
/// if its metadata log fails (a storage error) or its Raft core stops before the broker is
/// ready, start-up ends with the reason instead of running on without a listener.
async fn wait_ready(
    ready: oneshot::Receiver<()>,
    quorum: Option<Rc<Quorum>>,
) -> anyhow::Result<()> {
    let failed = async {
        let Some(quorum) = quorum else {
            return futures::future::pending().await;
        };
        let started = std::time::Instant::now();
        let mut said = Duration::ZERO;
        loop {
            if let Some(why) = quorum.failure() {
                return why;
            }
            // A node that waits long says where it stands, so a start-up that hangs can be
            // told apart: no leader, a leader whose entries do not arrive, or entries that
            // arrive and do not apply.
            let waited = started.elapsed();
            if waited >= said + STARTUP_REPORT_INTERVAL {
                said = waited;
                tracing::warn!(waited_s = waited.as_secs(), quorum = %quorum.describe(),
                    "still waiting for the first metadata image from the controller");
            }
            glommio::timer::sleep(STARTUP_WATCH_INTERVAL).await;
        }
    };
    match futures::future::select(ready, std::pin::pin!(failed)).await {
        futures::future::Either::Left((Ok(()), _)) => Ok(()),
        futures::future::Either::Left((Err(_), _)) => {
            Err(anyhow::anyhow!("no metadata image arrived"))
        }
        futures::future::Either::Right((why, _)) => Err(anyhow::anyhow!("{why}")),
    }
}
