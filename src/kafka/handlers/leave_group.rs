//! LeaveGroup (API 13): members leave a classic group (v3+: several at once, static members
//! by `group.instance.id`), which then rebalances without them.

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{LeaveGroupRequest, LeaveGroupResponse};
use kafka_protocol::protocol::StrBytes;

use crate::errors::BrokerError;
use crate::group::classic::Effects;
use crate::group::{self};
use crate::kafka::RequestContext;
use crate::types::now_ms;

/// (member id, instance id) of each member leaving.
type Leaving = Vec<(String, Option<String>)>;

pub async fn handle(ctx: Rc<RequestContext>, req: LeaveGroupRequest) -> LeaveGroupResponse {
    let batched = ctx.version >= 3;
    let leaving: Leaving = if batched {
        req.members
            .iter()
            .map(|m| {
                (
                    m.member_id.to_string(),
                    m.group_instance_id.as_ref().map(|i| i.to_string()),
                )
            })
            .collect()
    } else {
        vec![(req.member_id.to_string(), None)]
    };
    let group_id = req.group_id.0.to_string();
    match leave(&ctx, group_id, leaving.clone()).await {
        Err(e) => LeaveGroupResponse::default().with_error_code(e.code()),
        Ok(results) if !batched => LeaveGroupResponse::default()
            .with_error_code(results[0].as_ref().err().map_or(0, |e| e.code())),
        Ok(results) => LeaveGroupResponse::default().with_members(
            leaving
                .into_iter()
                .zip(results)
                .map(|((member, instance), r)| {
                    MemberResponse::default()
                        .with_member_id(StrBytes::from_string(member))
                        .with_group_instance_id(instance.map(StrBytes::from_string))
                        .with_error_code(r.err().map_or(0, |e: BrokerError| e.code()))
                })
                .collect(),
        ),
    }
}

async fn leave(
    ctx: &RequestContext,
    group_id: String,
    leaving: Leaving,
) -> Result<Vec<Result<(), BrokerError>>, BrokerError> {
    if group_id.is_empty() {
        return Err(BrokerError::InvalidGroupId);
    }
    let cfg = ctx.shard.config.group.clone();
    let id = group_id.clone();
    group::on_group(&ctx.shard, &group_id, move |s, partition| {
        async move {
            let now = now_ms();
            let mut fx = Effects::default();
            let results = {
                let mut c = s.groups.borrow_mut();
                let g = group::classic_group(&mut c, &id, partition.index, false, &cfg, now)?;
                leaving
                    .iter()
                    .map(|(member, instance)| g.leave(member, instance.as_deref(), now, &mut fx))
                    .collect()
            };
            // The group's new state is durable before the members are told they left.
            group::finish_classic(&s, &partition, &id, fx, now)
                .await
                .unwrap_or(Err(BrokerError::NotCoordinator))?;
            Ok(results)
        }
        .boxed_local()
    })
    .await
}
