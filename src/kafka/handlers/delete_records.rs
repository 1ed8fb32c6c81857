//! DeleteRecords (API 21): move a partition's log start offset forward.

use std::rc::Rc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};

use crate::errors::BrokerError;
use crate::group::is_internal_topic;
use crate::kafka::RequestContext;
use crate::types::{now_ms, TopicPartition};

pub async fn handle(ctx: Rc<RequestContext>, req: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let deadline = Instant::now() + Duration::from_millis(req.timeout_ms.max(0) as u64);
    // Kafka's low watermark counts the replicas on live (registered, unfenced) brokers.
    let live: Vec<i32> = ctx
        .shard
        .image()
        .brokers
        .iter()
        .filter(|(_, b)| !b.fenced)
        .map(|(id, _)| *id)
        .collect();
    let mut topics = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in &t.partitions {
            let tp = TopicPartition {
                topic: t.name.0.to_string(),
                partition: p.partition_index,
            };
            let offset = p.offset;
            let live = live.clone();
            if is_internal_topic(&tp.topic) {
                // Kafka: records of an internal topic cannot be deleted.
                partitions.push(
                    DeleteRecordsPartitionResult::default()
                        .with_partition_index(p.partition_index)
                        .with_low_watermark(-1)
                        .with_error_code(BrokerError::InvalidTopic(String::new()).code()),
                );
                continue;
            }
            let r = ctx
                .shard
                .on_partition(tp, move |part| {
                    async move {
                        if !part.is_leader() {
                            return Err(BrokerError::NotLeaderOrFollower);
                        }
                        // -1 means "up to the high watermark".
                        let target = if offset == -1 {
                            part.high_watermark()
                        } else {
                            offset
                        };
                        if target < 0 || target > part.high_watermark() {
                            return Err(BrokerError::OffsetOutOfRange);
                        }
                        part.move_log_start(target, now_ms()).await?;
                        // Answered once every live replica starts there too, or
                        // REQUEST_TIMED_OUT after timeout_ms, as Kafka answers.
                        let live = |id| live.contains(&id);
                        part.replication
                            .wait_low_watermark(&part.log, target, live, deadline)
                            .await
                    }
                    .boxed_local()
                })
                .await;
            let base =
                DeleteRecordsPartitionResult::default().with_partition_index(p.partition_index);
            partitions.push(match r {
                Ok(low) => base.with_low_watermark(low),
                Err(e) => base.with_low_watermark(-1).with_error_code(e.code()),
            });
        }
        topics.push(
            DeleteRecordsTopicResult::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    DeleteRecordsResponse::default().with_topics(topics)
}
