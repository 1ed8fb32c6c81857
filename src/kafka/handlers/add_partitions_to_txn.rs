//! AddPartitionsToTxn (API 24), the client's form (v0-3): adds partitions to a producer's
//! open transaction at its coordinator (`txn::add_partitions`). As in Kafka, an unknown
//! partition fails the request: it gets UNKNOWN_TOPIC_OR_PARTITION and the others
//! OPERATION_NOT_ATTEMPTED; otherwise every partition gets the coordinator's one answer.
//! (v4+, the brokers' batched and verify-only form of KIP-890, is not served.)

use std::rc::Rc;

use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::{AddPartitionsToTxnRequest, AddPartitionsToTxnResponse};

use crate::errors::BrokerError;
use crate::kafka::RequestContext;
use crate::txn;

pub async fn handle(
    ctx: Rc<RequestContext>,
    req: AddPartitionsToTxnRequest,
) -> AddPartitionsToTxnResponse {
    let image = ctx.shard.image();
    let unknown = |topic: &str, p: i32| {
        image
            .topic(topic)
            .is_none_or(|t| p < 0 || p >= t.partitions)
    };
    let any_unknown = req
        .v3_and_below_topics
        .iter()
        .any(|t| t.partitions.iter().any(|&p| unknown(&t.name, p)));
    let answer: Result<(), BrokerError> = if any_unknown {
        Err(BrokerError::OperationNotAttempted)
    } else {
        let partitions = req
            .v3_and_below_topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|&p| (t.name.0.to_string(), p)))
            .collect();
        txn::add_partitions(
            &ctx.shard,
            req.v3_and_below_transactional_id.0.to_string(),
            req.v3_and_below_producer_id.0,
            req.v3_and_below_producer_epoch,
            partitions,
        )
        .await
    };
    let code = |topic: &str, p: i32| match &answer {
        Err(BrokerError::OperationNotAttempted) if unknown(topic, p) => {
            BrokerError::UnknownTopicOrPartition.code()
        }
        // PRODUCER_FENCED is new in v2.
        Err(e) => e.code_for(ctx.version, 2),
        Ok(()) => 0,
    };
    let results = req
        .v3_and_below_topics
        .iter()
        .map(|t| {
            AddPartitionsToTxnTopicResult::default()
                .with_name(t.name.clone())
                .with_results_by_partition(
                    t.partitions
                        .iter()
                        .map(|&p| {
                            AddPartitionsToTxnPartitionResult::default()
                                .with_partition_index(p)
                                .with_partition_error_code(code(&t.name, p))
                        })
                        .collect(),
                )
        })
        .collect();
    AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results)
}
