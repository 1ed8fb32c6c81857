//! Metadata (API 3): the live brokers of the cluster, the controller, and topics with each
//! partition's leader and replicas, creating missing topics (through the controller) when
//! `auto.create.topics.enable` and the client allow it.

use std::rc::Rc;
use std::time::Instant;

use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::errors::BrokerError;
use crate::group::is_internal_topic;
use crate::kafka::handlers::admin::{self, TopicSpec};
use crate::kafka::RequestContext;
use crate::metadata::{validate_topic_name, TopicMeta};

pub async fn handle(ctx: Rc<RequestContext>, req: MetadataRequest) -> MetadataResponse {
    let config = ctx.shard.config.clone();
    let mut image = ctx.shard.image();
    let wanted: Option<Vec<(Option<String>, uuid::Uuid)>> = req.topics.map(|ts| {
        ts.into_iter()
            .map(|t| (t.name.map(|n| n.0.to_string()), t.topic_id))
            .collect()
    });
    // Auto-create what is missing, in one controller call.
    if let Some(wanted) = &wanted {
        let allow = req.allow_auto_topic_creation || ctx.version < 4;
        let missing: Vec<TopicSpec> = wanted
            .iter()
            .filter_map(|(name, _)| name.clone())
            .filter(|n| image.topic(n).is_none() && validate_topic_name(n).is_ok())
            .map(|name| TopicSpec {
                name,
                partitions: -1,
                replication_factor: -1,
                configs: Default::default(),
                assignment: None,
            })
            .collect();
        if allow && config.auto_create_topics && !missing.is_empty() {
            for (r, spec) in
                admin::create_topics_anywhere(&ctx.shard, missing.clone(), false, Instant::now())
                    .await
                    .iter()
                    .zip(&missing)
            {
                if let Err(e) = r {
                    if e.code() != ResponseError::TopicAlreadyExists.code() {
                        tracing::warn!(topic = %spec.name, error = %e, "auto-creation failed");
                    }
                }
            }
            image = ctx.shard.image();
        }
    }
    let describe = |t: &TopicMeta| -> MetadataResponseTopic {
        let partitions = (0..t.partitions)
            .map(|p| {
                let replicas = t.replicas.get(p as usize).cloned().unwrap_or_default();
                let live = |id: &i32| image.brokers.get(id).is_some_and(|b| !b.fenced);
                let leadership = t.leadership(p, &image);
                let partition = MetadataResponsePartition::default()
                    .with_partition_index(p)
                    .with_leader_id(BrokerId(leadership.as_ref().map_or(-1, |l| l.leader)))
                    .with_leader_epoch(leadership.as_ref().map_or(-1, |l| l.epoch))
                    .with_replica_nodes(replicas.iter().map(|r| BrokerId(*r)).collect())
                    .with_isr_nodes(
                        leadership
                            .iter()
                            .flat_map(|l| l.isr.iter())
                            .map(|r| BrokerId(*r))
                            .collect(),
                    )
                    .with_offline_replicas(
                        replicas
                            .iter()
                            .filter(|r| !live(r))
                            .map(|r| BrokerId(*r))
                            .collect(),
                    );
                match leadership {
                    Some(_) => partition,
                    None => partition.with_error_code(BrokerError::LeaderNotAvailable.code()),
                }
            })
            .collect();
        MetadataResponseTopic::default()
            .with_name(Some(TopicName(StrBytes::from_string(t.name.clone()))))
            .with_topic_id(t.id)
            .with_is_internal(is_internal_topic(&t.name))
            .with_topic_authorized_operations(i32::MIN)
            .with_partitions(partitions)
    };
    let topics: Vec<MetadataResponseTopic> = match wanted {
        None => image.topics.values().map(describe).collect(),
        Some(wanted) => wanted
            .into_iter()
            .map(|(name, id)| {
                let found = match &name {
                    Some(n) => image.topic(n),
                    None => image.topic_by_id(&id),
                };
                match found {
                    Some(t) => describe(t),
                    None => {
                        let error = match &name {
                            Some(n) => match validate_topic_name(n) {
                                Err(m) => BrokerError::InvalidTopic(m),
                                Ok(()) => BrokerError::UnknownTopicOrPartition,
                            },
                            None => BrokerError::UnknownTopicId,
                        };
                        MetadataResponseTopic::default()
                            .with_name(name.map(|n| TopicName(StrBytes::from_string(n))))
                            .with_topic_id(id)
                            .with_error_code(error.code())
                    }
                }
            })
            .collect(),
    };
    let brokers = image
        .brokers
        .iter()
        .filter(|(_, b)| !b.fenced)
        .map(|(id, b)| {
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(*id))
                .with_host(StrBytes::from_string(b.host.clone()))
                .with_port(i32::from(b.port))
        })
        .collect();
    let controller = ctx.shard.controller_for_clients(&image);
    MetadataResponse::default()
        .with_brokers(brokers)
        .with_cluster_id(Some(StrBytes::from_string(image.cluster_id.clone())))
        .with_controller_id(BrokerId(controller))
        .with_cluster_authorized_operations(i32::MIN)
        .with_topics(topics)
}
