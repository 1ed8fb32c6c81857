//! One partition on the shard that owns it: its log, its idempotent-producer state, and the
//! Kafka rules for appending and reading (validation, offsets, HW). It writes and learns its
//! HW and leader epoch through its `Replication` (local or Raft), the same way for both.
//! Everything here runs on the owning shard; the synchronous part of `append` runs in the
//! order requests arrived in.

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use ferrolog_io::batch::{self, BatchError, BatchHeader, ATTR_TIMESTAMP_LOG_APPEND};
use ferrolog_io::{AbortedTxn, Log, LogError};
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use uuid::Uuid;

use crate::config::TopicSettings;
use crate::errors::BrokerError;
use crate::group::OffsetsLog;
use crate::producer_state::{marker_batch, Marker, ProducerStates, SequenceCheck};
use crate::read_ahead::ReadAhead;
use crate::records::{self, RecordError, TimestampPolicy};
use crate::replication::{AppendStep, Opened, Placement, Replication};

/// What a successful produce to one partition returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub base_offset: i64,
    /// Offset after the batch: wait for it to be durable before acks=all answers.
    pub end_offset: i64,
    /// LogAppendTime topics: the time the broker stamped; otherwise -1.
    pub log_append_time_ms: i64,
    /// A retried batch that was already written: nothing new to wait for.
    pub duplicate: bool,
}

impl Appended {
    /// A retry of `header`'s batch, which the producer state holds at `base_offset` with
    /// max timestamp `timestamp`: Kafka answers a duplicate with the stored batch's max
    /// timestamp, whatever the topic's timestamp type.
    pub fn duplicate(header: &BatchHeader, base_offset: i64, timestamp: i64) -> Appended {
        Appended {
            base_offset,
            end_offset: base_offset + i64::from(header.last_offset_delta) + 1,
            log_append_time_ms: timestamp,
            duplicate: true,
        }
    }
}

/// The coordinator's view of an offsets partition (`group::OffsetsLog`).
impl OffsetsLog for Partition {
    fn is_leader(&self) -> bool {
        Partition::is_leader(self)
    }
    fn leader_epoch(&self) -> i32 {
        Partition::leader_epoch(self)
    }
    fn read_lease(&self) -> LocalBoxFuture<'_, Result<(), BrokerError>> {
        Partition::read_lease(self).boxed_local()
    }
    fn high_watermark(&self) -> i64 {
        Partition::high_watermark(self)
    }
    fn log_start(&self) -> i64 {
        Partition::log_start(self)
    }
    fn stored_start(&self) -> i64 {
        self.log.start_offset()
    }
    fn log_end(&self) -> i64 {
        self.log.end_offset()
    }
    fn move_log_start(
        &self,
        offset: i64,
        now_ms: i64,
    ) -> LocalBoxFuture<'_, Result<i64, BrokerError>> {
        Partition::move_log_start(self, offset, now_ms).boxed_local()
    }
    fn read_committed(
        &self,
        offset: i64,
        max_bytes: usize,
    ) -> LocalBoxFuture<'_, Result<Bytes, BrokerError>> {
        async move { Ok(self.read(offset, max_bytes, true, false).await?.records) }.boxed_local()
    }
    fn append_batch(
        self: &Rc<Self>,
        batch: &Bytes,
        now_ms: i64,
    ) -> LocalBoxFuture<'static, Result<Appended, BrokerError>> {
        let written = self.append(batch, false, None, now_ms);
        let partition = self.clone();
        async move { written?.finish(&partition.log, true).await }.boxed_local()
    }
}

/// A fetch result for one partition.
#[derive(Debug, Clone)]
pub struct ReadResult {
    pub records: Bytes,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    /// read_committed: the aborted transactions among `records`.
    pub aborted: Option<Vec<AbortedTxn>>,
}

pub struct Partition {
    pub topic: String,
    pub topic_id: Uuid,
    pub index: i32,
    pub log: Rc<Log>,
    settings: RefCell<TopicSettings>,
    producers: RefCell<ProducerStates>,
    pub replication: Replication,
    read_ahead: ReadAhead,
}

