//! FindCoordinator (API 10): a group's coordinator is the node leading its
//! `__consumer_offsets` partition. The first group lookup creates the topic (through the
//! controller) with `offsets.topic.num.partitions` partitions, compacted, replicated
//! `offsets.topic.replication.factor` times (capped at the cluster's size), as Kafka does.
//! v4+ looks up many keys at once.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Instant;

use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::errors::BrokerError;
use crate::group::{partition_for, OFFSETS_TOPIC};
use crate::kafka::handlers::admin::{self, TopicSpec};
use crate::kafka::RequestContext;

const KEY_TYPE_GROUP: i8 = 0;
const KEY_TYPE_TRANSACTION: i8 = 1;

pub async fn handle(
    ctx: Rc<RequestContext>,
    req: FindCoordinatorRequest,
) -> FindCoordinatorResponse {
    let keys: Vec<StrBytes> = if ctx.version >= 4 {
        req.coordinator_keys
    } else {
        vec![req.key]
    };
    let found = match req.key_type {
        KEY_TYPE_GROUP => ensure_offsets_topic(&ctx).await,
        KEY_TYPE_TRANSACTION => Err(BrokerError::CoordinatorNotAvailable(
            "ferrolog has no transaction coordinator yet".into(),
        )),
        other => Err(BrokerError::InvalidRequest(format!(
            "Unsupported key type {other}"
        ))),
    };
    // Each group's coordinator is the leader of its `__consumer_offsets` partition.
    let image = ctx.shard.image();
    let locate = |key: &StrBytes| -> Result<(i32, StrBytes, i32), BrokerError> {
        found.clone()?;
        let topic = image
            .topic(OFFSETS_TOPIC)
            .ok_or_else(|| BrokerError::CoordinatorNotAvailable("no offsets topic".into()))?;
        let partition = partition_for(key.as_str(), topic.partitions);
        let leader = topic.leader(partition, &image).ok_or_else(|| {
            BrokerError::CoordinatorNotAvailable(format!(
                "the leader of {OFFSETS_TOPIC}-{partition} is not available"
            ))
        })?;
        let broker = &image.brokers[&leader];
        Ok((
            leader,
            StrBytes::from_string(broker.host.clone()),
            i32::from(broker.port),
        ))
    };
    let answer = |key: &StrBytes| match locate(key) {
        Ok((node, host, port)) => (0, None, BrokerId(node), host, port),
        Err(e) => (
            e.code(),
            Some(StrBytes::from_string(e.to_string())),
            BrokerId(-1),
            StrBytes::default(),
            -1,
        ),
    };
    if ctx.version >= 4 {
        let coordinators = keys
            .into_iter()
            .map(|key| {
                let (error_code, message, node, host, port) = answer(&key);
                Coordinator::default()
                    .with_key(key)
                    .with_node_id(node)
                    .with_host(host)
                    .with_port(port)
                    .with_error_code(error_code)
                    .with_error_message(message)
            })
            .collect();
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    let key = keys.into_iter().next().unwrap_or_default();
    let (error_code, message, node, host, port) = answer(&key);
    FindCoordinatorResponse::default()
        .with_error_code(error_code)
        .with_error_message(message)
        .with_node_id(node)
        .with_host(host)
        .with_port(port)
}

/// Creates `__consumer_offsets` if it does not exist yet.
async fn ensure_offsets_topic(ctx: &RequestContext) -> Result<(), BrokerError> {
    if ctx.shard.image().topic(OFFSETS_TOPIC).is_some() {
        return Ok(());
    }
    let group = &ctx.shard.config.group;
    let configs = BTreeMap::from([
        ("cleanup.policy".to_string(), "compact".to_string()),
        (
            "segment.bytes".to_string(),
            group.offsets_topic_segment_bytes.to_string(),
        ),
        ("compression.type".to_string(), "producer".to_string()),
    ]);
    // Kafka's default of 3 replicas, capped at the cluster's size so a single node (or a
    // two-node cluster) works as it is. With fewer live brokers than that the creation fails
    // (INVALID_REPLICATION_FACTOR) and clients retry, as in Kafka.
    let cluster_size = ctx.shard.config.voters.len().max(1);
    let replication_factor = group
        .offsets_topic_replication_factor
        .min(i16::try_from(cluster_size).unwrap_or(i16::MAX));
    let spec = TopicSpec {
        name: OFFSETS_TOPIC.to_string(),
        partitions: group.offsets_topic_partitions,
        replication_factor,
        assignment: None,
        configs,
    };
    match admin::create_topics_anywhere(&ctx.shard, vec![spec], false, Instant::now())
        .await
        .remove(0)
    {
        Ok(_) => Ok(()),
        Err(e) if e.code() == ResponseError::TopicAlreadyExists.code() => Ok(()),
        Err(e) => {
            tracing::warn!(error = %e, "cannot create {OFFSETS_TOPIC}");
            Err(BrokerError::CoordinatorNotAvailable(e.to_string()))
        }
    }
}
