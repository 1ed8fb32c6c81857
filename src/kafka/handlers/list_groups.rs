//! ListGroups (API 16): every group this broker coordinates, gathered from all shards, with
//! the v4 state filter and the v5 type filter (both case-insensitive, as in Kafka).

use std::rc::Rc;

use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{GroupId, ListGroupsRequest, ListGroupsResponse};
use kafka_protocol::protocol::StrBytes;

use crate::errors::BrokerError;
use crate::group;
use crate::kafka::RequestContext;

/// (group id, protocol type, state, type) of one group.
type Listed = (String, String, &'static str, &'static str);

pub async fn handle(ctx: Rc<RequestContext>, req: ListGroupsRequest) -> ListGroupsResponse {
    let per_shard: Vec<(bool, Vec<Listed>)> = group::on_every_shard(&ctx.shard, |s| {
        let c = s.groups.borrow();
        let groups = c
            .groups
            .iter()
            .map(|(id, g)| (id.clone(), g.protocol_type(), g.state_name(), g.type_name()))
            .collect();
        (c.loading(), groups)
    })
    .await;
    let states: Vec<String> = req
        .states_filter
        .iter()
        .map(|s| s.to_ascii_lowercase())
        .collect();
    let types: Vec<String> = req
        .types_filter
        .iter()
        .map(|s| s.to_ascii_lowercase())
        .collect();
    let loading = per_shard.iter().any(|(l, _)| *l);
    let mut groups: Vec<Listed> = per_shard
        .into_iter()
        .flat_map(|(_, g)| g)
        .filter(|(_, _, state, _)| {
            states.is_empty() || states.contains(&state.to_ascii_lowercase())
        })
        .filter(|(_, _, _, kind)| types.is_empty() || types.contains(&kind.to_string()))
        .collect();
    groups.sort();
    ListGroupsResponse::default()
        .with_error_code(if loading {
            BrokerError::CoordinatorLoadInProgress.code()
        } else {
            0
        })
        .with_groups(
            groups
                .into_iter()
                .map(|(id, protocol_type, state, kind)| {
                    ListedGroup::default()
                        .with_group_id(GroupId(StrBytes::from_string(id)))
                        .with_protocol_type(StrBytes::from_string(protocol_type))
                        .with_group_state(StrBytes::from_static_str(state))
                        .with_group_type(StrBytes::from_static_str(kind))
                })
                .collect(),
        )
}
