//! InitProducerId (API 22): a fresh producer id for an idempotent producer; for a
//! transactional id, its producer id and next epoch from the transaction coordinator
//! (`txn::init_producer_id`), which fences older producers of the id.

use std::rc::Rc;

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};

use crate::errors::BrokerError;
use crate::kafka::RequestContext;
use crate::txn;

pub async fn handle(ctx: Rc<RequestContext>, req: InitProducerIdRequest) -> InitProducerIdResponse {
    let result = match req.transactional_id {
        _ if (req.producer_id.0 < 0) != (req.producer_epoch < 0) => {
            Err(BrokerError::InvalidRequest(
                "producer id and epoch must both be set or both be -1".into(),
            ))
        }
        Some(id) => {
            let init = txn::InitRequest {
                transactional_id: id.0.to_string(),
                timeout_ms: req.transaction_timeout_ms,
                producer_id: req.producer_id.0,
                producer_epoch: req.producer_epoch,
            };
            let max_timeout_ms = ctx.shard.config.txn.max_timeout_ms;
            txn::init_producer_id(&ctx.shard, init, max_timeout_ms).await
        }
        None => txn::allocate_producer_id(&ctx.shard)
            .await
            .map(|id| (id, 0)),
    };
    match result {
        Ok((id, epoch)) => InitProducerIdResponse::default()
            .with_producer_id(ProducerId(id))
            .with_producer_epoch(epoch),
        Err(e) => {
            // PRODUCER_FENCED is new in v4.
            InitProducerIdResponse::default()
                .with_error_code(e.code_for(ctx.version, 4))
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1)
        }
    }
}
