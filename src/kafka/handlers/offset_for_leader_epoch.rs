//! OffsetForLeaderEpoch (API 23): the end offset of a leader epoch, which consumers use to
//! validate their position after a leader change. On one node every batch has epoch 0, so
//! epoch 0 ends at the log end and later epochs are unknown.

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::{OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse};

use crate::kafka::RequestContext;
use crate::types::TopicPartition;

pub async fn handle(
    ctx: Rc<RequestContext>,
    req: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let mut topics = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in &t.partitions {
            let base = EpochEndOffset::default().with_partition(p.partition);
            let tp = TopicPartition {
                topic: t.topic.0.to_string(),
                partition: p.partition,
            };
            let (current, requested) = (p.current_leader_epoch, p.leader_epoch);
            let r = ctx
                .shard
                .on_partition(tp, move |part| {
                    async move { part.epoch_end_offset(current, requested) }.boxed_local()
                })
                .await;
            partitions.push(match r {
                Ok((epoch, end)) => base.with_leader_epoch(epoch).with_end_offset(end),
                Err(e) => base
                    .with_error_code(e.code())
                    .with_leader_epoch(-1)
                    .with_end_offset(-1),
            });
        }
        topics.push(
            OffsetForLeaderTopicResult::default()
                .with_topic(t.topic)
                .with_partitions(partitions),
        );
    }
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}
