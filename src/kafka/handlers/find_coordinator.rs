//! FindCoordinator (API 10): this node coordinates every group (one-node cluster). The first
//! group lookup creates `__consumer_offsets` with `offsets.topic.num.partitions` partitions,
//! compacted, as Kafka does. v4+ looks up many keys at once.

use std::collections::BTreeMap;
use std::rc::Rc;

use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;

use crate::errors::BrokerError;
use crate::group::OFFSETS_TOPIC;
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
    let config = &ctx.shard.config;
    let node = BrokerId(config.node_id);
    let host = StrBytes::from_string(config.advertised_host.clone());
    let port = i32::from(config.advertised_port);
    let (error_code, message) = match &found {
        Ok(()) => (0, None),
        Err(e) => (e.code(), Some(StrBytes::from_string(e.to_string()))),
    };
    let (node, host, port) = if found.is_ok() {
        (node, host, port)
    } else {
        (BrokerId(-1), StrBytes::default(), -1)
    };
    if ctx.version >= 4 {
        let coordinators = keys
            .into_iter()
            .map(|key| {
                Coordinator::default()
                    .with_key(key)
                    .with_node_id(node)
                    .with_host(host.clone())
                    .with_port(port)
                    .with_error_code(error_code)
                    .with_error_message(message.clone())
            })
            .collect();
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
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
    let spec = TopicSpec {
        name: OFFSETS_TOPIC.to_string(),
        partitions: group.offsets_topic_partitions,
        replication_factor: -1,
        configs,
    };
    match admin::create_topics(&ctx.shard, vec![spec], false)
        .await
        .remove(0)
    {
        Ok(_) | Err(BrokerError::TopicAlreadyExists(_)) => Ok(()),
        Err(e) => {
            tracing::warn!(error = %e, "cannot create {OFFSETS_TOPIC}");
            Err(BrokerError::CoordinatorNotAvailable(e.to_string()))
        }
    }
}
