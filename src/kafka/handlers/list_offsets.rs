//! ListOffsets (API 2): latest (-1), earliest (-2), max timestamp (-3, v7+), earliest local
//! (-4, v8+), latest tiered (-5, v9+), or the first offset whose timestamp is >= a time.
//! read_committed (isolation level 1) looks below the LSO instead of the HW.

use std::rc::Rc;

use futures::future::join_all;
use futures::FutureExt;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};

use crate::errors::BrokerError;
use crate::kafka::RequestContext;
use crate::types::TopicPartition;

/// (offset, timestamp) or None for "no such record" (-1, -1).
type Lookup = Result<Option<(i64, i64, i32)>, BrokerError>;

pub async fn handle(ctx: Rc<RequestContext>, req: ListOffsetsRequest) -> ListOffsetsResponse {
    let version = ctx.version;
    let read_committed = req.isolation_level == 1;
    let mut topics = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        let name = t.name.0.to_string();
        let lookups = t.partitions.iter().map(|p| {
            let tp = TopicPartition {
                topic: name.clone(),
                partition: p.partition_index,
            };
            let timestamp = p.timestamp;
            let current_leader_epoch = p.current_leader_epoch;
            let min_version = match timestamp {
                -3 => 7,
                -4 => 8,
                -5 => 9,
                _ => 0,
            };
            let shard = ctx.shard.clone();
            async move {
                if timestamp < -5 || version < min_version {
                    return Err(BrokerError::UnsupportedVersion);
                }
                shard
                    .on_partition(tp, move |p| {
                        async move {
                            let epoch = p.check_read(current_leader_epoch).await?;
                            let found = match timestamp {
                                -1 if read_committed => Ok(Some((p.last_stable_offset(), -1))),
                                -1 => Ok(Some((p.high_watermark(), -1))),
                                // No tiered storage: nothing is remote (Kafka answers -1, -1).
                                -5 => Ok(None),
                                -2 | -4 => Ok(Some((p.log_start(), -1))),
                                -3 => p.max_timestamp_offset().await,
                                ts => p.offset_for_timestamp(ts, read_committed).await,
                            };
                            found.map(|f| f.map(|(offset, ts)| (offset, ts, epoch)))
                        }
                        .boxed_local()
                    })
                    .await
            }
        });
        let results: Vec<Lookup> = join_all(lookups).await;
        let partitions = t
            .partitions
            .iter()
            .zip(results)
            .map(|(p, r)| {
                let base =
                    ListOffsetsPartitionResponse::default().with_partition_index(p.partition_index);
                match r {
                    Ok(Some((offset, ts, epoch))) => base
                        .with_offset(offset)
                        .with_timestamp(ts)
                        .with_leader_epoch(if version >= 4 { epoch } else { -1 }),
                    Ok(None) => base
                        .with_offset(-1)
                        .with_timestamp(-1)
                        .with_leader_epoch(-1),
                    Err(e) => base
                        .with_error_code(e.code())
                        .with_offset(-1)
                        .with_timestamp(-1)
                        .with_leader_epoch(-1),
                }
            })
            .collect();
        topics.push(
            ListOffsetsTopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    ListOffsetsResponse::default().with_topics(topics)
}
