//! OffsetDelete (API 47): removes some committed offsets of a group, except for topics its
//! members are still subscribed to (GROUP_SUBSCRIBED_TO_TOPIC), once the tombstones are
//! durable (`group::write_offsets`).

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::{OffsetDeleteRequest, OffsetDeleteResponse};

use crate::errors::BrokerError;
use crate::group;
use crate::kafka::handlers::delete_groups::name_not_found;
use crate::kafka::RequestContext;
use crate::types::now_ms;

pub async fn handle(ctx: Rc<RequestContext>, req: OffsetDeleteRequest) -> OffsetDeleteResponse {
    let wanted: Vec<(String, Vec<i32>)> = req
        .topics
        .iter()
        .map(|t| {
            (
                t.name.0.to_string(),
                t.partitions.iter().map(|p| p.partition_index).collect(),
            )
        })
        .collect();
    match delete(&ctx, req.group_id.0.to_string(), wanted.clone()).await {
        Err(e) => OffsetDeleteResponse::default().with_error_code(e.code()),
        Ok(subscribed) => OffsetDeleteResponse::default().with_topics(
            req.topics
                .into_iter()
                .zip(subscribed)
                .map(|(t, subscribed)| {
                    let code = if ctx.shard.image().topic(&t.name).is_none() {
                        BrokerError::UnknownTopicOrPartition.code()
                    } else if subscribed {
                        BrokerError::GroupSubscribedToTopic.code()
                    } else {
                        0
                    };
                    let partitions = t
                        .partitions
                        .iter()
                        .map(|p| {
                            OffsetDeleteResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(code)
                        })
                        .collect();
                    OffsetDeleteResponseTopic::default()
                        .with_name(t.name)
                        .with_partitions(partitions)
                })
                .collect(),
        ),
    }
}

/// Deletes the offsets; per topic, whether the group is subscribed to it (nothing deleted).
async fn delete(
    ctx: &RequestContext,
    id: String,
    wanted: Vec<(String, Vec<i32>)>,
) -> Result<Vec<bool>, BrokerError> {
    let gid = id.clone();
    let r = group::on_group(&ctx.shard, &id, move |s, partition| {
        async move {
            group::delete_offsets(
                &s.groups,
                partition.index,
                &partition,
                &gid,
                wanted,
                now_ms(),
            )
            .await
        }
        .boxed_local()
    })
    .await;
    name_not_found(r, &id)
}
