//! WriteTxnMarkers (API 27), v1: writes a commit or abort marker for a producer on
//! partitions this node leads, as the transaction coordinator does (`txn::write_markers_here`,
//! the same path). Kafka's admin client sends it to abort a hanging transaction
//! (`kafka-transactions.sh abort`). Per partition: UNKNOWN_TOPIC_OR_PARTITION when no replica
//! of it is here, NOT_LEADER_OR_FOLLOWER on a follower, INVALID_PRODUCER_EPOCH for an older
//! producer epoch, TRANSACTION_COORDINATOR_FENCED for an older coordinator epoch; as in
//! Kafka a marker for a producer with no open transaction here is written all the same.
//! Each is answered once durable. (No ACLs yet: Kafka asks for ClusterAction.)

use std::rc::Rc;

use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kafka_protocol::messages::{WriteTxnMarkersRequest, WriteTxnMarkersResponse};

use crate::errors::BrokerError;
use crate::kafka::RequestContext;
use crate::producer_state::Marker;
use crate::txn;
use crate::types::TopicPartition;

pub async fn handle(
    ctx: Rc<RequestContext>,
    req: WriteTxnMarkersRequest,
) -> WriteTxnMarkersResponse {
    let mut results = Vec::with_capacity(req.markers.len());
    for m in req.markers {
        let marker = Marker {
            commit: m.transaction_result,
            coordinator_epoch: m.coordinator_epoch,
        };
        let image = ctx.shard.image();
        let mut hosted = Vec::new();
        let mut codes: Vec<Vec<i16>> = Vec::with_capacity(m.topics.len());
        for t in &m.topics {
            let mut topic_codes = Vec::with_capacity(t.partition_indexes.len());
            for &index in &t.partition_indexes {
                let tp = TopicPartition {
                    topic: t.name.0.to_string(),
                    partition: index,
                };
                match ctx.shard.owner_of(&image, &tp) {
                    Ok(_) => {
                        hosted.push((tp.topic, index));
                        topic_codes.push(0);
                    }
                    Err(_) => topic_codes.push(BrokerError::UnknownTopicOrPartition.code()),
                }
            }
            codes.push(topic_codes);
        }
        let pid = m.producer_id.0;
        let mut written =
            txn::write_markers_here(&ctx.shard, pid, m.producer_epoch, marker, hosted)
                .await
                .into_iter();
        let topics = m
            .topics
            .into_iter()
            .zip(codes)
            .map(|(t, topic_codes)| {
                let partitions = t
                    .partition_indexes
                    .into_iter()
                    .zip(topic_codes)
                    .map(|(index, code)| {
                        let code = match code {
                            0 => written
                                .next()
                                .expect("one answer per hosted partition")
                                .map_or_else(|e| e.code(), |()| 0),
                            code => code,
                        };
                        WritableTxnMarkerPartitionResult::default()
                            .with_partition_index(index)
                            .with_error_code(code)
                    })
                    .collect();
                WritableTxnMarkerTopicResult::default()
                    .with_name(t.name)
                    .with_partitions(partitions)
            })
            .collect();
        results.push(
            WritableTxnMarkerResult::default()
                .with_producer_id(m.producer_id)
                .with_topics(topics),
        );
    }
    WriteTxnMarkersResponse::default().with_markers(results)
}
