//! DescribeGroups (API 15): a classic group's state, protocol and members (with their
//! metadata and assignments once the group is stable).

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::{DescribeGroupsRequest, DescribeGroupsResponse, GroupId};
use kafka_protocol::protocol::StrBytes;

use crate::errors::BrokerError;
use crate::group::classic::ClassicState;
use crate::group::{self, GroupKind};
use crate::kafka::RequestContext;

pub async fn handle(ctx: Rc<RequestContext>, req: DescribeGroupsRequest) -> DescribeGroupsResponse {
    let mut groups = Vec::with_capacity(req.groups.len());
    for id in req.groups {
        let name = id.0.to_string();
        let described = match describe(&ctx, name.clone()).await {
            Ok(Some(g)) => g,
            Ok(None) | Err(BrokerError::NotCoordinator) if ctx.version >= 6 => dead(&name)
                .with_error_code(BrokerError::GroupIdNotFound(String::new()).code())
                .with_error_message(Some(StrBytes::from_string(format!(
                    "Group {name} not found."
                )))),
            Ok(None) | Err(BrokerError::NotCoordinator) => dead(&name),
            Err(e) => dead(&name).with_error_code(e.code()),
        };
        groups.push(described);
    }
    DescribeGroupsResponse::default().with_groups(groups)
}

fn dead(id: &str) -> DescribedGroup {
    DescribedGroup::default()
        .with_group_id(GroupId(StrBytes::from_string(id.to_string())))
        .with_group_state(StrBytes::from_static_str("Dead"))
        .with_authorized_operations(i32::MIN)
}

async fn describe(ctx: &RequestContext, id: String) -> Result<Option<DescribedGroup>, BrokerError> {
    let gid = id.clone();
    let version = ctx.version;
    group::on_group(&ctx.shard, &id, move |s, _| {
        async move {
            let c = s.groups.borrow();
            let Some(g) = c.groups.get(&gid) else {
                return Ok(None);
            };
            let text = |s: &str| StrBytes::from_string(s.to_string());
            let base = dead(&gid)
                .with_group_state(StrBytes::from_static_str(g.state_name()))
                .with_protocol_type(text(&g.protocol_type()));
            Ok(Some(match &g.kind {
                GroupKind::Classic(cg) => {
                    let stable = cg.state == ClassicState::Stable;
                    let protocol = cg.protocol.clone().unwrap_or_default();
                    let members = cg
                        .members
                        .values()
                        .map(|m| {
                            let (metadata, assignment) = if stable {
                                let metadata = m
                                    .protocols
                                    .iter()
                                    .find(|(n, _)| *n == protocol)
                                    .map(|(_, b)| b.clone())
                                    .unwrap_or_default();
                                (metadata, m.assignment.clone())
                            } else {
                                Default::default()
                            };
                            DescribedGroupMember::default()
                                .with_member_id(text(&m.member_id))
                                .with_group_instance_id(m.instance_id.as_deref().map(text))
                                .with_client_id(text(&m.client_id))
                                .with_client_host(text(&m.client_host))
                                .with_member_metadata(metadata)
                                .with_member_assignment(assignment)
                        })
                        .collect();
                    // Kafka names the protocol only once the group is stable.
                    let protocol_data = if stable {
                        text(&protocol)
                    } else {
                        StrBytes::default()
                    };
                    base.with_protocol_data(protocol_data).with_members(members)
                }
                // A KIP-848 group is described by ConsumerGroupDescribe; here it is not a
                // classic group.
                GroupKind::Consumer(_) if version >= 6 => dead(&gid)
                    .with_error_code(BrokerError::GroupIdNotFound(String::new()).code())
                    .with_error_message(Some(StrBytes::from_string(format!(
                        "Group {gid} is not a classic group."
                    )))),
                GroupKind::Consumer(_) => dead(&gid),
            }))
        }
        .boxed_local()
    })
    .await
}
