//! CreatePartitions (API 37): raise a topic's partition count.

use std::rc::Rc;

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::{CreatePartitionsRequest, CreatePartitionsResponse};
use kafka_protocol::protocol::StrBytes;

use crate::kafka::handlers::admin;
use crate::kafka::RequestContext;

pub async fn handle(
    ctx: Rc<RequestContext>,
    req: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut results = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        let r =
            admin::create_partitions(&ctx.shard, t.name.0.to_string(), t.count, req.validate_only)
                .await;
        let base = CreatePartitionsTopicResult::default().with_name(t.name);
        results.push(match r {
            Ok(()) => base,
            Err(e) => base
                .with_error_code(e.code())
                .with_error_message(Some(StrBytes::from_string(e.to_string()))),
        });
    }
    CreatePartitionsResponse::default().with_results(results)
}
