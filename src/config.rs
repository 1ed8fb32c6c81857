//! Broker and topic configuration, under Apache Kafka's own names and defaults.
//!
//! `ferrolog start` reads an optional `server.properties` and `--override KEY=VALUE` pairs.
//! Keys ferrolog implements are parsed and range-checked; keys that Kafka knows but that have no
//! meaning here (thread pools, JMX, ...) are accepted with a warning; anything else stops
//! start-up with a message naming the key. Topic configs (`retention.ms`, `segment.bytes`, ...)
//! are described by one table, `TOPIC_CONFIGS`, used by CreateTopics, DescribeConfigs and the
//! AlterConfigs APIs alike.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};

/// Settings of the whole broker process.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// `node.id`.
    pub node_id: i32,
    /// `listeners`: where the Kafka protocol is served (PLAINTEXT only).
    pub listen_addr: SocketAddr,
    /// `advertised.listeners`: host and port clients are told to connect to.
    pub advertised_host: String,
    pub advertised_port: u16,
    /// `log.dirs` (first entry) or `log.dir`.
    pub log_dir: PathBuf,
    /// `metadata.log.dir`: where the controller's metadata log lives, when not in `log_dir`
    /// (`metadata_dir`).
    pub metadata_log_dir: Option<PathBuf>,
    /// `num.partitions`: partitions of an auto-created topic, and CreateTopics' default.
    pub num_partitions: i32,
    /// `default.replication.factor`.
    pub default_replication_factor: i16,
    /// `auto.create.topics.enable`.
    pub auto_create_topics: bool,
    /// `delete.topic.enable`.
    pub delete_topic_enable: bool,
    /// `socket.request.max.bytes`: a larger request frame closes the connection.
    pub socket_request_max_bytes: usize,
    /// `log.retention.check.interval.ms`.
    pub retention_check_interval_ms: u64,
    /// Broker-level defaults of topic configs (`log.segment.bytes` -> `segment.bytes`, ...).
    pub topic_defaults: BTreeMap<&'static str, String>,
    /// The group coordinator's configs.
    pub group: GroupConfig,
    pub txn: TxnConfig,
    /// `controller.quorum.voters` (`id@host:port,...`): every node of the cluster, each a
    /// voter of the controller quorum (Raft group 0), with the address it serves Raft traffic
    /// on. Empty (the default): a cluster of this node alone, with no Raft port.
    pub voters: BTreeMap<i32, SocketAddr>,
    /// `replica.lag.time.max.ms` (default 30000): a follower that has not had the leader's
    /// whole log (as of a moment before) for this long, or whose node stopped answering
    /// pings for this long, leaves the ISR.
    pub replica_lag_time_max_ms: u64,
    /// `broker.session.timeout.ms` (default 9000): a node the controller has not heard from
    /// for this long is fenced, and leaves Metadata until it is back.
    pub broker_session_timeout_ms: i64,
    /// `auto.leader.rebalance.enable` (default true) and
    /// `leader.imbalance.check.interval.seconds` (default 300): how often the controller
    /// leader moves partitions back to their preferred replicas (`replication::preferred`).
    pub auto_leader_rebalance: bool,
    pub leader_imbalance_check_interval_s: u64,
}

