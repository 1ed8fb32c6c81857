//! Heartbeat (API 12): keeps a classic group member's session alive; REBALANCE_IN_PROGRESS
//! tells it to rejoin.

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::{HeartbeatRequest, HeartbeatResponse};

use crate::errors::BrokerError;
use crate::group::{self};
use crate::kafka::RequestContext;
use crate::types::now_ms;

pub async fn handle(ctx: Rc<RequestContext>, req: HeartbeatRequest) -> HeartbeatResponse {
    let error = heartbeat(&ctx, req).await.err().map_or(0, |e| e.code());
    HeartbeatResponse::default().with_error_code(error)
}

async fn heartbeat(ctx: &RequestContext, req: HeartbeatRequest) -> Result<(), BrokerError> {
    let group_id = req.group_id.0.to_string();
    if group_id.is_empty() {
        return Err(BrokerError::InvalidGroupId);
    }
    let id = group_id.clone();
    let cfg = ctx.shard.config.group.clone();
    group::on_group(&ctx.shard, &group_id, move |s, partition| {
        async move {
            let now = now_ms();
            let mut c = s.groups.borrow_mut();
            let g = group::classic_group(&mut c, &id, partition.index, false, &cfg, now)?;
            g.heartbeat(
                &req.member_id,
                req.group_instance_id.as_deref(),
                req.generation_id,
                now,
            )
        }
        .boxed_local()
    })
    .await
}
