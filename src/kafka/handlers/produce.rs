//! Produce (API 0): validate and append each partition's batch on its owning shard, then
//! answer per `acks`: 0 no response, 1 once appended, -1 (all) once fsynced (the HW covers it).

use std::rc::Rc;

use futures::channel::oneshot;
use futures::future::{join_all, LocalBoxFuture};
use futures::FutureExt;
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::StrBytes;

use crate::errors::BrokerError;
use crate::group::is_internal_topic;
use crate::kafka::dispatch::Reply;
use crate::kafka::RequestContext;
use crate::partition::Appended;
use crate::shard::Shard;
use crate::types::{now_ms, TopicPartition};

type PartitionResult = Result<(Appended, i64), BrokerError>;

/// Bytes a partition may hold appended but not yet on disk before acks=0/1 answers wait for
/// the disk too: the producer then slows down instead of the broker buffering without bound.
const PENDING_BYTES_MAX: usize = 64 << 20;

/// Queues each partition's append on its owning shard, in request order (the connection
/// awaits `start` before reading the next request, so appends keep request order); the
/// returned future completes the response.
pub async fn start(
    ctx: Rc<RequestContext>,
    req: ProduceRequest,
) -> LocalBoxFuture<'static, Reply<ProduceResponse>> {
    let acks = req.acks;
    let transactional_id = req.transactional_id.as_ref().map(|id| id.0.to_string());
    let transactional = transactional_id.is_some();
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
        let mut parts: Vec<(i32, Pending)> = Vec::with_capacity(topic.partition_data.len());
        for p in topic.partition_data {
            let owner = match (&name, acks) {
                (_, a) if !(a == -1 || a == 0 || a == 1) => Err(BrokerError::InvalidRequiredAcks),
                (None, _) if ctx.version >= 13 => Err(BrokerError::UnknownTopicId),
                (None, _) => Err(BrokerError::UnknownTopicOrPartition),
                // Only the coordinators write their internal topics.
                (Some(name), _) if is_internal_topic(name) => Err(BrokerError::InvalidTopic(
                    format!("Cannot append to internal topic {name}"),
                )),
                (Some(name), _) => {
                    let tp = TopicPartition {
                        topic: name.clone(),
                        partition: p.index,
                    };
                    ctx.shard.owner_of(&image, &tp).map(|owner| (owner, tp))
                }
            };
            let records = p.records.unwrap_or_default();
            // A transactional batch that opens a transaction on its partition is first
            // verified with the transaction coordinator (KIP-890 part 1).
            let guard = match (&owner, &transactional_id) {
                (Ok((owner, tp)), Some(id)) => verify(&ctx, *owner, tp, id, &records).await,
                _ => Ok(None),
            };
            let pending = match owner.and_then(|o| guard.map(|g| (o, g))) {
                Err(e) => Pending::Done(Err(e)),
                Ok(((owner, tp), guard)) => {
                    let job = move |shard: &Rc<Shard>| -> LocalBoxFuture<'static, PartitionResult> {
                        let Some(partition) = shard.partition(&tp) else {
                            return async { Err(BrokerError::UnknownTopicOrPartition) }
                                .boxed_local();
                        };
                        // The append itself happens here, synchronously, when the job runs.
                        let min_isr = partition.settings().min_insync_replicas;
                        let appended = if !partition.is_leader() {
                            Err(BrokerError::NotLeaderOrFollower)
                        } else if acks == -1
                            && (partition.in_sync_replicas() as i64) < i64::from(min_isr)
                        {
                            // Fewer replicas in sync than min.insync.replicas.
                            Err(BrokerError::NotEnoughReplicas)
                        } else {
                            partition.append(&records, transactional, guard, now)
                        };
                        async move {
                            // acks=all waits for the HW (unreplicated: fsync; replicated:
                            // commit on a majority), also for a retried duplicate, which may
                            // not be there yet either; acks=1 on a replicated partition for
                            // the leader's own log (`AppendStep::finish`).
                            let backlog = partition.log.pending_bytes() > PENDING_BYTES_MAX;
                            let appended = appended?
                                .finish(&partition.log, acks == -1 || backlog)
                                .await?;
                            Ok((appended, partition.log_start()))
                        }
                        .boxed_local()
                    };
                    Pending::Queued(ctx.shard.submit(owner, job).await)
                }
            };
            parts.push((p.index, pending));
        }
        topics.push((topic.name, topic.topic_id, parts));
    }
    async move {
        let mut responses = Vec::with_capacity(topics.len());
        for (name, topic_id, parts) in topics {
            let indexes: Vec<i32> = parts.iter().map(|(i, _)| *i).collect();
            let results = join_all(parts.into_iter().map(|(_, r)| r.result())).await;
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
            let failed = responses
                .iter()
                .flat_map(|t| &t.partition_responses)
                .any(|p| p.error_code != 0);
            return if failed { Reply::Close } else { Reply::Nothing };
        }
        Reply::Send(ProduceResponse::default().with_responses(responses))
    }
    .boxed_local()
}

