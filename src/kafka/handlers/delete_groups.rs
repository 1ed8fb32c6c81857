//! DeleteGroups (API 42): removes groups without members, with all their offsets.

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::{DeleteGroupsRequest, DeleteGroupsResponse};

use crate::errors::BrokerError;
use crate::group::codec::CoordinatorRecord;
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
    let not_found = || BrokerError::GroupIdNotFound(format!("Group {id} not found."));
    let r = group::on_group(&ctx.shard, &id, move |s, partition| {
        async move {
            let now = now_ms();
            let records = {
                let mut c = s.groups.borrow_mut();
                let g = c
                    .groups
                    .get(&gid)
                    .ok_or_else(|| BrokerError::GroupIdNotFound(String::new()))?;
                if !g.has_no_members() {
                    return Err(BrokerError::NonEmptyGroup);
                }
                // Offsets whose commit is still pending are deleted too: the tombstones land
                // after them.
                let keys: std::collections::BTreeSet<&(String, i32)> =
                    g.offsets.keys().chain(g.pending_offsets()).collect();
                let mut records: Vec<CoordinatorRecord> = keys
                    .into_iter()
                    .map(|(topic, p)| CoordinatorRecord::Offset {
                        group: gid.clone(),
                        topic: topic.clone(),
                        partition: *p,
                        value: None,
                    })
                    .collect();
                if g.metadata_record(&gid).is_some() {
                    records.push(group::tombstone(&gid, g));
                }
                c.groups.remove(&gid);
                records
            };
            group::append(&partition, &records, now).await
        }
        .boxed_local()
    })
    .await;
    match r {
        Err(BrokerError::GroupIdNotFound(_)) | Err(BrokerError::NotCoordinator) => Err(not_found()),
        other => other,
    }
}