impl Partition {
    /// Opens the partition's directory under `base_dir` (claimed for `topic_id`), its log
    /// and its replication as `placement` says (`Replication::open`).
    pub async fn open(
        base_dir: &Path,
        topic: &str,
        topic_id: Uuid,
        index: i32,
        settings: TopicSettings,
        placement: Placement<'_>,
        now_ms: i64,
    ) -> Result<Rc<Partition>, LogError> {
        let dir = base_dir.join(format!("{topic}-{index}"));
        claim_directory(&dir, topic_id).await?;
        let Opened {
            log,
            replication,
            producers,
        } = Replication::open(dir, settings.log_config(), placement, now_ms).await?;
        Ok(Rc::new(Partition {
            topic: topic.to_string(),
            topic_id,
            index,
            log,
            settings: RefCell::new(settings),
            producers: RefCell::new(producers),
            replication,
            read_ahead: ReadAhead::default(),
        }))
    }

    /// Kafka's leader epoch: the Raft term of a replicated partition, 0 otherwise.
    pub fn leader_epoch(&self) -> i32 {
        self.replication.leader_epoch()
    }

    /// Resolves the next time the HW may have moved.
    pub fn hw_changed(&self) -> futures::channel::oneshot::Receiver<()> {
        self.replication.hw_changed()
    }

    /// OffsetForLeaderEpoch on the leader: Kafka's fencing of the caller's current epoch,
    /// then (largest epoch <= `requested`, offset after it), or (-1, -1) when unknown.
    pub fn epoch_end_offset(
        &self,
        current_leader_epoch: i32,
        requested: i32,
    ) -> Result<(i32, i64), BrokerError> {
        let epoch = self.check_leader(current_leader_epoch)?;
        if requested == epoch {
            return Ok((epoch, self.log.end_offset()));
        }
        if requested > epoch {
            return Ok((-1, -1));
        }
        Ok(self
            .replication
            .end_offset_for_epoch(requested)
            .unwrap_or((-1, -1)))
    }

    /// Checks, as Kafka does for Fetch, ListOffsets and OffsetForLeaderEpoch, the leader
    /// epoch a client says it knows (-1: it does not say) against this replica's, then that
    /// this replica leads; returns the epoch. An older epoch is FENCED_LEADER_EPOCH (the
    /// client must refresh its metadata), a newer one UNKNOWN_LEADER_EPOCH (this replica has
    /// not caught up with the election yet).
    pub fn check_leader(&self, current_leader_epoch: i32) -> Result<i32, BrokerError> {
        let epoch = self.leader_epoch();
        if current_leader_epoch > epoch {
            return Err(BrokerError::UnknownLeaderEpoch);
        }
        if current_leader_epoch >= 0 && current_leader_epoch < epoch {
            return Err(BrokerError::FencedLeaderEpoch);
        }
        if !self.is_leader() {
            return Err(BrokerError::NotLeaderOrFollower);
        }
        Ok(epoch)
    }

    /// `check_leader`, and that the leader holds a current lease (`Replica::read_lease`):
    /// what Fetch and ListOffsets check before they answer. (OffsetForLeaderEpoch checks the
    /// leader only.)
    pub async fn check_read(&self, current_leader_epoch: i32) -> Result<i32, BrokerError> {
        let epoch = self.check_leader(current_leader_epoch)?;
        self.read_lease().await?;
        Ok(epoch)
    }

    /// A current lease to answer reads with.
    pub async fn read_lease(&self) -> Result<(), BrokerError> {
        self.replication.read_lease().await
    }

    /// Whether this replica serves produce and consumer fetches.
    pub fn is_leader(&self) -> bool {
        self.replication.is_leader()
    }

    /// How many replicas are in sync (as the leader sees it).
    pub fn in_sync_replicas(&self) -> usize {
        self.replication.in_sync_replicas()
    }

    pub fn settings(&self) -> TopicSettings {
        self.settings.borrow().clone()
    }

    pub fn set_settings(&self, settings: TopicSettings) {
        self.log.set_config(settings.log_config());
        *self.settings.borrow_mut() = settings;
    }

    /// HW: offset after the last committed batch.
    pub fn high_watermark(&self) -> i64 {
        self.replication.high_watermark()
    }

