//! EndTxn (API 26), v0-4: commits or aborts a producer's transaction at its coordinator
//! (`txn::end_txn`), answered once the decision is durable; the markers follow. (v5, where
//! the coordinator bumps the epoch with each transaction (KIP-890), is not served.)

use std::rc::Rc;

use kafka_protocol::messages::{EndTxnRequest, EndTxnResponse};

use crate::kafka::RequestContext;
use crate::txn;

pub async fn handle(ctx: Rc<RequestContext>, req: EndTxnRequest) -> EndTxnResponse {
    let result = txn::end_txn(
        &ctx.shard,
        req.transactional_id.0.to_string(),
        req.producer_id.0,
        req.producer_epoch,
        req.committed,
    )
    .await;
    let code = match result {
        Ok(()) => 0,
        // PRODUCER_FENCED is new in v2.
        Err(e) => e.code_for(ctx.version, 2),
    };
    EndTxnResponse::default().with_error_code(code)
}
