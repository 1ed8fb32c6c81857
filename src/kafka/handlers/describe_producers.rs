//! DescribeProducers (API 61), v0: per partition, the producers this node's replica of it
//! holds (`Partition::active_producers`), for `kafka-transactions.sh describe-producers`,
//! `abort` and `find-hanging`. As in Kafka any replica answers, a follower too, from what
//! it has applied; a partition with no replica here is NOT_LEADER_OR_FOLLOWER.
//!
//! One difference: Kafka's last timestamp of a producer is its last marker's when that is
//! newer; ferrolog gives its last batch's.

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse,
};
use kafka_protocol::messages::{DescribeProducersRequest, DescribeProducersResponse};
use kafka_protocol::protocol::StrBytes;

use crate::errors::BrokerError;
use crate::kafka::RequestContext;
use crate::metadata::validate_topic_name;
use crate::producer_state::ActiveProducer;
use crate::types::TopicPartition;

pub async fn handle(
    ctx: Rc<RequestContext>,
    req: DescribeProducersRequest,
) -> DescribeProducersResponse {
    let mut topics = Vec::with_capacity(req.topics.len());
    for topic in req.topics {
        let name = topic.name.0.to_string();
        // Kafka's topic-level errors carry their message; partition-level ones do not.
        let topic_error = if validate_topic_name(&name).is_err() {
            Some(BrokerError::InvalidTopic(
                "The request attempted to perform an operation on an invalid topic.".into(),
            ))
        } else if ctx.shard.image().topic(&name).is_none() {
            Some(BrokerError::UnknownTopicOrPartition)
        } else {
            None
        };
        let mut partitions = Vec::with_capacity(topic.partition_indexes.len());
        for index in topic.partition_indexes {
            let answer = PartitionResponse::default().with_partition_index(index);
            partitions.push(match &topic_error {
                Some(e) => answer
                    .with_error_code(e.code())
                    .with_error_message(Some(StrBytes::from_string(e.to_string()))),
                None => match producers(&ctx, &name, index).await {
                    Ok(active) => answer.with_active_producers(active),
                    Err(e) => answer.with_error_code(e.code()),
                },
            });
        }
        topics.push(
            TopicResponse::default()
                .with_name(topic.name)
                .with_partitions(partitions),
        );
    }
    DescribeProducersResponse::default().with_topics(topics)
}

/// The producers of this node's replica of `topic`-`index`, from the shard that owns it.
async fn producers(
    ctx: &RequestContext,
    topic: &str,
    index: i32,
) -> Result<Vec<ProducerState>, BrokerError> {
    let tp = TopicPartition {
        topic: topic.to_string(),
        partition: index,
    };
    let owner = ctx.shard.owner_of(&ctx.shard.image(), &tp)?;
    let active: Vec<ActiveProducer> = ctx
        .shard
        .invoke_on(owner, move |s| {
            let found = s.partition(&tp).ok_or(BrokerError::NotLeaderOrFollower);
            async move { found.map(|p| p.active_producers()) }.boxed_local()
        })
        .await?;
    Ok(active
        .into_iter()
        .map(|p| {
            ProducerState::default()
                .with_producer_id(p.producer_id.into())
                .with_producer_epoch(p.epoch.into())
                .with_last_sequence(p.last_sequence)
                .with_last_timestamp(p.last_timestamp)
                .with_coordinator_epoch(p.coordinator_epoch)
                .with_current_txn_start_offset(p.txn_start_offset)
        })
        .collect())
}