/// KIP-890 part 1 for the batch `records` of a request with transactional id `id` to `tp`
/// (owned by shard `owner`): when it is transactional and no transaction of its producer is
/// open on the partition, asks the coordinator whether the partition is in the producer's
/// transaction, and returns the guard to append it with. Kafka's answers to a producer:
/// INVALID_TXN_STATE when it is not, INVALID_PRODUCER_EPOCH when the producer is fenced, and
/// NOT_ENOUGH_REPLICAS (retriable) when the coordinator cannot say now.
async fn verify(
    ctx: &Rc<RequestContext>,
    owner: crate::types::ShardId,
    tp: &TopicPartition,
    id: &str,
    records: &bytes::Bytes,
) -> Result<Option<u64>, BrokerError> {
    let Ok(header) = ferrolog_io::batch::BatchHeader::parse(records) else {
        return Ok(None); // refused by the append
    };
    if !header.is_transactional() || header.is_control() || !header.has_producer_id() {
        return Ok(None);
    }
    let producer_id = header.producer_id;
    let at = tp.clone();
    let guard = ctx
        .shard
        .invoke_on(owner, move |s| {
            let guard = match s.partition(&at) {
                Some(p) => p.verification_guard(producer_id),
                None => Err(BrokerError::UnknownTopicOrPartition),
            };
            async move { guard }.boxed_local()
        })
        .await?;
    let Some(guard) = guard else {
        return Ok(None);
    };
    let verified = crate::txn::verify(
        &ctx.shard,
        id.to_string(),
        producer_id,
        header.producer_epoch,
        (tp.topic.clone(), tp.partition),
    )
    .await;
    match verified {
        Ok(()) => Ok(Some(guard)),
        Err(e) => Err(match e.code() {
            c if c == BrokerError::InvalidTxnState.code() => BrokerError::InvalidTxnState,
            c if c == BrokerError::ProducerFenced.code()
                || c == BrokerError::InvalidProducerEpoch.code() =>
            {
                BrokerError::InvalidProducerEpoch
            }
            c if c == BrokerError::InvalidProducerIdMapping.code() => {
                BrokerError::InvalidProducerIdMapping
            }
            _ => BrokerError::NotEnoughReplicas,
        }),
    }
}

/// One partition's outcome: known at once (an error before any append) or coming from the
/// owning shard.
enum Pending {
    Done(PartitionResult),
    Queued(oneshot::Receiver<PartitionResult>),
}

impl Pending {
    async fn result(self) -> PartitionResult {
        match self {
            Pending::Done(r) => r,
            Pending::Queued(rx) => rx
                .await
                .unwrap_or_else(|_| Err(BrokerError::Storage("append job was dropped".into()))),
        }
    }
}

fn partition_response(index: i32, r: PartitionResult) -> PartitionProduceResponse {
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
