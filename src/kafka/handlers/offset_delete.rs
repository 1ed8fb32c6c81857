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
use crate::group::classic::ClassicState;
use crate::group::{self, GroupKind};
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
            let now = now_ms();
            let mut changes = Vec::new();
            let mut subscribed_flags = Vec::with_capacity(wanted.len());
            {
                let mut c = s.groups.borrow_mut();
                let g = c
                    .groups
                    .get_mut(&gid)
                    .ok_or_else(|| BrokerError::GroupIdNotFound(String::new()))?;
                let subscribed = match &g.kind {
                    GroupKind::Classic(cg) if cg.state == ClassicState::Empty => Default::default(),
                    GroupKind::Classic(cg) => {
                        cg.subscribed_topics().ok_or(BrokerError::NonEmptyGroup)?
                    }
                    GroupKind::Consumer(cg) => cg.subscribed_topics(),
                };
                for (topic, partitions) in wanted {
                    let is_subscribed = subscribed.contains(&topic);
                    subscribed_flags.push(is_subscribed);
                    if is_subscribed {
                        continue;
                    }
                    for p in partitions {
                        let key = (topic.clone(), p);
                        if g.offsets.contains_key(&key) {
                            changes.push((key, None));
                        }
                    }
                }
            }
            group::write_offsets(&s.groups, partition.index, &partition, &gid, changes, now)
                .await?;
            Ok(subscribed_flags)
        }
        .boxed_local()
    })
    .await;
    match r {
        Err(BrokerError::GroupIdNotFound(_)) | Err(BrokerError::NotCoordinator) => Err(
            BrokerError::GroupIdNotFound(format!("Group {id} not found.")),
        ),
        other => other,
    }
}
