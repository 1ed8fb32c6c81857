//! Blocking Kafka connections over TCP, built on kafka-protocol's message types.
//!
//! One `Conn` is one TCP connection to one broker. It negotiates API versions once
//! (ApiVersions) and then either makes synchronous calls (`call`) or hands out encoded
//! frames and a reader half for pipelining (the producer keeps several requests in flight
//! on one connection, as Kafka's `max.in.flight.requests.per.connection` does).
//!
//! Both brokers see identical traffic: the versions are the highest both sides support,
//! capped by `VERSION_CAPS` (Produce and Fetch stop at 12, the last versions that name
//! topics rather than carry topic ids; the transaction APIs at protocol v1's).

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, CreateTopicsRequest, CreateTopicsResponse,
    ListOffsetsRequest, ListOffsetsResponse, MetadataRequest, MetadataResponse, RequestHeader,
    TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Message, Request, StrBytes};

/// Largest response frame accepted, checked before allocating (a Fetch response is
/// bounded by the request's max_bytes, 64 MiB at most here).
pub const RESPONSE_FRAME_BYTES_MAX: usize = 128 << 20;

/// Highest version the bench uses for each API, whatever both sides could do.
const VERSION_CAPS: &[(ApiKey, i16)] = &[
    (ApiKey::Produce, 12),
    (ApiKey::Fetch, 12),
    (ApiKey::Metadata, 12),
    (ApiKey::ListOffsets, 9),
    (ApiKey::CreateTopics, 7),
    (ApiKey::CreatePartitions, 3),
    // Transaction protocol v1 on both brokers (the client's forms before KIP-890 part 2).
    (ApiKey::AddPartitionsToTxn, 3),
    (ApiKey::EndTxn, 4),
];

/// Partitions created per request. Kafka's controller refuses an operation of more than
/// `max.records.per.user.op` (10,000) metadata records, one per partition plus the topic,
/// so a larger topic is created in steps (CreateTopics, then CreatePartitions).
pub const PARTITIONS_PER_REQUEST_MAX: i32 = 5_000;

pub const CLIENT_ID: &str = "ferrolog-bench";

/// Kafka error codes the bench names in its output.
pub fn error_name(code: i16) -> &'static str {
    match code {
        0 => "NONE",
        1 => "OFFSET_OUT_OF_RANGE",
        2 => "CORRUPT_MESSAGE",
        3 => "UNKNOWN_TOPIC_OR_PARTITION",
        5 => "LEADER_NOT_AVAILABLE",
        6 => "NOT_LEADER_OR_FOLLOWER",
        7 => "REQUEST_TIMED_OUT",
        10 => "MESSAGE_TOO_LARGE",
        19 => "NOT_ENOUGH_REPLICAS",
        20 => "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
        35 => "UNSUPPORTED_VERSION",
        36 => "TOPIC_ALREADY_EXISTS",
        56 => "KAFKA_STORAGE_ERROR",
        _ => "OTHER",
    }
}

/// How long a client waits for a new topic's partitions to become usable.
pub const LEADER_WAIT: Duration = Duration::from_secs(60);

/// An error a client retries (the partition is not ready yet).
#[derive(Debug)]
pub struct Retriable(pub String);

impl std::fmt::Display for Retriable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Retriable {}

pub struct Conn {
    pub stream: TcpStream,
    pub addr: SocketAddr,
    correlation_id: i32,
    /// API key -> version this connection uses.
    versions: HashMap<i16, i16>,
}

impl Conn {
    pub fn connect(bootstrap: &str, timeout: Duration) -> Result<Conn> {
        // A bootstrap list (`host:port,host:port`): the first that answers, like Kafka clients.
        let mut failure = None;
        for one in bootstrap.split(',') {
            match Self::connect_one(one.trim(), timeout) {
                Ok(conn) => return Ok(conn),
                Err(e) => failure = Some(e),
            }
        }
        Err(failure.unwrap_or_else(|| anyhow::anyhow!("empty bootstrap list")))
    }

    fn connect_one(bootstrap: &str, timeout: Duration) -> Result<Conn> {
        let addr = bootstrap
            .to_socket_addrs()
            .with_context(|| format!("resolving {bootstrap}"))?
            .next()
            .with_context(|| format!("{bootstrap} resolves to nothing"))?;
        let stream = TcpStream::connect_timeout(&addr, timeout)
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        let mut conn = Conn {
            stream,
            addr,
            correlation_id: 0,
            versions: HashMap::new(),
        };
        conn.negotiate()?;
        Ok(conn)
    }