    /// Moves the log start to `offset`, at or below the HW, and returns it
    /// (`Replication::move_log_start`).
    pub async fn move_log_start(&self, offset: i64, now_ms: i64) -> Result<i64, BrokerError> {
        self.replication
            .move_log_start(&self.log, &self.producers, offset, now_ms)
            .await
    }

    /// The log start clients see (`Replication::log_start`): records below it are deleted,
    /// whether or not this replica's log has dropped them yet.
    pub fn log_start(&self) -> i64 {
        self.replication.log_start(&self.log)
    }

    /// Applies retention (`Replication::apply_retention`); None: nothing to do.
    pub async fn apply_retention(&self, now_ms: i64, full: bool) -> Option<std::io::Result<()>> {
        let settings = self.settings();
        self.replication
            .apply_retention(&self.log, &settings, now_ms, full)
            .await
    }

    /// Validates one produced batch and appends it. Synchronous: the caller awaits what acks
    /// asks for separately (`AppendStep::finish`). `transactional_id` tells whether the
    /// request named one (Kafka checks it before it looks at transactional batches); a
    /// transactional batch that opens a transaction here must carry the guard of its
    /// verification (`verification_guard`).
    pub fn append(
        &self,
        records: &Bytes,
        transactional_id: bool,
        guard: Option<u64>,
        now_ms: i64,
    ) -> Result<AppendStep, BrokerError> {
        if let Some(e) = self.log.failure() {
            return Err(BrokerError::Storage(e.to_string()));
        }
        self.replication
            .ready(&self.producers, self.log.end_offset())?;
        let settings = self.settings.borrow().clone();
        // Kafka answers INVALID_RECORD for anything that is not one whole v2 batch, and
        // CORRUPT_MESSAGE only for a CRC mismatch.
        let header =
            BatchHeader::parse(records).map_err(|e| BrokerError::InvalidRecord(e.to_string()))?;
        if header.total_bytes() > settings.max_message_bytes {
            return Err(BrokerError::MessageTooLarge(format!(
                "batch of {} bytes exceeds max.message.bytes={}",
                header.total_bytes(),
                settings.max_message_bytes
            )));
        }
        let header = batch::verify(records).map_err(|e| match e {
            BatchError::CrcMismatch { .. } => BrokerError::CorruptMessage(e.to_string()),
            other => BrokerError::InvalidRecord(other.to_string()),
        })?;
        if header.total_bytes() != records.len() {
            return Err(BrokerError::InvalidRecord(
                "produce requests must carry exactly one record batch per partition".into(),
            ));
        }
        if header.is_control() {
            return Err(BrokerError::InvalidRecord(
                "control batches are written by the broker only".into(),
            ));
        }
        if header.is_transactional() {
            if !transactional_id {
                return Err(BrokerError::TransactionalIdAuthorizationFailed);
            }
            if !header.has_producer_id() || header.base_sequence < 0 {
                return Err(BrokerError::InvalidRecord(
                    "a transactional batch needs a producer id and sequence".into(),
                ));
            }
        }
        let policy = TimestampPolicy {
            compacted: settings.compacted,
            log_append_time: settings.log_append_time,
            before_max_ms: settings.timestamp_before_max_ms,
            after_max_ms: settings.timestamp_after_max_ms,
            now_ms,
        };
        if header.record_count < 1 || header.last_offset_delta != header.record_count - 1 {
            // Kafka: a v2 batch's offsets must be exactly 0..count-1.
            return Err(BrokerError::InvalidRecord(format!(
                "batch has {} records but last offset delta {}",
                header.record_count, header.last_offset_delta
            )));
        }
        let max_timestamp = records::validate(&header, records, &policy).map_err(|e| match e {
            RecordError::Timestamp { index, .. } => BrokerError::RecordErrors {
                timestamp: true,
                message: "One or more records have been rejected due to invalid timestamp".into(),
                records: vec![(index, e.to_string())],
            },
            RecordError::MissingKey { index } => {
                let reason = format!(
                    "Compacted topic cannot accept message without key in topic partition {}-{}.",
                    self.topic, self.index
                );
                BrokerError::RecordErrors {
                    timestamp: false,
                    message: format!(
                        "One or more records have been rejected due to 1 record errors in total, and only showing the first three errors at most: [{reason}]"
                    ),
                    records: vec![(index, reason)],
                }
            }
            RecordError::UnknownCodec(_) => BrokerError::CorruptMessage(e.to_string()),
            RecordError::Invalid(m) => BrokerError::InvalidRecord(m),
        })?;
        match self.producers.borrow().check(&header) {
            SequenceCheck::Accept => {}
            SequenceCheck::Duplicate {
                base_offset,
                timestamp,
            } => {
                let appended = Appended::duplicate(&header, base_offset, timestamp);
                // Raft: the batch may be proposed but not yet committed, and is answered
                // once this very batch is (`Replication::duplicate`).
                return Ok(self.replication.duplicate(&header, appended));
            }
            // Only once a Raft leader shows it still leads (`Replication::out_of_order`).
            SequenceCheck::OutOfOrder => return Ok(self.replication.out_of_order()),
            SequenceCheck::StaleEpoch => return Err(BrokerError::InvalidProducerEpoch),
            SequenceCheck::TxnOpen => return Err(BrokerError::InvalidTxnState),
        }
        if header.is_transactional() && !self.producers.borrow().verified(&header, guard) {
            // Not verified with the coordinator, or a marker came since: the batch would open
            // a transaction the coordinator does not know of, which nothing would close.
            return Err(BrokerError::InvalidTxnState);
        }
        let mut bytes = BytesMut::from(&records[..]);
        let log_append_time_ms = if settings.log_append_time {
            restamp(&mut bytes, ATTR_TIMESTAMP_LOG_APPEND, now_ms);
            now_ms
        } else {
            // Retention and time lookups use the header's max timestamp; like Kafka, take it
            // from the records rather than trusting the producer.
            if max_timestamp != header.max_timestamp {
                restamp(&mut bytes, 0, max_timestamp);
            }
            -1
        };
        self.replication
            .append(&self.producers, bytes, &header, log_append_time_ms, now_ms)
    }

