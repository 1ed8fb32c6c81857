//! FindCoordinator (API 10): a group's coordinator is the node leading its
//! `__consumer_offsets` partition, a transactional id's the node leading its
//! `__transaction_state` partition. The first lookup of either kind creates its topic
//! (through the controller), compacted, with `offsets.topic.*` or `transaction.state.log.*`
//! partitions and replication factor (capped at the cluster's size), as Kafka does. v4+
//! looks up many keys at once.

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
use crate::txn::TRANSACTION_TOPIC;

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
    let (found, internal) = match req.key_type {
        KEY_TYPE_GROUP => (ensure_topic(&ctx, offsets_topic(&ctx)).await, OFFSETS_TOPIC),
        KEY_TYPE_TRANSACTION => (
            ensure_topic(&ctx, transaction_topic(&ctx)).await,
            TRANSACTION_TOPIC,
        ),
        other => (
            Err(BrokerError::InvalidRequest(format!(
                "Unsupported key type {other}"
            ))),
            OFFSETS_TOPIC,
        ),
    };
    // Each key's coordinator is the leader of its partition of the internal topic.
    let image = ctx.shard.image();
    let locate = |key: &StrBytes| -> Result<(i32, StrBytes, i32), BrokerError> {
        found.clone()?;
        let topic = image
            .topic(internal)
            .ok_or_else(|| BrokerError::CoordinatorNotAvailable(format!("no {internal}")))?;
        let partition = partition_for(key.as_str(), topic.partitions);
        let leader = topic.leader(partition, &image).ok_or_else(|| {
            BrokerError::CoordinatorNotAvailable(format!(
                "the leader of {internal}-{partition} is not available"
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

/// `__consumer_offsets` as Kafka creates it.
fn offsets_topic(ctx: &RequestContext) -> TopicSpec {
    let group = &ctx.shard.config.group;
    let configs = BTreeMap::from([
        ("cleanup.policy".to_string(), "compact".to_string()),
        (
            "segment.bytes".to_string(),
            group.offsets_topic_segment_bytes.to_string(),
        ),
        ("compression.type".to_string(), "producer".to_string()),
    ]);
    TopicSpec {
        name: OFFSETS_TOPIC.to_string(),
        partitions: group.offsets_topic_partitions,
        replication_factor: capped_replication(ctx, group.offsets_topic_replication_factor),
        assignment: None,
        configs,
    }
}

/// `__transaction_state` as Kafka creates it.
fn transaction_topic(ctx: &RequestContext) -> TopicSpec {
    let txn = &ctx.shard.config.txn;
    let replication_factor = capped_replication(ctx, txn.topic_replication_factor);
    let min_isr = txn.topic_min_isr.min(i32::from(replication_factor));
    let configs = BTreeMap::from([
        ("cleanup.policy".to_string(), "compact".to_string()),
        (
            "segment.bytes".to_string(),
            txn.topic_segment_bytes.to_string(),
        ),
        ("compression.type".to_string(), "uncompressed".to_string()),
        ("min.insync.replicas".to_string(), min_isr.to_string()),
        (
            "unclean.leader.election.enable".to_string(),
            "false".to_string(),
        ),
    ]);
    TopicSpec {
        name: TRANSACTION_TOPIC.to_string(),
        partitions: txn.topic_partitions,
        replication_factor,
        assignment: None,
        configs,
    }
}

/// Kafka's default of 3 replicas, capped at the cluster's size so a single node (or a
/// two-node cluster) works as it is. With fewer live brokers than that the creation fails
/// (INVALID_REPLICATION_FACTOR) and clients retry, as in Kafka.
fn capped_replication(ctx: &RequestContext, wanted: i16) -> i16 {
    let cluster_size = ctx.shard.config.voters.len().max(1);
    wanted.min(i16::try_from(cluster_size).unwrap_or(i16::MAX))
}

/// Creates an internal topic if it does not exist yet.
async fn ensure_topic(ctx: &RequestContext, spec: TopicSpec) -> Result<(), BrokerError> {
    if ctx.shard.image().topic(&spec.name).is_some() {
        return Ok(());
    }
    let name = spec.name.clone();
    match admin::create_topics_anywhere(&ctx.shard, vec![spec], false, Instant::now())
        .await
        .remove(0)
    {
        Ok(_) => Ok(()),
        Err(e) if e.code() == ResponseError::TopicAlreadyExists.code() => Ok(()),
        Err(e) => {
            tracing::warn!(error = %e, "cannot create {name}");
            Err(BrokerError::CoordinatorNotAvailable(e.to_string()))
        }
    }
}