    fn negotiate(&mut self) -> Result<()> {
        let req = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str(CLIENT_ID))
            .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
        // ApiVersions v3 is what current clients send first; a broker that does not know it
        // answers with v0 framing and UNSUPPORTED_VERSION, which a real client then retries.
        self.versions.insert(ApiKey::ApiVersions as i16, 3);
        let resp: ApiVersionsResponse = self.call(&req)?;
        ensure!(
            resp.error_code == 0,
            "ApiVersions failed: error {}",
            resp.error_code
        );
        for k in &resp.api_keys {
            let Ok(key) = ApiKey::try_from(k.api_key) else {
                continue;
            };
            let ours = key_range(key);
            let Some((ours_min, ours_max)) = ours else {
                continue;
            };
            let cap = VERSION_CAPS
                .iter()
                .find(|(c, _)| *c == key)
                .map(|(_, v)| *v)
                .unwrap_or(ours_max);
            let v = k.max_version.min(ours_max).min(cap);
            if v >= k.min_version && v >= ours_min {
                self.versions.insert(k.api_key, v);
            }
        }
        Ok(())
    }

    pub fn version(&self, key: ApiKey) -> Result<i16> {
        self.versions
            .get(&(key as i16))
            .copied()
            .with_context(|| format!("broker {} and bench share no version of {key:?}", self.addr))
    }

    pub fn versions_used(&self) -> Vec<(String, i16)> {
        let mut v: Vec<(String, i16)> = [
            ApiKey::Produce,
            ApiKey::Fetch,
            ApiKey::Metadata,
            ApiKey::ListOffsets,
            ApiKey::CreateTopics,
        ]
        .iter()
        .filter_map(|k| {
            self.versions
                .get(&(*k as i16))
                .map(|v| (format!("{k:?}"), *v))
        })
        .collect();
        v.sort();
        v
    }

    /// Encodes `req` as one length-prefixed frame; returns the frame and its correlation id.
    pub fn encode<R: Request>(&mut self, req: &R) -> Result<(i32, i16, BytesMut)> {
        let key =
            ApiKey::try_from(R::KEY).map_err(|_| anyhow::anyhow!("unknown api key {}", R::KEY))?;
        let version = self.version(key)?;
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(StrBytes::from_static_str(CLIENT_ID)));
        let header_version = R::header_version(version);
        let size = header.compute_size(header_version)? + req.compute_size(version)?;
        let mut buf = BytesMut::with_capacity(4 + size);
        buf.put_i32(size as i32);
        header.encode(&mut buf, header_version)?;
        req.encode(&mut buf, version)?;
        Ok((self.correlation_id, version, buf))
    }

    /// One request, one response, nothing else in flight.
    pub fn call<R: Request>(&mut self, req: &R) -> Result<R::Response> {
        let (correlation_id, version, frame) = self.encode(req)?;
        self.stream.write_all(&frame)?;
        let body = read_frame(&mut self.stream)?;
        decode_response::<R>(body, correlation_id, version)
    }

    pub fn metadata(&mut self, topics: Option<&[String]>) -> Result<MetadataResponse> {
        let req = MetadataRequest::default()
            .with_allow_auto_topic_creation(false)
            .with_topics(topics.map(|ts| {
                ts.iter()
                    .map(|t| {
                        kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                            .with_name(Some(TopicName(StrBytes::from_string(t.clone()))))
                    })
                    .collect()
            }));
        self.call(&req)
    }

    /// Partitions of `topic` and their count, or an error if the topic is unknown.
    pub fn partitions(&mut self, topic: &str) -> Result<Vec<i32>> {
        let resp = self.metadata(Some(&[topic.to_string()]))?;
        let t = only_topic(&resp, topic)?;
        let mut ps: Vec<i32> = t.partitions.iter().map(|p| p.partition_index).collect();
        ps.sort();
        ensure!(!ps.is_empty(), "topic {topic} has no partitions");
        Ok(ps)
    }

    /// The partitions of `topic` grouped by the address (`host:port`) of their leader; an
    /// error while some partition has no leader.
    pub fn partition_leaders(&mut self, topic: &str) -> Result<BTreeMap<String, Vec<i32>>> {
        let resp = self.metadata(Some(&[topic.to_string()]))?;
        let brokers: HashMap<i32, String> = resp
            .brokers
            .iter()
            .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
            .collect();
        let t = only_topic(&resp, topic)?;
        let mut leaders: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for p in &t.partitions {
            let addr = brokers.get(&p.leader_id.0).with_context(|| {
                format!(
                    "{topic}-{}: no leader (error {})",
                    p.partition_index, p.error_code
                )
            })?;
            leaders
                .entry(addr.clone())
                .or_default()
                .push(p.partition_index);
        }
        for ps in leaders.values_mut() {
            ps.sort();
        }
        Ok(leaders)
    }

    /// Creates `topic`; an existing topic with the same partition count is fine.
    pub fn create_topic(
        &mut self,
        topic: &str,
        partitions: i32,
        replication_factor: i16,
        configs: &[(String, String)],
        timeout_ms: i32,
    ) -> Result<()> {
        use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
        use kafka_protocol::messages::{CreatePartitionsRequest, CreatePartitionsResponse};
        let first = partitions.min(PARTITIONS_PER_REQUEST_MAX);
        self.create_topic_once(topic, first, replication_factor, configs, timeout_ms)?;
        let mut count =
            self.wait_partitions(topic, first, Duration::from_millis(timeout_ms as u64))?;
        while count < partitions {
            let next = (count + PARTITIONS_PER_REQUEST_MAX).min(partitions);
            let req = CreatePartitionsRequest::default()
                .with_timeout_ms(timeout_ms)
                .with_topics(vec![CreatePartitionsTopic::default()
                    .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                    .with_count(next)
                    .with_assignments(None)]);
            let resp: CreatePartitionsResponse = self.call(&req)?;
            for r in &resp.results {
                ensure!(
                    r.error_code == 0,
                    "CreatePartitions {topic} to {next}: error {} {}",
                    r.error_code,
                    r.error_message.as_ref().map(|m| m.as_str()).unwrap_or("")
                );
            }
            count = self.wait_partitions(topic, next, Duration::from_millis(timeout_ms as u64))?;
        }
        Ok(())
    }

    /// Waits until metadata shows `topic` with at least `count` partitions (a broker may
    /// answer CreateTopics before its metadata cache has the topic).
    pub fn wait_partitions(&mut self, topic: &str, count: i32, timeout: Duration) -> Result<i32> {
        let t = std::time::Instant::now();
        loop {
            match self.partitions(topic) {
                Ok(ps) if ps.len() as i32 >= count => return Ok(ps.len() as i32),
                Ok(ps) if t.elapsed() > timeout => bail!(
                    "topic {topic} has {} partitions after {timeout:?}, expected {count}",
                    ps.len()
                ),
                Err(e) if t.elapsed() > timeout => return Err(e),
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn create_topic_once(
        &mut self,
        topic: &str,
        partitions: i32,
        replication_factor: i16,
        configs: &[(String, String)],
        timeout_ms: i32,
    ) -> Result<()> {
        use kafka_protocol::messages::create_topics_request::{
            CreatableTopic, CreatableTopicConfig,
        };
        let t = CreatableTopic::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_num_partitions(partitions)
            .with_replication_factor(replication_factor)
            .with_configs(
                configs
                    .iter()
                    .map(|(k, v)| {
                        CreatableTopicConfig::default()
                            .with_name(StrBytes::from_string(k.clone()))
                            .with_value(Some(StrBytes::from_string(v.clone())))
                    })
                    .collect(),
            );
        let req = CreateTopicsRequest::default()
            .with_topics(vec![t])
            .with_timeout_ms(timeout_ms);
        let resp: CreateTopicsResponse = self.call(&req)?;
        for r in &resp.topics {
            match r.error_code {
                0 => {}
                36 => {}
                code => bail!(
                    "CreateTopics {topic}: error {code} ({}) {}",
                    error_name(code),
                    r.error_message.as_ref().map(|m| m.as_str()).unwrap_or("")
                ),
            }
        }
        Ok(())
    }

    /// Offsets of `partitions` at `timestamp` (-2 earliest, -1 latest). Retries for a while
    /// on the errors a new topic gives before its partitions are ready on the broker.
    pub fn list_offsets(
        &mut self,
        topic: &str,
        partitions: &[i32],
        timestamp: i64,
    ) -> Result<HashMap<i32, i64>> {
        let t = std::time::Instant::now();
        loop {
            match self.list_offsets_once(topic, partitions, timestamp) {
                Err(e) if t.elapsed() < LEADER_WAIT && e.downcast_ref::<Retriable>().is_some() => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                r => return r,
            }
        }
    }

    fn list_offsets_once(
        &mut self,
        topic: &str,
        partitions: &[i32],
        timestamp: i64,
    ) -> Result<HashMap<i32, i64>> {
        use kafka_protocol::messages::list_offsets_request::{
            ListOffsetsPartition, ListOffsetsTopic,
        };
        let t = ListOffsetsTopic::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(
                partitions
                    .iter()
                    .map(|p| {
                        ListOffsetsPartition::default()
                            .with_partition_index(*p)
                            .with_timestamp(timestamp)
                            .with_current_leader_epoch(-1)
                    })
                    .collect(),
            );
        let req = ListOffsetsRequest::default()
            .with_replica_id(kafka_protocol::messages::BrokerId(-1))
            .with_topics(vec![t]);
        let resp: ListOffsetsResponse = self.call(&req)?;
        let mut out = HashMap::new();
        for t in &resp.topics {
            for p in &t.partitions {
                if matches!(p.error_code, 3 | 5 | 6) {
                    return Err(anyhow::Error::new(Retriable(format!(
                        "ListOffsets {topic}-{}: error {} ({})",
                        p.partition_index,
                        p.error_code,
                        error_name(p.error_code)
                    ))));
                }
                ensure!(
                    p.error_code == 0,
                    "ListOffsets {topic}-{}: error {} ({})",
                    p.partition_index,
                    p.error_code,
                    error_name(p.error_code)
                );
                out.insert(p.partition_index, p.offset);
            }
        }
        ensure!(
            out.len() == partitions.len(),
            "ListOffsets answered {} of {} partitions",
            out.len(),
            partitions.len()
        );
        Ok(out)
    }
}

/// Reads one length-prefixed frame and returns its body (response header + message).
/// The one topic a Metadata request for `topic` asked about, or its error.
fn only_topic<'a>(
    resp: &'a MetadataResponse,
    topic: &str,
) -> Result<&'a kafka_protocol::messages::metadata_response::MetadataResponseTopic> {
    let t = resp
        .topics
        .first()
        .context("metadata response without topics")?;
    ensure!(
        t.error_code == 0,
        "metadata for {topic}: error {} ({})",
        t.error_code,
        error_name(t.error_code)
    );
    Ok(t)
}

