//! Produce (API 0): validate and append each partition's batch on its owning shard, then
//! answer per `acks`: 0 no response, 1 once appended, -1 (all) once fsynced (the HW covers it).

use std::rc::Rc;

use futures::future::{join_all, LocalBoxFuture};
use futures::FutureExt;
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::StrBytes;

use crate::errors::BrokerError;
use crate::kafka::RequestContext;
use crate::partition::Appended;
use crate::types::{now_ms, TopicPartition};

type PartitionResult = Result<(Appended, i64), BrokerError>;

/// Bytes a partition may hold appended but not yet on disk before acks=0/1 answers wait for
/// the disk too: the producer then slows down instead of the broker buffering without bound.
const PENDING_BYTES_MAX: usize = 64 << 20;

/// Appends now (in request order); the returned future completes the response.
pub async fn start(
    ctx: Rc<RequestContext>,
    req: ProduceRequest,
) -> LocalBoxFuture<'static, Option<ProduceResponse>> {
    let acks = req.acks;
    let transactional = req.transactional_id.is_some();
    let image = ctx.shard.image();
    let now = now_ms();
    let mut topics = Vec::with_capacity(req.topic_data.len());
    for topic in req.topic_data {
        // Produce v13 names topics by id (KIP-516).
        let name = if ctx.version >= 13 {
            image.topic_by_id(&topic.topic_id).map(|t| t.name.clone())
        } else {
            Some(topic.name.0.to_string())
        };
        let mut parts = Vec::with_capacity(topic.partition_data.len());
        for p in topic.partition_data {
            let result: LocalBoxFuture<'static, PartitionResult> = match (&name, acks) {
                (_, a) if !(a == -1 || a == 0 || a == 1) => {
                    async { Err(BrokerError::InvalidRequiredAcks) }.boxed_local()
                }
                (None, _) if ctx.version >= 13 => {
                    async { Err(BrokerError::UnknownTopicId) }.boxed_local()
                }
                (None, _) => async { Err(BrokerError::UnknownTopicOrPartition) }.boxed_local(),
                (Some(name), _) => {
                    let tp = TopicPartition {
                        topic: name.clone(),
                        partition: p.index,
                    };
                    let records = p.records.unwrap_or_default();
                    // The owning shard appends as soon as the job arrives, so jobs sent in
                    // order append in order; the durability wait happens afterwards.
                    let shard = ctx.shard.clone();
                    let appended = async move {
                        shard
                            .on_partition(tp, move |partition| {
                                let appended = partition.append(&records, transactional, now);
                                async move {
                                    let appended = appended?;
                                    let backlog = partition.log.pending_bytes() > PENDING_BYTES_MAX;
                                    if (acks == -1 || backlog) && !appended.duplicate {
                                        partition
                                            .log
                                            .wait_durable(appended.end_offset)
                                            .await
                                            .map_err(|e| BrokerError::Storage(e.to_string()))?;
                                    }
                                    Ok((appended, partition.log.start_offset()))
                                }
                                .boxed_local()
                            })
                            .await
                    };
                    appended.boxed_local()
                }
            };
            parts.push((p.index, spawn_now(result)));
        }
        topics.push((topic.name, topic.topic_id, parts));
    }
    async move {
        let mut responses = Vec::with_capacity(topics.len());
        for (name, topic_id, parts) in topics {
            let indexes: Vec<i32> = parts.iter().map(|(i, _)| *i).collect();
            let results = join_all(parts.into_iter().map(|(_, r)| r)).await;
            let partition_responses = indexes
                .into_iter()
                .zip(results)
                .map(|(index, r)| partition_response(index, r))
                .collect();
            responses.push(
                TopicProduceResponse::default()
                    .with_name(name)
                    .with_topic_id(topic_id)
                    .with_partition_responses(partition_responses),
            );
        }
        if acks == 0 {
            return None;
        }
        Some(ProduceResponse::default().with_responses(responses))
    }
    .boxed_local()
}

/// Starts the per-partition work at once (so the append job is sent now, in order) and
/// returns a handle to its result.
fn spawn_now(
    f: LocalBoxFuture<'static, PartitionResult>,
) -> glommio::task::JoinHandle<PartitionResult> {
    glommio::spawn_local(f).detach()
}

fn partition_response(index: i32, r: Option<PartitionResult>) -> PartitionProduceResponse {
    let r = r.unwrap_or_else(|| Err(BrokerError::Storage("append task was cancelled".into())));
    match r {
        Ok((appended, log_start)) => PartitionProduceResponse::default()
            .with_index(index)
            .with_base_offset(appended.base_offset)
            .with_log_append_time_ms(appended.log_append_time_ms)
            .with_log_start_offset(log_start),
        Err(e) => {
            if matches!(e, BrokerError::Storage(_)) {
                tracing::warn!(partition = index, error = %e, "produce failed with a storage error");
            }
            // Kafka sets error_message and record_errors only for per-record errors (KIP-467).
            let (message, record_errors) = match &e {
                BrokerError::RecordErrors {
                    message, records, ..
                } => (
                    Some(StrBytes::from_string(message.clone())),
                    records
                        .iter()
                        .map(|(i, m)| {
                            BatchIndexAndErrorMessage::default()
                                .with_batch_index(*i)
                                .with_batch_index_error_message(Some(StrBytes::from_string(
                                    m.clone(),
                                )))
                        })
                        .collect(),
                ),
                _ => (None, Vec::new()),
            };
            PartitionProduceResponse::default()
                .with_record_errors(record_errors)
                .with_index(index)
                .with_error_code(e.code())
                .with_base_offset(-1)
                .with_log_append_time_ms(-1)
                .with_log_start_offset(-1)
                .with_error_message(message)
        }
    }
}
