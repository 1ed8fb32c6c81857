//! ConsumerGroupDescribe (API 69): a KIP-848 group's epochs, assignor and members with
//! their current and target assignments.

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::consumer_group_describe_response::{
    Assignment, DescribedGroup, Member, TopicPartitions,
};
use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, GroupId, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::errors::BrokerError;
use crate::group::consumer;
use crate::group::{self, GroupKind};
use crate::kafka::RequestContext;
use crate::metadata::MetadataImage;

pub async fn handle(
    ctx: Rc<RequestContext>,
    req: ConsumerGroupDescribeRequest,
) -> ConsumerGroupDescribeResponse {
    let mut groups = Vec::with_capacity(req.group_ids.len());
    for id in req.group_ids {
        let name = id.0.to_string();
        let described = if name.is_empty() {
            Err(BrokerError::InvalidGroupId)
        } else {
            describe(&ctx, name.clone()).await
        };
        let described = match described {
            Ok(g) => g,
            Err(e) => {
                let e = match e {
                    BrokerError::NotCoordinator => {
                        BrokerError::GroupIdNotFound(format!("Group {name} not found."))
                    }
                    other => other,
                };
                DescribedGroup::default()
                    .with_group_id(id)
                    .with_error_code(e.code())
                    .with_error_message(Some(StrBytes::from_string(e.to_string())))
            }
        };
        groups.push(described);
    }
    ConsumerGroupDescribeResponse::default().with_groups(groups)
}

fn assignment(a: &consumer::Assignment, image: &MetadataImage) -> Assignment {
    Assignment::default().with_topic_partitions(
        a.iter()
            .map(|(id, ps)| {
                let name = image
                    .topic_by_id(id)
                    .map(|t| t.name.clone())
                    .unwrap_or_default();
                TopicPartitions::default()
                    .with_topic_id(*id)
                    .with_topic_name(TopicName(StrBytes::from_string(name)))
                    .with_partitions(ps.iter().copied().collect())
            })
            .collect(),
    )
}

async fn describe(ctx: &RequestContext, id: String) -> Result<DescribedGroup, BrokerError> {
    let gid = id.clone();
    group::on_group(&ctx.shard, &id, move |s, _| {
        async move {
            let image = s.image();
            let c = s.groups.borrow();
            let g = c
                .groups
                .get(&gid)
                .ok_or_else(|| BrokerError::GroupIdNotFound(format!("Group {gid} not found.")))?;
            let GroupKind::Consumer(cg) = &g.kind else {
                return Err(BrokerError::GroupIdNotFound(format!(
                    "Group {gid} is not a consumer group."
                )));
            };
            let text = |s: &str| StrBytes::from_string(s.to_string());
            let members = cg
                .members
                .values()
                .map(|m| {
                    Member::default()
                        .with_member_id(text(&m.member_id))
                        .with_instance_id(m.instance_id.as_deref().map(text))
                        .with_rack_id(m.rack_id.as_deref().map(text))
                        .with_member_epoch(m.epoch)
                        .with_client_id(text(&m.client_id))
                        .with_client_host(text(&m.client_host))
                        .with_subscribed_topic_names(
                            m.subscribed_topics
                                .iter()
                                .map(|t| TopicName(text(t)))
                                .collect(),
                        )
                        .with_assignment(assignment(&m.assigned, &image))
                        .with_target_assignment(assignment(&cg.target_of(&m.member_id), &image))
                        // KIP-1099: 1 = a member using the consumer protocol.
                        .with_member_type(1)
                })
                .collect();
            Ok(DescribedGroup::default()
                .with_group_id(GroupId(text(&gid)))
                .with_group_state(text(cg.state_name()))
                .with_group_epoch(cg.epoch)
                .with_assignment_epoch(cg.assignment_epoch)
                .with_assignor_name(text(&cg.assignor))
                .with_members(members)
                .with_authorized_operations(i32::MIN))
        }
        .boxed_local()
    })
    .await
}
