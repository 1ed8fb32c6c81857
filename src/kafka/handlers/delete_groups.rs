//! DeleteGroups (API 42): removes groups without members, with all their offsets.

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::{DeleteGroupsRequest, DeleteGroupsResponse};

use crate::errors::BrokerError;
use crate::group::{self};
use crate::kafka::RequestContext;
use crate::types::now_ms;

pub async fn handle(ctx: Rc<RequestContext>, req: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let mut results = Vec::with_capacity(req.groups_names.len());
    for name in req.groups_names {
        let error = delete(&ctx, name.0.to_string())
            .await
            .err()
            .map_or(0, |e| e.code());
        results.push(
            DeletableGroupResult::default()
                .with_group_id(name)
                .with_error_code(error),
        );
    }
    DeleteGroupsResponse::default().with_results(results)
}

async fn delete(ctx: &RequestContext, id: String) -> Result<(), BrokerError> {
    let gid = id.clone();
    let r = group::on_group(&ctx.shard, &id, move |s, partition| {
        async move {
            group::delete_group(&s.groups, partition.index, &partition, &gid, now_ms()).await
        }
        .boxed_local()
    })
    .await;
    name_not_found(r, &id)
}

/// GROUP_ID_NOT_FOUND names the group. A node that does not coordinate it (or a cluster
/// without `__consumer_offsets` yet) says NOT_COORDINATOR, as Kafka does, so that the client
/// looks the coordinator up again rather than give up.
pub fn name_not_found<T>(r: Result<T, BrokerError>, id: &str) -> Result<T, BrokerError> {
    match r {
        Err(BrokerError::GroupIdNotFound(_)) => Err(BrokerError::GroupIdNotFound(format!(
            "Group {id} not found."
        ))),
        other => other,
    }
}
