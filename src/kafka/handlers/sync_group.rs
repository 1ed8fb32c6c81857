//! SyncGroup (API 14): members of a classic group collect their assignments, which the
//! leader's request carries; the answers go out once the group's metadata is durable.

use std::rc::Rc;

use futures::channel::oneshot;
use futures::FutureExt;
use kafka_protocol::messages::{SyncGroupRequest, SyncGroupResponse};
use kafka_protocol::protocol::StrBytes;

use crate::errors::BrokerError;
use crate::group::classic::{Effects, SyncResult};
use crate::group::{self};
use crate::kafka::RequestContext;
use crate::types::now_ms;

pub async fn handle(ctx: Rc<RequestContext>, req: SyncGroupRequest) -> SyncGroupResponse {
    match sync(&ctx, req).await {
        Ok((protocol_type, protocol_name, assignment)) => SyncGroupResponse::default()
            .with_protocol_type(protocol_type.map(StrBytes::from_string))
            .with_protocol_name(protocol_name.map(StrBytes::from_string))
            .with_assignment(assignment),
        Err(e) => SyncGroupResponse::default().with_error_code(e.code()),
    }
}

async fn sync(ctx: &RequestContext, req: SyncGroupRequest) -> SyncResult {
    let group_id = req.group_id.0.to_string();
    if group_id.is_empty() {
        return Err(BrokerError::InvalidGroupId);
    }
    let id = group_id.clone();
    let cfg = ctx.shard.config.group.clone();
    let rx = group::on_group(&ctx.shard, &group_id, move |s, partition| {
        async move {
            let now = now_ms();
            let (tx, rx) = oneshot::channel();
            let mut fx = Effects::default();
            {
                let mut c = s.groups.borrow_mut();
                let g = group::classic_group(&mut c, &id, partition.index, false, &cfg, now)?;
                g.sync(
                    &req.member_id,
                    req.group_instance_id.as_deref(),
                    req.generation_id,
                    req.protocol_type.as_deref(),
                    req.protocol_name.as_deref(),
                    req.assignments
                        .into_iter()
                        .map(|a| (a.member_id.to_string(), a.assignment))
                        .collect(),
                    tx,
                    now,
                    &mut fx,
                );
            }
            drop(group::finish_classic(&s, &partition, &id, fx, now));
            Ok(rx)
        }
        .boxed_local()
    })
    .await?;
    rx.await.map_err(|_| {
        BrokerError::CoordinatorNotAvailable("the group coordinator dropped the sync".into())
    })?
}
