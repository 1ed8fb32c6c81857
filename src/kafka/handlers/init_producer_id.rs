//! InitProducerId (API 22): a fresh producer id for idempotent producers. Transactional ids
//! need the transaction coordinator, which does not exist yet.

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};
use kafka_protocol::ResponseError;

use crate::kafka::RequestContext;

pub async fn handle(ctx: Rc<RequestContext>, req: InitProducerIdRequest) -> InitProducerIdResponse {
    if req.transactional_id.is_some() {
        // No transaction coordinator yet: Kafka's answer when none is available.
        return InitProducerIdResponse::default()
            .with_error_code(ResponseError::CoordinatorNotAvailable.code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
    }
    let allocated = ctx
        .shard
        .on_controller(|shard| {
            async move {
                let ids = shard
                    .producer_ids
                    .as_ref()
                    .expect("producer ids live on shard 0");
                ids.allocate().await.map_err(|e| e.to_string())
            }
            .boxed_local()
        })
        .await;
    match allocated {
        Ok(id) => InitProducerIdResponse::default()
            .with_producer_id(ProducerId(id))
            .with_producer_epoch(0),
        Err(e) => {
            tracing::error!(error = %e, "cannot persist the producer id counter");
            InitProducerIdResponse::default()
                .with_error_code(ResponseError::KafkaStorageError.code())
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1)
        }
    }
}