pub fn read_frame(stream: &mut impl Read) -> Result<Bytes> {
    let mut len = [0u8; 4];
    stream
        .read_exact(&mut len)
        .context("reading frame length")?;
    let len = i32::from_be_bytes(len);
    ensure!(
        len >= 4 && (len as usize) <= RESPONSE_FRAME_BYTES_MAX,
        "bad response frame length {len}"
    );
    let mut body = vec![0u8; len as usize];
    stream.read_exact(&mut body).context("reading frame body")?;
    Ok(Bytes::from(body))
}

pub fn decode_response<R: Request>(
    mut body: Bytes,
    correlation_id: i32,
    version: i16,
) -> Result<R::Response> {
    let header_version = <R::Response as HeaderVersion>::header_version(version);
    ensure!(body.remaining() >= 4, "response shorter than its header");
    let got = body.get_i32();
    ensure!(
        got == correlation_id,
        "response correlation id {got}, expected {correlation_id}"
    );
    if header_version >= 1 {
        // Flexible response header: tagged fields, almost always none.
        let n = read_unsigned_varint(&mut body)?;
        for _ in 0..n {
            let _tag = read_unsigned_varint(&mut body)?;
            let size = read_unsigned_varint(&mut body)? as usize;
            ensure!(
                body.remaining() >= size,
                "truncated tagged field in response header"
            );
            body.advance(size);
        }
    }
    <R::Response as Decodable>::decode(&mut body, version)
}

