//! AddOffsetsToTxn (API 25), v0-4: adds a consumer group's partition of
//! `__consumer_offsets` to a producer's transaction (`txn::add_offsets`), so that its
//! TxnOffsetCommit becomes part of it (KIP-447).

use std::rc::Rc;

use kafka_protocol::messages::{AddOffsetsToTxnRequest, AddOffsetsToTxnResponse};

use crate::kafka::RequestContext;
use crate::txn;

pub async fn handle(
    ctx: Rc<RequestContext>,
    req: AddOffsetsToTxnRequest,
) -> AddOffsetsToTxnResponse {
    let result = txn::add_offsets(
        &ctx.shard,
        req.transactional_id.0.to_string(),
        req.producer_id.0,
        req.producer_epoch,
        &req.group_id.0,
    )
    .await;
    let code = match result {
        Ok(()) => 0,
        // PRODUCER_FENCED is new in v2.
        Err(e) => e.code_for(ctx.version, 2),
    };
    AddOffsetsToTxnResponse::default().with_error_code(code)
}
