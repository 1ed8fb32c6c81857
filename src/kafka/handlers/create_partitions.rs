//! CreatePartitions (API 37): raise a topic's partition count.

use std::rc::Rc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::{CreatePartitionsRequest, CreatePartitionsResponse};
use kafka_protocol::protocol::StrBytes;

use crate::kafka::handlers::admin::{self, TopicChange};
use crate::kafka::RequestContext;

pub async fn handle(
    ctx: Rc<RequestContext>,
    req: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let deadline = Instant::now() + Duration::from_millis(req.timeout_ms.max(0) as u64);
    let mut results = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        let change = TopicChange::Partitions(t.count);
        let name = t.name.0.to_string();
        let r = admin::change_topic_anywhere(&ctx.shard, name, change, req.validate_only, deadline)
            .await;
        let base = CreatePartitionsTopicResult::default().with_name(t.name);
        results.push(match r {
            Ok(()) => base.with_error_message(None),
            Err(e) => base
                .with_error_code(e.code())
                .with_error_message(Some(StrBytes::from_string(e.to_string()))),
        });
    }
    CreatePartitionsResponse::default().with_results(results)
}