fn read_unsigned_varint(buf: &mut Bytes) -> Result<u32> {
    let mut value = 0u32;
    for shift in (0..35).step_by(7) {
        ensure!(buf.has_remaining(), "truncated varint");
        let b = buf.get_u8();
        value |= ((b & 0x7f) as u32) << shift;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    bail!("varint longer than 5 bytes")
}

/// The bench's own version range for each API it speaks (kafka-protocol's).
fn key_range(key: ApiKey) -> Option<(i16, i16)> {
    use kafka_protocol::messages::*;
    let r = match key {
        ApiKey::Produce => ProduceRequest::VERSIONS,
        ApiKey::Fetch => FetchRequest::VERSIONS,
        ApiKey::Metadata => MetadataRequest::VERSIONS,
        ApiKey::ListOffsets => ListOffsetsRequest::VERSIONS,
        ApiKey::CreateTopics => CreateTopicsRequest::VERSIONS,
        ApiKey::CreatePartitions => CreatePartitionsRequest::VERSIONS,
        ApiKey::ApiVersions => ApiVersionsRequest::VERSIONS,
        ApiKey::FindCoordinator => FindCoordinatorRequest::VERSIONS,
        ApiKey::InitProducerId => InitProducerIdRequest::VERSIONS,
        ApiKey::AddPartitionsToTxn => AddPartitionsToTxnRequest::VERSIONS,
        ApiKey::EndTxn => EndTxnRequest::VERSIONS,
        _ => return None,
    };
    Some((r.min, r.max))
}