    /// Before a transactional batch of `producer_id` opens a transaction here, its
    /// coordinator is asked whether this partition is in it (KIP-890 part 1); the guard
    /// returned goes with the batch (`append`). None: a transaction of the producer is open
    /// here already, nothing to ask.
    pub fn verification_guard(&self, producer_id: i64) -> Result<Option<u64>, BrokerError> {
        self.ready_to_write()?;
        Ok(self.producers.borrow_mut().verification_guard(producer_id))
    }

    /// What a coordinator's write checks first: the log has not failed, this replica leads,
    /// and may take writes now (`Replication::ready`).
    fn ready_to_write(&self) -> Result<(), BrokerError> {
        if let Some(e) = self.log.failure() {
            return Err(BrokerError::Storage(e.to_string()));
        }
        if !self.is_leader() {
            return Err(BrokerError::NotLeaderOrFollower);
        }
        self.replication
            .ready(&self.producers, self.log.end_offset())
    }

    /// Writes a transaction marker the coordinator asks for (WriteTxnMarkers): a control
    /// batch of the producer that closes its open transaction here, through the same
    /// replicated append as produced batches. Refused for an older producer epoch
    /// (INVALID_PRODUCER_EPOCH) or coordinator epoch (TRANSACTION_COORDINATOR_FENCED).
    pub fn append_marker(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        marker: Marker,
        now_ms: i64,
    ) -> Result<AppendStep, BrokerError> {
        self.ready_to_write()?;
        self.producers.borrow().check_marker(
            producer_id,
            producer_epoch,
            marker.coordinator_epoch,
        )?;
        let bytes = marker_batch(producer_id, producer_epoch, marker, now_ms);
        let header = BatchHeader::parse(&bytes).expect("a marker batch parses");
        self.replication
            .append(&self.producers, bytes, &header, -1, now_ms)
    }