/// The transaction coordinator's configs, with Kafka 4.1's names and defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnConfig {
    /// `transaction.state.log.num.partitions` (default 50): partitions of
    /// `__transaction_state`.
    pub topic_partitions: i32,
    /// `transaction.state.log.replication.factor` (default 3), capped at the cluster's size.
    pub topic_replication_factor: i16,
    /// `transaction.state.log.min.isr` (default 2), capped at the replication factor.
    pub topic_min_isr: i32,
    /// `transaction.state.log.segment.bytes` (default 100 MiB).
    pub topic_segment_bytes: i64,
    /// `transaction.max.timeout.ms` (default 900000): the longest timeout a producer may ask.
    pub max_timeout_ms: i32,
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms` (default 10000): how
    /// often transactions past their timeout are looked for and aborted.
    pub abort_timed_out_interval_ms: i64,
    /// `transactional.id.expiration.ms` (default 604800000, 7 days): a transactional id with
    /// no transaction open and no change for this long is forgotten (its producer id too).
    pub id_expiration_ms: i64,
    /// `transaction.remove.expired.transaction.cleanup.interval.ms` (default 3600000): how
    /// often expired transactional ids are looked for.
    pub remove_expired_interval_ms: i64,
}

impl Default for TxnConfig {
    fn default() -> Self {
        TxnConfig {
            topic_partitions: 50,
            topic_replication_factor: 3,
            topic_min_isr: 2,
            topic_segment_bytes: 104_857_600,
            max_timeout_ms: 900_000,
            abort_timed_out_interval_ms: 10_000,
            id_expiration_ms: 604_800_000,
            remove_expired_interval_ms: 3_600_000,
        }
    }
}

/// The group coordinator's configs, with Kafka 4.1's names and defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupConfig {
    /// `offsets.topic.num.partitions` (default 50): partitions of `__consumer_offsets`.
    pub offsets_topic_partitions: i32,
    /// `offsets.topic.segment.bytes` (default 100 MiB).
    pub offsets_topic_segment_bytes: i64,
    /// `offsets.topic.replication.factor` (default 3), capped at the cluster's size (the
    /// voters; 1 for a single node).
    pub offsets_topic_replication_factor: i16,
    /// `offsets.retention.minutes` (default 7 days), in ms: how long the offsets of an empty
    /// group (or of a standalone consumer) are kept after the group emptied or the commit.
    pub offsets_retention_ms: i64,
    /// `offsets.retention.check.interval.ms` (default 600000).
    pub offsets_retention_check_interval_ms: i64,
    /// `offset.metadata.max.bytes` (default 4096).
    pub offset_metadata_max_bytes: usize,
    /// `group.initial.rebalance.delay.ms` (default 3000): how long a new classic group waits
    /// for more members before its first rebalance completes.
    pub initial_rebalance_delay_ms: i64,
    /// `group.min.session.timeout.ms` (default 6000).
    pub min_session_timeout_ms: i32,
    /// `group.max.session.timeout.ms` (default 1800000).
    pub max_session_timeout_ms: i32,
    /// `group.max.size` (default unbounded): members of one classic group.
    pub max_size: usize,
    /// `group.consumer.session.timeout.ms` (default 45000): KIP-848 member session timeout.
    pub consumer_session_timeout_ms: i32,
    /// `group.consumer.min.session.timeout.ms` (default 45000).
    pub consumer_min_session_timeout_ms: i32,
    /// `group.consumer.max.session.timeout.ms` (default 60000).
    pub consumer_max_session_timeout_ms: i32,
    /// `group.consumer.heartbeat.interval.ms` (default 5000).
    pub consumer_heartbeat_interval_ms: i32,
    /// `group.consumer.min.heartbeat.interval.ms` (default 5000).
    pub consumer_min_heartbeat_interval_ms: i32,
    /// `group.consumer.max.heartbeat.interval.ms` (default 15000).
    pub consumer_max_heartbeat_interval_ms: i32,
    /// `group.consumer.max.size` (default unbounded): members of one KIP-848 group.
    pub consumer_max_size: usize,
    /// `group.consumer.assignors` (default uniform, range): the server-side assignors, the
    /// first being the default.
    pub consumer_assignors: Vec<String>,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            offsets_topic_partitions: 50,
            offsets_topic_segment_bytes: 104_857_600,
            offsets_topic_replication_factor: 3,
            offsets_retention_ms: 10_080 * 60_000,
            offsets_retention_check_interval_ms: 600_000,
            offset_metadata_max_bytes: 4096,
            initial_rebalance_delay_ms: 3000,
            min_session_timeout_ms: 6000,
            max_session_timeout_ms: 1_800_000,
            max_size: i32::MAX as usize,
            consumer_session_timeout_ms: 45_000,
            consumer_min_session_timeout_ms: 45_000,
            consumer_max_session_timeout_ms: 60_000,
            consumer_heartbeat_interval_ms: 5000,
            consumer_min_heartbeat_interval_ms: 5000,
            consumer_max_heartbeat_interval_ms: 15_000,
            consumer_max_size: i32::MAX as usize,
            consumer_assignors: vec!["uniform".into(), "range".into()],
        }
    }
}

impl GroupConfig {
    /// Kafka's cross-field checks (`GroupCoordinatorConfig`).
    fn check(&self) -> anyhow::Result<()> {
        if self.min_session_timeout_ms > self.max_session_timeout_ms {
            bail!("group.min.session.timeout.ms must not exceed group.max.session.timeout.ms");
        }
        let c = self;
        if !(c.consumer_min_session_timeout_ms..=c.consumer_max_session_timeout_ms)
            .contains(&c.consumer_session_timeout_ms)
        {
            bail!("group.consumer.session.timeout.ms must be between group.consumer.min.session.timeout.ms and group.consumer.max.session.timeout.ms");
        }
        if !(c.consumer_min_heartbeat_interval_ms..=c.consumer_max_heartbeat_interval_ms)
            .contains(&c.consumer_heartbeat_interval_ms)
        {
            bail!("group.consumer.heartbeat.interval.ms must be between group.consumer.min.heartbeat.interval.ms and group.consumer.max.heartbeat.interval.ms");
        }
        if c.consumer_heartbeat_interval_ms >= c.consumer_session_timeout_ms {
            bail!("group.consumer.heartbeat.interval.ms must be less than group.consumer.session.timeout.ms");
        }
        Ok(())
    }
}

/// One topic-level config: its Kafka name, the broker key that sets its default, the default,
/// its type and its valid range.
pub struct TopicConfigDef {
    pub name: &'static str,
    pub broker_key: Option<&'static str>,
    pub default: &'static str,
    pub kind: ConfigKind,
    /// Whether ferrolog acts on it (others are stored and described, with no effect yet).
    pub honoured: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigKind {
    Long {
        min: i64,
    },
    Int {
        min: i64,
    },
    Bool,
    Str,
    /// A value from a fixed set (comma-separated list allowed for `cleanup.policy`).
    OneOf(&'static [&'static str]),
    List(&'static [&'static str]),
    Double,
}

impl ConfigKind {
    /// Kafka's DescribeConfigs `config_type`: BOOLEAN=1, STRING=2, INT=3, LONG=5, DOUBLE=6, LIST=7.
    pub fn describe_type(self) -> i8 {
        match self {
            ConfigKind::Bool => 1,
            ConfigKind::Str | ConfigKind::OneOf(_) => 2,
            ConfigKind::Int { .. } => 3,
            ConfigKind::Long { .. } => 5,
            ConfigKind::Double => 6,
            ConfigKind::List(_) => 7,
        }
    }
}

const LONG0: ConfigKind = ConfigKind::Long { min: 0 };
const LONGM1: ConfigKind = ConfigKind::Long { min: -1 };

/// Every topic config Kafka 4.1 defines (33; `message.downconversion.enable` went in 4.0),
/// with its default.
pub const TOPIC_CONFIGS: &[TopicConfigDef] = &[
    def(
        "cleanup.policy",
        Some("log.cleanup.policy"),
        "delete",
        ConfigKind::List(&["delete", "compact"]),
        false,
    ),
    def(
        "compression.gzip.level",
        Some("compression.gzip.level"),
        "-1",
        ConfigKind::Int { min: -1 },
        false,
    ),
    def(
        "compression.lz4.level",
        Some("compression.lz4.level"),
        "9",
        ConfigKind::Int { min: 1 },
        false,
    ),
    def(
        "compression.type",
        Some("compression.type"),
        "producer",
        ConfigKind::OneOf(&["uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"]),
        false,
    ),
    def(
        "compression.zstd.level",
        Some("compression.zstd.level"),
        "3",
        ConfigKind::Int { min: -131072 },
        false,
    ),
    def(
        "delete.retention.ms",
        Some("log.cleaner.delete.retention.ms"),
        "86400000",
        LONG0,
        false,
    ),
    def(
        "file.delete.delay.ms",
        Some("log.segment.delete.delay.ms"),
        "60000",
        LONG0,
        false,
    ),
    def(
        "flush.messages",
        Some("log.flush.interval.messages"),
        "9223372036854775807",
        ConfigKind::Long { min: 1 },
        false,
    ),
    def(
        "flush.ms",
        Some("log.flush.interval.ms"),
        "9223372036854775807",
        LONG0,
        false,
    ),
    def(
        "follower.replication.throttled.replicas",
        None,
        "",
        ConfigKind::Str,
        false,
    ),
    def(
        "index.interval.bytes",
        Some("log.index.interval.bytes"),
        "4096",
        ConfigKind::Int { min: 0 },
        true,
    ),
    def(
        "leader.replication.throttled.replicas",
        None,
        "",
        ConfigKind::Str,
        false,
    ),
    def(
        "local.retention.bytes",
        Some("log.local.retention.bytes"),
        "-2",
        ConfigKind::Long { min: -2 },
        false,
    ),
    def(
        "local.retention.ms",
        Some("log.local.retention.ms"),
        "-2",
        ConfigKind::Long { min: -2 },
        false,
    ),
    def(
        "max.compaction.lag.ms",
        Some("log.cleaner.max.compaction.lag.ms"),
        "9223372036854775807",
        ConfigKind::Long { min: 1 },
        false,
    ),
    def(
        "max.message.bytes",
        Some("message.max.bytes"),
        "1048588",
        ConfigKind::Int { min: 0 },
        true,
    ),
    def(
        "message.timestamp.after.max.ms",
        Some("log.message.timestamp.after.max.ms"),
        "3600000",
        LONG0,
        true,
    ),
    def(
        "message.timestamp.before.max.ms",
        Some("log.message.timestamp.before.max.ms"),
        "9223372036854775807",
        LONG0,
        true,
    ),
    def(
        "message.timestamp.type",
        Some("log.message.timestamp.type"),
        "CreateTime",
        ConfigKind::OneOf(&["CreateTime", "LogAppendTime"]),
        true,
    ),
    def(
        "min.cleanable.dirty.ratio",
        Some("log.cleaner.min.cleanable.ratio"),
        "0.5",
        ConfigKind::Double,
        false,
    ),
    def(
        "min.compaction.lag.ms",
        Some("log.cleaner.min.compaction.lag.ms"),
        "0",
        LONG0,
        false,
    ),
    def(
        "min.insync.replicas",
        Some("min.insync.replicas"),
        "1",
        ConfigKind::Int { min: 1 },
        true,
    ),
    def(
        "preallocate",
        Some("log.preallocate"),
        "false",
        ConfigKind::Bool,
        false,
    ),
    def(
        "remote.log.copy.disable",
        None,
        "false",
        ConfigKind::Bool,
        false,
    ),
    def(
        "remote.log.delete.on.disable",
        None,
        "false",
        ConfigKind::Bool,
        false,
    ),
    def(
        "remote.storage.enable",
        None,
        "false",
        ConfigKind::Bool,
        false,
    ),
    def(
        "retention.bytes",
        Some("log.retention.bytes"),
        "-1",
        LONGM1,
        true,
    ),
    def(
        "retention.ms",
        Some("log.retention.ms"),
        "604800000",
        LONGM1,
        true,
    ),
    // KIP-1030 (Kafka 4.0) raised the minimum from 14 bytes to 1 MiB.
    def(
        "segment.bytes",
        Some("log.segment.bytes"),
        "1073741824",
        ConfigKind::Int { min: 1_048_576 },
        true,
    ),
    def(
        "segment.index.bytes",
        Some("log.index.size.max.bytes"),
        "10485760",
        ConfigKind::Int { min: 4 },
        false,
    ),
    def(
        "segment.jitter.ms",
        Some("log.roll.jitter.ms"),
        "0",
        LONG0,
        false,
    ),
    def(
        "segment.ms",
        Some("log.roll.ms"),
        "604800000",
        ConfigKind::Long { min: 1 },
        true,
    ),
    def(
        "unclean.leader.election.enable",
        Some("unclean.leader.election.enable"),
        "false",
        ConfigKind::Bool,
        false,
    ),
];

const fn def(
    name: &'static str,
    broker_key: Option<&'static str>,
    default: &'static str,
    kind: ConfigKind,
    honoured: bool,
) -> TopicConfigDef {
    TopicConfigDef {
        name,
        broker_key,
        default,
        kind,
        honoured,
    }
}

pub fn topic_config_def(name: &str) -> Option<&'static TopicConfigDef> {
    TOPIC_CONFIGS.iter().find(|d| d.name == name)
}

/// Checks one value against its definition; the error is the message Kafka clients see.
pub fn validate_value(def: &TopicConfigDef, value: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!(
            "Invalid value {value} for configuration {}: {why}",
            def.name
        ))
    };
    match def.kind {
        ConfigKind::Long { min } | ConfigKind::Int { min } => match value.trim().parse::<i64>() {
            Ok(v) if v < min => bad(&format!("Value must be at least {min}")),
            Ok(v) if matches!(def.kind, ConfigKind::Int { .. }) && v > i64::from(i32::MAX) => {
                bad("Not a number of type INT")
            }
            Ok(_) => Ok(()),
            Err(_) => bad("Not a number"),
        },
        ConfigKind::Bool => match value.trim().to_ascii_lowercase().as_str() {
            "true" | "false" => Ok(()),
            _ => bad("Expected value to be either true or false"),
        },
        ConfigKind::Double => value
            .trim()
            .parse::<f64>()
            .map(|_| ())
            .or_else(|_| bad("Not a number")),
        ConfigKind::Str => Ok(()),
        ConfigKind::OneOf(allowed) => {
            if allowed.contains(&value.trim()) {
                Ok(())
            } else {
                bad(&format!("String must be one of: {}", allowed.join(", ")))
            }
        }
        ConfigKind::List(allowed) => {
            for item in value.split(',').map(str::trim) {
                if !allowed.contains(&item) {
                    return bad(&format!("String must be one of: {}", allowed.join(", ")));
                }
            }
            Ok(())
        }
    }
}

/// Broker keys Kafka defines that have no effect in ferrolog; accepted with a warning so an
/// existing `server.properties` works.
const IGNORED_BROKER_KEYS: &[&str] = &[
    "process.roles",
    "controller.quorum.bootstrap.servers",
    "controller.listener.names",
    "inter.broker.listener.name",
    "listener.security.protocol.map",
    "num.network.threads",
    "num.io.threads",
    "num.replica.fetchers",
    "num.recovery.threads.per.data.dir",
    "socket.send.buffer.bytes",
    "socket.receive.buffer.bytes",
    "group.coordinator.rebalance.protocols",
    "share.coordinator.state.topic.replication.factor",
    "share.coordinator.state.topic.min.isr",
    "log.flush.interval.messages",
    "log.flush.interval.ms",
    "log.cleaner.enable",
    "broker.rack",
    "zookeeper.connect",
    // Kafka's KRaft controller ignores it too: it balances whenever any leader is off.
    "leader.imbalance.per.broker.percentage",
];

impl Default for BrokerConfig {
    fn default() -> Self {
        let mut topic_defaults = BTreeMap::new();
        for d in TOPIC_CONFIGS {
            topic_defaults.insert(d.name, d.default.to_string());
        }
        BrokerConfig {
            node_id: 1,
            listen_addr: "127.0.0.1:9092".parse().expect("valid address"),
            advertised_host: "127.0.0.1".into(),
            advertised_port: 9092,
            log_dir: PathBuf::from("ferrolog-data"),
            metadata_log_dir: None,
            num_partitions: 1,
            default_replication_factor: 1,
            auto_create_topics: true,
            delete_topic_enable: true,
            socket_request_max_bytes: 104_857_600,
            retention_check_interval_ms: 300_000,
            topic_defaults,
            group: GroupConfig::default(),
            txn: TxnConfig::default(),
            voters: BTreeMap::new(),
            replica_lag_time_max_ms: 30_000,
            auto_leader_rebalance: true,
            leader_imbalance_check_interval_s: 300,
            broker_session_timeout_ms: 9000,
        }
    }
}

/// Parses Java-properties text: `key=value` or `key: value`, `#`/`!` comments, `\` line
/// continuations.
pub fn parse_properties(text: &str) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut logical = String::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim_start();
        if logical.is_empty() && (line.is_empty() || line.starts_with('#') || line.starts_with('!'))
        {
            continue;
        }
        if let Some(stripped) = line.strip_suffix('\\') {
            logical.push_str(stripped);
            continue;
        }
        logical.push_str(line);
        let entry = std::mem::take(&mut logical);
        let split = entry
            .find(['=', ':'])
            .with_context(|| format!("line {}: expected KEY=VALUE, got {entry:?}", n + 1))?;
        out.push((
            entry[..split].trim().to_string(),
            entry[split + 1..].trim().to_string(),
        ));
    }
    Ok(out)
}

