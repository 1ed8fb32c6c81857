//! JoinGroup (API 11): a classic group member joins or rejoins; the answer waits until the
//! rebalance's join phase completes (see `group::classic`). v4+ members without an id first
//! get MEMBER_ID_REQUIRED with one (KIP-394); `group.instance.id` makes a member static
//! (KIP-345).

use std::rc::Rc;

use futures::channel::oneshot;
use futures::FutureExt;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::{JoinGroupRequest, JoinGroupResponse};
use kafka_protocol::protocol::StrBytes;

use crate::errors::BrokerError;
use crate::group::classic::{Effects, JoinRequest, JoinResult};
use crate::group::{self};
use crate::kafka::RequestContext;
use crate::types::now_ms;

pub async fn handle(ctx: Rc<RequestContext>, req: JoinGroupRequest) -> JoinGroupResponse {
    let member_id = req.member_id.to_string();
    let r = join(&ctx, req)
        .await
        .unwrap_or_else(|e| JoinResult::error(e, &member_id));
    let text = |s: String| StrBytes::from_string(s);
    let protocol_name = match (r.protocol_name, ctx.version) {
        (None, v) if v < 7 => Some(StrBytes::default()),
        (name, _) => name.map(text),
    };
    JoinGroupResponse::default()
        .with_error_code(r.error.map_or(0, |e| e.code()))
        .with_generation_id(r.generation)
        .with_protocol_type(r.protocol_type.map(text))
        .with_protocol_name(protocol_name)
        .with_leader(text(r.leader))
        .with_skip_assignment(r.skip_assignment)
        .with_member_id(text(r.member_id))
        .with_members(
            r.members
                .into_iter()
                .map(|(id, instance, metadata)| {
                    JoinGroupResponseMember::default()
                        .with_member_id(text(id))
                        .with_group_instance_id(instance.map(text))
                        .with_metadata(metadata)
                })
                .collect(),
        )
}

async fn join(ctx: &RequestContext, req: JoinGroupRequest) -> Result<JoinResult, BrokerError> {
    let group_id = req.group_id.0.to_string();
    if group_id.is_empty() {
        return Err(BrokerError::InvalidGroupId);
    }
    let cfg = &ctx.shard.config.group;
    if req.session_timeout_ms < cfg.min_session_timeout_ms
        || req.session_timeout_ms > cfg.max_session_timeout_ms
    {
        return Err(BrokerError::InvalidSessionTimeout);
    }
    group::check_string(&group_id).map_err(|_| BrokerError::InvalidGroupId)?;
    for s in [req.member_id.as_str(), req.protocol_type.as_str()]
        .into_iter()
        .chain(req.group_instance_id.as_deref())
        .chain(req.protocols.iter().map(|p| p.name.as_str()))
    {
        group::check_string(s)?;
    }
    let join = JoinRequest {
        member_id: req.member_id.to_string(),
        instance_id: req.group_instance_id.map(|i| i.to_string()),
        client_id: ctx.client_id(),
        client_host: ctx.client_host.clone(),
        session_timeout_ms: req.session_timeout_ms,
        // v0 has no rebalance timeout: Kafka uses the session timeout.
        rebalance_timeout_ms: if ctx.version == 0 {
            req.session_timeout_ms
        } else {
            req.rebalance_timeout_ms
        },
        protocol_type: req.protocol_type.to_string(),
        protocols: req
            .protocols
            .into_iter()
            .map(|p| (p.name.to_string(), p.metadata))
            .collect(),
        require_known_member_id: ctx.version >= 4,
        supports_skip_assignment: ctx.version >= 9,
    };
    let cfg = ctx.shard.config.group.clone();
    let id = group_id.clone();
    let rx = group::on_group(&ctx.shard, &group_id, move |s, partition| {
        async move {
            let now = now_ms();
            let (tx, rx) = oneshot::channel();
            let mut fx = Effects::default();
            {
                let mut c = s.groups.borrow_mut();
                let create = join.member_id.is_empty();
                let g = group::classic_group(&mut c, &id, partition.index, create, &cfg, now)?;
                let prefix = join
                    .instance_id
                    .clone()
                    .unwrap_or_else(|| join.client_id.clone());
                g.join(
                    join,
                    tx,
                    &cfg,
                    || group::new_member_id(&prefix),
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
        BrokerError::CoordinatorNotAvailable("the group coordinator dropped the join".into())
    })
}