    /// Appends a transactional batch a coordinator writes for a producer (the offsets of a
    /// TxnOffsetCommit in `__consumer_offsets`): it opens the producer's transaction here like
    /// a produced one, but has no sequence; only the producer's epoch is checked.
    pub fn append_txn_records(
        &self,
        bytes: &Bytes,
        guard: Option<u64>,
        now_ms: i64,
    ) -> Result<AppendStep, BrokerError> {
        self.ready_to_write()?;
        let header =
            BatchHeader::parse(bytes).map_err(|e| BrokerError::InvalidRecord(e.to_string()))?;
        assert!(
            header.is_transactional(),
            "a producer's transactional batch"
        );
        self.producers
            .borrow()
            .check_epoch(header.producer_id, header.producer_epoch)?;
        if !self.producers.borrow().verified(&header, guard) {
            // A marker came since its verification (`verification_guard`).
            return Err(BrokerError::InvalidTxnState);
        }
        self.replication.append(
            &self.producers,
            BytesMut::from(&bytes[..]),
            &header,
            -1,
            now_ms,
        )
    }

    /// Its producers, as DescribeProducers lists them (any replica answers, as in Kafka).
    pub fn active_producers(&self) -> Vec<crate::producer_state::ActiveProducer> {
        self.replication.active_producers(&self.producers)
    }

    /// The last stable offset (LSO): read_committed consumers read below it. The HW, or the
    /// first offset of a transaction not yet closed and committed, if lower (never below the
    /// log start).
    pub fn last_stable_offset(&self) -> i64 {
        let hw = self.high_watermark();
        match self.replication.first_unstable(&self.producers, hw) {
            Some(first) => first.max(self.log_start()).min(hw),
            None => hw,
        }
    }

    /// Reads from `offset` up to the HW, or up to the LSO when `read_committed` (which also
    /// returns the aborted transactions of what it read); `first_in_response`: the first
    /// batch may exceed `max_bytes` (KIP-74), otherwise an oversized batch is left for a
    /// later fetch. Takes what a read ahead found there, and starts the next one
    /// (`read_ahead`).
    pub async fn read(
        &self,
        offset: i64,
        max_bytes: usize,
        first_in_response: bool,
        read_committed: bool,
    ) -> Result<ReadResult, BrokerError> {
        // Consumers read from the leader (no KIP-392 follower fetching).
        if !self.is_leader() {
            return Err(BrokerError::NotLeaderOrFollower);
        }
        let hw = self.high_watermark();
        let lso = self.last_stable_offset();
        let upper = if read_committed { lso } else { hw };
        let log_start = self.log_start();
        if offset < log_start {
            return Err(BrokerError::OffsetOutOfRange);
        }
        // A read ahead from `offset` holds what a read to the HW would return (committed
        // records, whole batches from `offset`), or less: it stopped at the HW of its time.
        let ahead =
            match upper == hw {
                true => self.read_ahead.take(offset).await.map(|records| {
                    records::leading_batches(&records, max_bytes, first_in_response)
                }),
                false => None,
            };
        let records = match ahead {
            Some(records) if !records.is_empty() => records,
            _ => self
                .log
                .read(offset, max_bytes, upper, first_in_response)
                .await
                .map_err(BrokerError::from_log)?,
        };
        self.read_ahead
            .after_read(&self.log, offset, &records, max_bytes, upper);
        let aborted = read_committed.then(|| {
            let end = records::next_offset(&records).unwrap_or(offset);
            self.log.aborted_txns(offset, end)
        });
        Ok(ReadResult {
            records,
            high_watermark: hw,
            last_stable_offset: lso,
            log_start_offset: log_start,
            aborted,
        })
    }

    /// ListOffsets by timestamp: the first record with timestamp >= `timestamp`, as
    /// (offset, timestamp), or None when every record is older.
    pub async fn offset_for_timestamp(
        &self,
        timestamp: i64,
        read_committed: bool,
    ) -> Result<Option<(i64, i64)>, BrokerError> {
        let hw = match read_committed {
            true => self.last_stable_offset(),
            false => self.high_watermark(),
        };
        let Some(batch_bytes) = self
            .log
            .find_batch_by_timestamp(timestamp, hw)
            .await
            .map_err(BrokerError::from_log)?
        else {
            return Ok(None);
        };
        let header =
            BatchHeader::parse(&batch_bytes).map_err(|e| BrokerError::Storage(e.to_string()))?;
        if header.attributes & ATTR_TIMESTAMP_LOG_APPEND != 0 {
            return Ok(Some((header.base_offset, header.max_timestamp)));
        }
        let mut found = None;
        records::for_each_record(&header, &batch_bytes, |r| {
            if found.is_none() && r.timestamp >= timestamp {
                found = Some((header.base_offset + r.offset_delta, r.timestamp));
            }
            Ok(())
        })
        .map_err(|e| BrokerError::Storage(format!("stored batch does not decode: {e}")))?;
        Ok(found.or(Some((header.base_offset, header.max_timestamp))))
    }