fn parse_listener(value: &str, key: &str) -> anyhow::Result<(String, u16)> {
    let first = value.split(',').next().unwrap_or_default().trim();
    let Some((proto, hostport)) = first.split_once("://") else {
        bail!("{key}={value}: expected PLAINTEXT://HOST:PORT");
    };
    if proto != "PLAINTEXT" {
        bail!("{key}={value}: only PLAINTEXT listeners are supported");
    }
    let (host, port) = hostport
        .rsplit_once(':')
        .with_context(|| format!("{key}={value}: missing port"))?;
    let port: u16 = port
        .parse()
        .with_context(|| format!("{key}={value}: bad port"))?;
    Ok((host.trim_matches(['[', ']']).to_string(), port))
}

/// `controller.quorum.voters`: `id@host:port` entries separated by commas.
fn parse_voters(value: &str, key: &str) -> anyhow::Result<BTreeMap<i32, SocketAddr>> {
    let mut voters = BTreeMap::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (id, addr) = entry
            .split_once('@')
            .with_context(|| format!("{key}={value}: expected ID@HOST:PORT, got {entry:?}"))?;
        let id: i32 = id
            .parse()
            .ok()
            .filter(|id| *id >= 0)
            .with_context(|| format!("{key}={value}: bad node id {id:?}"))?;
        let addr: SocketAddr = addr
            .parse()
            .with_context(|| format!("{key}={value}: {addr:?} is not an IP:PORT address"))?;
        if voters.insert(id, addr).is_some() {
            bail!("{key}={value}: node {id} is listed twice");
        }
    }
    Ok(voters)
}

