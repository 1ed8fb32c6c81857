//! DescribeTransactions (API 65), v0: each transactional id's state at its coordinator
//! (`txn::describe`): NOT_COORDINATOR when this node does not coordinate it,
//! COORDINATOR_LOAD_IN_PROGRESS while loading, TRANSACTIONAL_ID_NOT_FOUND for an id it does
//! not know, INVALID_REQUEST for an empty one. The start time is -1 while Empty. Prepared
//! transactions list all their partitions until complete (Kafka drops each as its marker is
//! written).

use std::collections::BTreeMap;
use std::rc::Rc;

use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
use kafka_protocol::messages::{
    DescribeTransactionsRequest, DescribeTransactionsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::kafka::RequestContext;
use crate::txn;

pub async fn handle(
    ctx: Rc<RequestContext>,
    req: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let described = req.transactional_ids.into_iter().map(|id| {
        let ctx = ctx.clone();
        async move {
            let answer = TransactionState::default().with_transactional_id(id.clone());
            match txn::describe(&ctx.shard, id.0.to_string()).await {
                Err(e) => answer.with_error_code(e.code()),
                Ok(v) => {
                    let mut topics: BTreeMap<String, Vec<i32>> = BTreeMap::new();
                    for (topic, index) in v.partitions {
                        topics.entry(topic).or_default().push(index);
                    }
                    answer
                        .with_transaction_state(StrBytes::from_static_str(v.state.name()))
                        .with_transaction_timeout_ms(v.timeout_ms)
                        .with_transaction_start_time_ms(v.start_ms)
                        .with_producer_id(v.producer_id.into())
                        .with_producer_epoch(v.producer_epoch)
                        .with_topics(
                            topics
                                .into_iter()
                                .map(|(topic, partitions)| {
                                    TopicData::default()
                                        .with_topic(TopicName(StrBytes::from_string(topic)))
                                        .with_partitions(partitions)
                                })
                                .collect(),
                        )
                }
            }
        }
    });
    DescribeTransactionsResponse::default()
        .with_transaction_states(futures::future::join_all(described).await)
}