    /// ListOffsets -3 (KIP-734): the offset of the record with the largest timestamp.
    pub async fn max_timestamp_offset(&self) -> Result<Option<(i64, i64)>, BrokerError> {
        let Some((max_ts, batch_offset)) = self.log.max_timestamp() else {
            return Ok(None);
        };
        let hw = self.high_watermark();
        let bytes = self
            .log
            .read(batch_offset, 1, hw, true)
            .await
            .map_err(BrokerError::from_log)?;
        if bytes.is_empty() {
            return Ok(None);
        }
        let header = BatchHeader::parse(&bytes).map_err(|e| BrokerError::Storage(e.to_string()))?;
        if header.attributes & ATTR_TIMESTAMP_LOG_APPEND != 0 {
            // Every record carries the append time; Kafka names the first.
            return Ok(Some((header.base_offset, max_ts)));
        }
        let mut found = (header.base_offset, max_ts);
        let mut best = i64::MIN;
        records::for_each_record(&header, &bytes, |r| {
            if r.timestamp > best {
                best = r.timestamp;
                found = (header.base_offset + r.offset_delta, r.timestamp);
            }
            Ok(())
        })
        .map_err(|e| BrokerError::Storage(format!("stored batch does not decode: {e}")))?;
        Ok(Some(found))
    }
}

/// Makes sure `dir` belongs to this topic id, as Kafka's `partition.metadata` does: a
/// directory left by a deleted topic of the same name (a crash between deleting the topic and
/// its files) is removed instead of being adopted by the new topic.
async fn claim_directory(dir: &Path, topic_id: Uuid) -> Result<(), LogError> {
    let marker = dir.join("partition.metadata");
    let expected = format!("version: 0\ntopic_id: {topic_id}\n");
    match std::fs::read_to_string(&marker) {
        Ok(found) if found == expected => return Ok(()),
        Ok(found) => {
            tracing::warn!(dir = %dir.display(), %found, "partition directory of a deleted topic; removing it");
            std::fs::remove_dir_all(dir)
                .map_err(|e| LogError::Io(format!("removing {}: {e}", dir.display())))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(LogError::Io(format!("reading {}: {e}", marker.display()))),
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| LogError::Io(format!("creating {}: {e}", dir.display())))?;
    ferrolog_io::write_file(&marker, expected.into_bytes()).await
}

/// Sets attribute bits and the max timestamp, which the CRC covers, and recomputes the CRC:
/// for LogAppendTime topics, and when a producer's header disagrees with its records. The
/// only places a stored batch differs from what the producer sent beyond offset and epoch.
fn restamp(batch_bytes: &mut [u8], attributes_or: i16, max_timestamp: i64) {
    const ATTRIBUTES: usize = 21;
    const MAX_TIMESTAMP: usize = 35;
    const CRC: usize = 17;
    let attrs =
        i16::from_be_bytes([batch_bytes[ATTRIBUTES], batch_bytes[ATTRIBUTES + 1]]) | attributes_or;
    batch_bytes[ATTRIBUTES..ATTRIBUTES + 2].copy_from_slice(&attrs.to_be_bytes());
    batch_bytes[MAX_TIMESTAMP..MAX_TIMESTAMP + 8].copy_from_slice(&max_timestamp.to_be_bytes());
    let crc = batch::compute_crc(batch_bytes);
    batch_bytes[CRC..CRC + 4].copy_from_slice(&crc.to_be_bytes());
    assert!(
        batch::verify(batch_bytes).is_ok(),
        "re-stamped batch must verify"
    );
}