impl BrokerConfig {
    /// The directory of the controller's metadata log: `metadata.log.dir`, or by default
    /// `log.dirs`' first entry, as in Kafka.
    pub fn metadata_dir(&self) -> &std::path::Path {
        self.metadata_log_dir.as_deref().unwrap_or(&self.log_dir)
    }

    /// Applies settings in order; later ones win. Unknown keys are an error.
    pub fn apply(&mut self, settings: &[(String, String)]) -> anyhow::Result<()> {
        let mut advertised_set = false;
        // (precedence, value); 0 = not set.
        let mut retention: (u8, i64) = (0, 0);
        let mut roll: (u8, i64) = (0, 0);
        for (key, value) in settings {
            let v = value.as_str();
            let int = |min: i64, max: i64| -> anyhow::Result<i64> {
                let n: i64 = v
                    .parse()
                    .with_context(|| format!("{key}={v}: not a number"))?;
                if n < min || n > max {
                    bail!("{key}={v}: must be between {min} and {max}");
                }
                Ok(n)
            };
            let boolean = || -> anyhow::Result<bool> {
                match v.to_ascii_lowercase().as_str() {
                    "true" => Ok(true),
                    "false" => Ok(false),
                    _ => bail!("{key}={v}: expected true or false"),
                }
            };
            match key.as_str() {
                // Producer ids are `node.id << 40` plus a counter (metadata::ProducerIds).
                "node.id" | "broker.id" => self.node_id = int(0, (1 << 23) - 1)? as i32,
                "listeners" => {
                    let (host, port) = parse_listener(v, key)?;
                    let bind_host = if host.is_empty() {
                        "0.0.0.0".to_string()
                    } else {
                        host.clone()
                    };
                    self.listen_addr = format!("{bind_host}:{port}")
                        .parse()
                        .with_context(|| format!("{key}={v}: host must be an IP address"))?;
                    if !advertised_set {
                        self.advertised_host = if host.is_empty() || host == "0.0.0.0" {
                            "127.0.0.1".into()
                        } else {
                            host
                        };
                        self.advertised_port = port;
                    }
                }
                "advertised.listeners" => {
                    let (host, port) = parse_listener(v, key)?;
                    self.advertised_host = host;
                    self.advertised_port = port;
                    advertised_set = true;
                }
                "log.dirs" | "log.dir" => {
                    let first = v.split(',').next().unwrap_or_default().trim();
                    if first.is_empty() {
                        bail!("{key} is empty");
                    }
                    self.log_dir = PathBuf::from(first);
                }
                "metadata.log.dir" => {
                    if v.trim().is_empty() {
                        bail!("{key} is empty");
                    }
                    self.metadata_log_dir = Some(PathBuf::from(v.trim()));
                }
                "num.partitions" => self.num_partitions = int(1, 1_000_000)? as i32,
                "default.replication.factor" => {
                    self.default_replication_factor = int(1, 1)? as i16;
                }
                "auto.create.topics.enable" => self.auto_create_topics = boolean()?,
                "delete.topic.enable" => self.delete_topic_enable = boolean()?,
                "socket.request.max.bytes" => {
                    self.socket_request_max_bytes = int(1, i64::from(i32::MAX))? as usize
                }
                "log.retention.check.interval.ms" => {
                    self.retention_check_interval_ms = int(1, i64::MAX)? as u64
                }
                // Kafka's precedence: log.retention.ms over .minutes over .hours, and
                // log.roll.ms over log.roll.hours, whatever the order they appear in.
                "log.retention.minutes" => {
                    let n = int(-1, i64::MAX / 60_000)?;
                    prefer(&mut retention, 2, if n < 0 { -1 } else { n * 60_000 });
                }
                "log.retention.hours" => {
                    let n = int(-1, i64::MAX / 3_600_000)?;
                    prefer(&mut retention, 1, if n < 0 { -1 } else { n * 3_600_000 });
                }
                "log.retention.ms" => prefer(&mut retention, 3, int(-1, i64::MAX)?),
                "log.roll.hours" => prefer(&mut roll, 1, int(1, i64::MAX / 3_600_000)? * 3_600_000),
                "log.roll.ms" => prefer(&mut roll, 2, int(1, i64::MAX)?),
                "transaction.state.log.num.partitions" => {
                    self.txn.topic_partitions = int(1, 100_000)? as i32
                }
                "transaction.state.log.replication.factor" => {
                    self.txn.topic_replication_factor = int(1, i64::from(i16::MAX))? as i16
                }
                "transaction.state.log.min.isr" => {
                    self.txn.topic_min_isr = int(1, i64::from(i16::MAX))? as i32
                }
                "transaction.state.log.segment.bytes" => {
                    self.txn.topic_segment_bytes = int(1, i64::from(i32::MAX))?
                }
                "transaction.max.timeout.ms" => {
                    self.txn.max_timeout_ms = int(1, i64::from(i32::MAX))? as i32
                }
                "transaction.abort.timed.out.transaction.cleanup.interval.ms" => {
                    self.txn.abort_timed_out_interval_ms = int(1, i64::from(i32::MAX))?
                }
                "transactional.id.expiration.ms" => {
                    self.txn.id_expiration_ms = int(1, i64::from(i32::MAX))?
                }
                "transaction.remove.expired.transaction.cleanup.interval.ms" => {
                    self.txn.remove_expired_interval_ms = int(1, i64::from(i32::MAX))?
                }
                "offsets.topic.num.partitions" => {
                    self.group.offsets_topic_partitions = int(1, 100_000)? as i32
                }
                "offsets.topic.replication.factor" => {
                    self.group.offsets_topic_replication_factor =
                        int(1, i64::from(i16::MAX))? as i16
                }
                "offsets.topic.segment.bytes" => {
                    self.group.offsets_topic_segment_bytes = int(1, i64::from(i32::MAX))?
                }
                "offsets.retention.minutes" => {
                    self.group.offsets_retention_ms = int(1, i64::from(i32::MAX))? * 60_000
                }
                "offsets.retention.check.interval.ms" => {
                    self.group.offsets_retention_check_interval_ms = int(1, i64::MAX)?
                }
                "offset.metadata.max.bytes" => {
                    self.group.offset_metadata_max_bytes = int(0, i64::from(i32::MAX))? as usize
                }
                "group.initial.rebalance.delay.ms" => {
                    self.group.initial_rebalance_delay_ms = int(0, i64::from(i32::MAX))?
                }
                "group.min.session.timeout.ms" => {
                    self.group.min_session_timeout_ms = int(1, i64::from(i32::MAX))? as i32
                }
                "group.max.session.timeout.ms" => {
                    self.group.max_session_timeout_ms = int(1, i64::from(i32::MAX))? as i32
                }
                "group.max.size" => self.group.max_size = int(1, i64::from(i32::MAX))? as usize,
                "group.consumer.session.timeout.ms" => {
                    self.group.consumer_session_timeout_ms = int(1, i64::from(i32::MAX))? as i32
                }
                "group.consumer.min.session.timeout.ms" => {
                    self.group.consumer_min_session_timeout_ms = int(1, i64::from(i32::MAX))? as i32
                }
                "group.consumer.max.session.timeout.ms" => {
                    self.group.consumer_max_session_timeout_ms = int(1, i64::from(i32::MAX))? as i32
                }
                "group.consumer.heartbeat.interval.ms" => {
                    self.group.consumer_heartbeat_interval_ms = int(1, i64::from(i32::MAX))? as i32
                }
                "group.consumer.min.heartbeat.interval.ms" => {
                    self.group.consumer_min_heartbeat_interval_ms =
                        int(1, i64::from(i32::MAX))? as i32
                }
                "group.consumer.max.heartbeat.interval.ms" => {
                    self.group.consumer_max_heartbeat_interval_ms =
                        int(1, i64::from(i32::MAX))? as i32
                }
                "group.consumer.max.size" => {
                    self.group.consumer_max_size = int(1, i64::from(i32::MAX))? as usize
                }
                "group.consumer.assignors" => {
                    let mut names = Vec::new();
                    for a in v.split(',').map(str::trim).filter(|a| !a.is_empty()) {
                        // Kafka takes class names; its two built-in assignors are named
                        // "uniform" and "range" on the wire.
                        let name = match a {
                            "uniform" | "org.apache.kafka.coordinator.group.assignor.UniformAssignor" => "uniform",
                            "range" | "org.apache.kafka.coordinator.group.assignor.RangeAssignor" => "range",
                            other => bail!("{key}={v}: unknown assignor {other:?} (ferrolog has uniform and range)"),
                        };
                        names.push(name.to_string());
                    }
                    if names.is_empty() {
                        bail!("{key} is empty");
                    }
                    self.group.consumer_assignors = names;
                }
                "group.consumer.migration.policy" => match v.to_ascii_lowercase().as_str() {
                    "disabled" => {}
                    "upgrade" | "downgrade" | "bidirectional" => tracing::warn!(
                        key = %key,
                        value = v,
                        "ferrolog does not migrate live groups between the classic and consumer protocols; it behaves as disabled"
                    ),
                    _ => bail!("{key}={v}: expected disabled, upgrade, downgrade or bidirectional"),
                },
                "controller.quorum.voters" => self.voters = parse_voters(v, key)?,
                "replica.lag.time.max.ms" => {
                    self.replica_lag_time_max_ms = int(1, i64::from(i32::MAX))? as u64;
                }
                "broker.session.timeout.ms" => {
                    self.broker_session_timeout_ms = int(1, i64::from(i32::MAX))?;
                }
                "auto.leader.rebalance.enable" => self.auto_leader_rebalance = boolean()?,
                "leader.imbalance.check.interval.seconds" => {
                    self.leader_imbalance_check_interval_s = int(1, i64::from(i32::MAX))? as u64;
                }
                k if IGNORED_BROKER_KEYS.contains(&k) => {
                    tracing::warn!(
                        key = k,
                        value = v,
                        "config has no effect in ferrolog; ignored"
                    );
                }
                k => {
                    let def = TOPIC_CONFIGS.iter().find(|d| d.broker_key == Some(k));
                    match def {
                        Some(d) => self.set_topic_default(d.name, v, key)?,
                        None => bail!("unknown config key {k:?} (ferrolog accepts Apache Kafka's broker config names)"),
                    }
                }
            }
        }
        if retention.0 > 0 {
            self.set_topic_default("retention.ms", &retention.1.to_string(), "log.retention.*")?;
        }
        if roll.0 > 0 {
            self.set_topic_default("segment.ms", &roll.1.to_string(), "log.roll.*")?;
        }
        if !self.voters.is_empty() && !self.voters.contains_key(&self.node_id) {
            bail!(
                "node.id={} is not one of controller.quorum.voters ({}): every node is a voter",
                self.node_id,
                self.voters
                    .keys()
                    .map(|k| k.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        self.group.check()
    }

    fn set_topic_default(
        &mut self,
        name: &'static str,
        value: &str,
        key: &str,
    ) -> anyhow::Result<()> {
        let def = topic_config_def(name).expect("known topic config");
        validate_value(def, value).map_err(|e| anyhow::anyhow!("{key}: {e}"))?;
        self.topic_defaults.insert(def.name, value.to_string());
        Ok(())
    }
}

/// Keeps `value` unless a key of higher precedence already set one; among equals, the last wins.
fn prefer(slot: &mut (u8, i64), precedence: u8, value: i64) {
    if precedence >= slot.0 {
        *slot = (precedence, value);
    }
}

/// The effective settings of one topic: its own overrides over the broker defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct TopicSettings {
    pub retention_ms: i64,
    pub retention_bytes: i64,
    pub segment_bytes: u64,
    pub segment_ms: i64,
    pub index_interval_bytes: u32,
    pub max_message_bytes: usize,
    pub log_append_time: bool,
    pub timestamp_before_max_ms: i64,
    pub timestamp_after_max_ms: i64,
    pub min_insync_replicas: i32,
    /// `cleanup.policy` includes `compact`: every record needs a key.
    pub compacted: bool,
    /// `cleanup.policy` includes `delete`: `retention.ms`/`retention.bytes` apply. A
    /// compact-only topic (such as `__consumer_offsets`) is never trimmed by time or size.
    pub deletes: bool,
}

impl TopicSettings {
    pub fn resolve(
        defaults: &BTreeMap<&'static str, String>,
        overrides: &BTreeMap<String, String>,
    ) -> TopicSettings {
        let get = |name: &str| -> &str {
            overrides
                .get(name)
                .map(String::as_str)
                .or_else(|| defaults.get(name).map(String::as_str))
                .expect("every topic config has a default")
        };
        let num = |name: &str| -> i64 { get(name).trim().parse().expect("validated config") };
        TopicSettings {
            retention_ms: num("retention.ms"),
            retention_bytes: num("retention.bytes"),
            segment_bytes: num("segment.bytes") as u64,
            segment_ms: num("segment.ms"),
            index_interval_bytes: num("index.interval.bytes") as u32,
            max_message_bytes: num("max.message.bytes") as usize,
            log_append_time: get("message.timestamp.type") == "LogAppendTime",
            timestamp_before_max_ms: num("message.timestamp.before.max.ms"),
            timestamp_after_max_ms: num("message.timestamp.after.max.ms"),
            min_insync_replicas: num("min.insync.replicas") as i32,
            compacted: get("cleanup.policy")
                .split(',')
                .any(|p| p.trim() == "compact"),
            deletes: get("cleanup.policy")
                .split(',')
                .any(|p| p.trim() == "delete"),
        }
    }

    pub fn log_config(&self) -> ferrolog_io::LogConfig {
        ferrolog_io::LogConfig {
            segment_bytes: self.segment_bytes,
            segment_ms: self.segment_ms,
            index_interval_bytes: self.index_interval_bytes,
            ..ferrolog_io::LogConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_and_overrides() {
        let props = parse_properties("# c\nlisteners=PLAINTEXT://127.0.0.1:19092\nlog.dirs = /tmp/x,/tmp/y\nlog.segment.bytes=\\\n  1048576\nnum.io.threads=8\n").unwrap();
        let mut c = BrokerConfig::default();
        c.apply(&props).unwrap();
        assert_eq!(c.listen_addr.port(), 19092);
        assert_eq!(c.advertised_port, 19092);
        assert_eq!(c.log_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.metadata_dir(), std::path::Path::new("/tmp/x"));
        c.apply(&[("metadata.log.dir".into(), "/tmp/m".into())])
            .unwrap();
        assert_eq!(c.metadata_dir(), std::path::Path::new("/tmp/m"));
        assert_eq!(c.topic_defaults["segment.bytes"], "1048576");
        let err = c.apply(&[("no.such.key".into(), "1".into())]).unwrap_err();
        assert!(err.to_string().contains("no.such.key"));
        assert!(c
            .apply(&[("log.segment.bytes".into(), "5".into())])
            .is_err());
        c.apply(&[
            ("log.retention.ms".into(), "5000".into()),
            ("log.retention.hours".into(), "-1".into()),
        ])
        .unwrap();
        assert_eq!(
            c.topic_defaults["retention.ms"], "5000",
            "ms wins over hours"
        );
        c.apply(&[("log.retention.hours".into(), "-1".into())])
            .unwrap();
        assert_eq!(c.topic_defaults["retention.ms"], "-1");
        assert!(c
            .apply(&[("num.partitions".into(), "zero".into())])
            .is_err());
    }

    #[test]
    fn controller_quorum_voters() {
        let mut c = BrokerConfig::default();
        let set = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
        c.apply(&[
            ("node.id".into(), "2".into()),
            (
                "controller.quorum.voters".into(),
                "1@127.0.0.1:9093, 2@127.0.0.1:9193,3@127.0.0.1:9293".into(),
            ),
        ])
        .unwrap();
        assert_eq!(c.voters.len(), 3);
        assert_eq!(c.voters[&2], "127.0.0.1:9193".parse().unwrap());
        let mut other = c.clone();
        let err = other.apply(&set("node.id", "4")).unwrap_err();
        assert!(err
            .to_string()
            .contains("not one of controller.quorum.voters"));
        for bad in [
            "1@localhost:9093",
            "x@127.0.0.1:1",
            "1@127.0.0.1:1,1@127.0.0.1:2",
            "1127.0.0.1:2",
        ] {
            assert!(
                BrokerConfig::default()
                    .apply(&set("controller.quorum.voters", bad))
                    .is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn topic_settings_resolve() {
        let c = BrokerConfig::default();
        let mut o = BTreeMap::new();
        o.insert("retention.ms".to_string(), "1000".to_string());
        let s = TopicSettings::resolve(&c.topic_defaults, &o);
        assert_eq!(s.retention_ms, 1000);
        assert_eq!(s.segment_bytes, 1 << 30);
        assert_eq!(s.max_message_bytes, 1_048_588);
        let d = topic_config_def("cleanup.policy").unwrap();
        assert!(validate_value(d, "compact,delete").is_ok());
        assert!(validate_value(d, "nope").is_err());
    }
}
