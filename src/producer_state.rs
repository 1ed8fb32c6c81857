//! Producer state of one partition (KIP-98): per producer id, its epoch, the last five
//! batches it wrote (so retries are recognised and gaps are refused), and its open
//! transaction, which holds the partition's last stable offset (LSO) back.
//!
//! The rules follow Kafka 4.1's `ProducerAppendInfo`: an older epoch is fenced
//! (INVALID_PRODUCER_EPOCH); a new epoch must start at sequence 0; within an epoch each batch
//! must follow the last one (wrapping at `i32::MAX`); a producer with no state here may start
//! anywhere; a batch equal to one of the last five is a duplicate and is answered with the
//! offset it got the first time. A transactional batch opens the producer's transaction here
//! if none is open; a non-transactional one while it is open is INVALID_TXN_STATE. A
//! transaction marker (a control batch the coordinator has written, `marker_batch`) closes
//! it: a marker of an older producer epoch is INVALID_PRODUCER_EPOCH, one of an older
//! coordinator epoch TRANSACTION_COORDINATOR_FENCED. A closed transaction holds the LSO back
//! until the high watermark passes its marker.

use std::collections::{BTreeMap, HashMap, VecDeque};

use bytes::{Buf, BufMut};
use serde::{Deserialize, Serialize};

use ferrolog_io::batch::{self, BatchHeader};
use ferrolog_io::AbortedTxn;

/// The version of `ProducerStates::encode` (a Raft snapshot's partition state tells its own
/// layout from this one by it: `replication::raft::SnapshotState`). Version 1 had no
/// transactions, and is still read.
pub(crate) const STATE_VERSION: u8 = 4;
const STATE_VERSION_1: u8 = 1;

/// Control record types of Kafka's transaction markers.
const MARKER_ABORT: i16 = 0;
const MARKER_COMMIT: i16 = 1;

/// Why bytes are not an encoded producer state.
#[derive(Debug, thiserror::Error)]
#[error("producer state: {0}")]
pub struct StateError(String);

impl StateError {
    pub fn new(why: &str) -> StateError {
        StateError(why.into())
    }
}

/// Batches remembered per producer (Kafka's `NUM_BATCHES_TO_RETAIN`).
const BATCHES_RETAINED: usize = 5;
/// Producers remembered per partition; the least recently used is forgotten past this.
const PRODUCERS_MAX: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct BatchMeta {
    first_seq: i32,
    last_seq: i32,
    base_offset: i64,
    timestamp: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ProducerEntry {
    epoch: i16,
    batches: VecDeque<BatchMeta>,
    last_used: u64,
    /// The first offset of its open transaction here.
    #[serde(default)]
    txn_first: Option<i64>,
    /// The coordinator epoch of the last marker (-1: none yet).
    #[serde(default = "no_coordinator_epoch")]
    coordinator_epoch: i32,
    /// Its last closed transaction here, (first offset, marker offset): a snapshot that ends
    /// between the two has it open (`below`).
    #[serde(default)]
    last_closed: Option<(i64, i64)>,
}

fn no_coordinator_epoch() -> i32 {
    -1
}

/// A transaction marker: what the coordinator decided, and its epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marker {
    pub commit: bool,
    pub coordinator_epoch: i32,
}

/// A transaction a marker closed here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClosedTxn {
    pub producer_id: i64,
    pub first_offset: i64,
    /// The marker's offset.
    pub last_offset: i64,
    pub aborted: bool,
}

/// One producer of a partition as DescribeProducers shows it (Kafka's `ProducerStateEntry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActiveProducer {
    pub producer_id: i64,
    pub epoch: i16,
    /// The last sequence of its last batch remembered here, -1 if none (a marker of a new
    /// epoch forgets them).
    pub last_sequence: i32,
    /// The max timestamp of that batch, -1 if none.
    pub last_timestamp: i64,
    /// The coordinator epoch of its last marker here, -1 if none.
    pub coordinator_epoch: i32,
    /// The first offset of its open transaction here, -1 if none.
    pub txn_start_offset: i64,
}

/// Outcome of checking a batch before it is appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceCheck {
    /// Append it.
    Accept,
    /// Already written: answer with this base offset and timestamp, do not append.
    Duplicate { base_offset: i64, timestamp: i64 },
    /// Refuse: OUT_OF_ORDER_SEQUENCE_NUMBER.
    OutOfOrder,
    /// Refuse: INVALID_PRODUCER_EPOCH.
    StaleEpoch,
    /// Refuse: INVALID_TXN_STATE (a non-transactional batch while its transaction is open).
    TxnOpen,
}

/// Serialisable: partitions snapshot it at each segment roll.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct ProducerStates {
    producers: HashMap<i64, ProducerEntry>,
    clock: u64,
    /// Open transactions by first offset (producer id): built from `producers`.
    #[serde(skip)]
    open: BTreeMap<i64, i64>,
    /// Closed transactions whose marker the HW may not have passed yet (`first_unstable`).
    #[serde(skip)]
    closing: VecDeque<ClosedTxn>,
    /// Per producer id, the guard of a verification with its coordinator under way (KIP-890
    /// part 1): a transactional batch that opens a transaction here must carry it, and any
    /// marker of the producer takes it away, so a batch verified before an abort cannot open
    /// a transaction after it.
    #[serde(skip)]
    guards: HashMap<i64, u64>,
    #[serde(skip)]
    next_guard: u64,
}

fn in_sequence(last_seq: i32, next_first: i32) -> bool {
    next_first == last_seq.wrapping_add(1) || (last_seq == i32::MAX && next_first == 0)
}

impl ProducerStates {
    /// Checks a batch of an idempotent producer. Batches without a producer id always pass.
    pub fn check(&self, h: &BatchHeader) -> SequenceCheck {
        if !h.has_producer_id() {
            return SequenceCheck::Accept;
        }
        let Some(entry) = self.producers.get(&h.producer_id) else {
            return SequenceCheck::Accept;
        };
        if h.producer_epoch < entry.epoch {
            return SequenceCheck::StaleEpoch;
        }
        if h.producer_epoch > entry.epoch {
            return if entry.txn_first.is_some() && !h.is_transactional() {
                SequenceCheck::TxnOpen
            } else if h.base_sequence == 0 {
                SequenceCheck::Accept
            } else {
                SequenceCheck::OutOfOrder
            };
        }
        let last_seq = h.last_sequence();
        if let Some(dup) = entry
            .batches
            .iter()
            .find(|b| b.first_seq == h.base_sequence && b.last_seq == last_seq)
        {
            return SequenceCheck::Duplicate {
                base_offset: dup.base_offset,
                timestamp: dup.timestamp,
            };
        }
        match entry.batches.back() {
            Some(last) if !in_sequence(last.last_seq, h.base_sequence) => SequenceCheck::OutOfOrder,
            _ if entry.txn_first.is_some() && !h.is_transactional() => SequenceCheck::TxnOpen,
            _ => SequenceCheck::Accept,
        }
    }

    /// Takes `other`'s producers and transactions (a Raft leader's applied state at the start
    /// of a term), keeping the verification guards under way: a batch verified before stays
    /// verified, and no guard number is handed out twice.
    pub fn adopt(&mut self, other: ProducerStates) {
        let guards = std::mem::take(&mut self.guards);
        let next_guard = self.next_guard;
        *self = ProducerStates {
            guards,
            next_guard,
            ..other
        };
    }

    /// The guard a transactional batch of `producer_id` must carry to open a transaction
    /// here, once its coordinator has said the partition is in it; None when one is open
    /// here already (nothing to verify).
    pub fn verification_guard(&mut self, producer_id: i64) -> Option<u64> {
        if self
            .producers
            .get(&producer_id)
            .is_some_and(|e| e.txn_first.is_some())
        {
            return None;
        }
        let next = &mut self.next_guard;
        Some(*self.guards.entry(producer_id).or_insert_with(|| {
            *next += 1;
            *next
        }))
    }

    /// Whether transactional batch `h` may be appended with `guard`: it goes on an open
    /// transaction here, or it carries the producer's current guard.
    pub fn verified(&self, h: &BatchHeader, guard: Option<u64>) -> bool {
        let open = self
            .producers
            .get(&h.producer_id)
            .is_some_and(|e| e.txn_first.is_some());
        open || (guard.is_some() && self.guards.get(&h.producer_id) == guard.as_ref())
    }

    /// Checks a coordinator's transactional write for a producer (TxnOffsetCommit's
    /// offsets) against the producer's epoch: an older one is INVALID_PRODUCER_EPOCH.
    pub fn check_epoch(
        &self,
        producer_id: i64,
        producer_epoch: i16,
    ) -> Result<(), crate::errors::BrokerError> {
        match self.producers.get(&producer_id) {
            Some(e) if producer_epoch < e.epoch => {
                Err(crate::errors::BrokerError::InvalidProducerEpoch)
            }
            _ => Ok(()),
        }
    }

    /// Checks a marker the coordinator asks for against the producer's epochs.
    pub fn check_marker(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        coordinator_epoch: i32,
    ) -> Result<(), crate::errors::BrokerError> {
        use crate::errors::BrokerError;
        let Some(entry) = self.producers.get(&producer_id) else {
            return Ok(());
        };
        if producer_epoch < entry.epoch {
            return Err(BrokerError::InvalidProducerEpoch);
        }
        if coordinator_epoch < entry.coordinator_epoch {
            return Err(BrokerError::TransactionCoordinatorFenced);
        }
        Ok(())
    }

    /// Records an appended batch: a producer's batch (`record`), or a transaction marker
    /// (`marker`, from `marker_of`), which closes the producer's open transaction and
    /// returns it.
    pub fn apply(&mut self, h: &BatchHeader, marker: Option<Marker>) -> Option<ClosedTxn> {
        match marker {
            Some(marker) => self.close(h, marker),
            None => {
                self.record(h);
                None
            }
        }
    }

    /// The marker at `h` closes its producer's open transaction, if any.
    fn close(&mut self, h: &BatchHeader, marker: Marker) -> Option<ClosedTxn> {
        self.guards.remove(&h.producer_id);
        self.clock += 1;
        let clock = self.clock;
        let entry = self
            .producers
            .entry(h.producer_id)
            .or_insert_with(|| ProducerEntry::new(h.producer_epoch, clock));
        if h.producer_epoch != entry.epoch {
            entry.epoch = h.producer_epoch;
            entry.batches.clear();
        }
        entry.coordinator_epoch = marker.coordinator_epoch;
        entry.last_used = clock;
        let first_offset = entry.txn_first.take()?;
        entry.last_closed = Some((first_offset, h.base_offset));
        self.open.remove(&first_offset);
        let closed = ClosedTxn {
            producer_id: h.producer_id,
            first_offset,
            last_offset: h.base_offset,
            aborted: !marker.commit,
        };
        self.closing.push_back(closed);
        Some(closed)
    }

    /// The aborted-transaction index entry of `closed`, an abort just recorded: its last
    /// stable offset is the first offset of the earliest transaction still open, or the offset
    /// after the marker.
    pub fn aborted_entry(&self, closed: &ClosedTxn) -> AbortedTxn {
        AbortedTxn {
            producer_id: closed.producer_id,
            first_offset: closed.first_offset,
            last_offset: closed.last_offset,
            last_stable_offset: self
                .open
                .keys()
                .next()
                .copied()
                .unwrap_or(closed.last_offset + 1),
        }
    }

    /// Every producer remembered here, by producer id.
    pub fn active(&self) -> Vec<ActiveProducer> {
        let mut all: Vec<ActiveProducer> = self
            .producers
            .iter()
            .map(|(&producer_id, e)| ActiveProducer {
                producer_id,
                epoch: e.epoch,
                last_sequence: e.batches.back().map_or(-1, |b| b.last_seq),
                last_timestamp: e.batches.back().map_or(-1, |b| b.timestamp),
                coordinator_epoch: e.coordinator_epoch,
                txn_start_offset: e.txn_first.unwrap_or(-1),
            })
            .collect();
        all.sort_by_key(|p| p.producer_id);
        all
    }

    /// The first offset a read_committed consumer may not read yet: that of the earliest
    /// open transaction, or of a closed one whose marker is at or past `hw`. The LSO is this
    /// or `hw`, whichever is lower.
    pub fn first_unstable(&mut self, hw: i64) -> Option<i64> {
        self.forget_closed_below(hw);
        let open = self.open.keys().next().copied();
        let closing = self.closing.iter().map(|c| c.first_offset).min();
        open.into_iter().chain(closing).min()
    }

    /// Forgets the closed transactions whose marker is below `hw`: they hold nothing back.
    pub fn forget_closed_below(&mut self, hw: i64) {
        while self.closing.front().is_some_and(|c| c.last_offset < hw) {
            self.closing.pop_front();
        }
    }

    /// Builds the open-transaction index from the producers (after deserialising).
    pub fn reindex(mut self) -> ProducerStates {
        self.open = self
            .producers
            .iter()
            .filter_map(|(&id, e)| Some((e.txn_first?, id)))
            .collect();
        self
    }

    /// Records an appended producer batch (or one found during recovery). Control batches
    /// go through `apply`.
    pub fn record(&mut self, h: &BatchHeader) {
        if !h.has_producer_id() || h.is_control() {
            return;
        }
        self.clock += 1;
        let clock = self.clock;
        let entry = self
            .producers
            .entry(h.producer_id)
            .or_insert_with(|| ProducerEntry::new(h.producer_epoch, clock));
        if h.is_transactional() && entry.txn_first.is_none() {
            entry.txn_first = Some(h.base_offset);
            self.open.insert(h.base_offset, h.producer_id);
        }
        if h.producer_epoch != entry.epoch {
            entry.epoch = h.producer_epoch;
            entry.batches.clear();
        }
        if entry.batches.len() == BATCHES_RETAINED {
            entry.batches.pop_front();
        }
        entry.batches.push_back(BatchMeta {
            first_seq: h.base_sequence,
            last_seq: h.last_sequence(),
            base_offset: h.base_offset,
            timestamp: h.max_timestamp,
        });
        entry.last_used = clock;
        if self.producers.len() > PRODUCERS_MAX {
            // Never one with an open transaction, which holds the LSO (as Kafka's expiry).
            if let Some((&oldest, _)) = self
                .producers
                .iter()
                .filter(|(_, e)| e.txn_first.is_none())
                .min_by_key(|(_, e)| e.last_used)
            {
                self.producers.remove(&oldest);
            }
        }
    }
}

impl ProducerEntry {
    fn new(epoch: i16, clock: u64) -> ProducerEntry {
        ProducerEntry {
            epoch,
            batches: VecDeque::with_capacity(BATCHES_RETAINED),
            last_used: clock,
            txn_first: None,
            coordinator_epoch: -1,
            last_closed: None,
        }
    }
}

/// The marker a batch is, if it is one: a transactional control batch of a producer whose
/// record's key is an ABORT or COMMIT (key version 0) and whose value holds the coordinator
/// epoch (value version 0). Anything else, damaged markers included, is not one.
pub fn marker_of(h: &BatchHeader, bytes: &[u8]) -> Option<Marker> {
    if !(h.is_control() && h.is_transactional() && h.has_producer_id()) {
        return None;
    }
    let (control_type, value) = batch::control_record(h, bytes).ok()??;
    let commit = match control_type {
        MARKER_ABORT => false,
        MARKER_COMMIT => true,
        _ => return None,
    };
    let coordinator_epoch = i32::from_be_bytes(value.get(2..6)?.try_into().ok()?);
    Some(Marker {
        commit,
        coordinator_epoch,
    })
}

/// The control batch of a transaction marker, as Kafka's coordinator has its partition
/// leaders write it (offset and leader epoch are the log's to set).
pub fn marker_batch(
    producer_id: i64,
    producer_epoch: i16,
    marker: Marker,
    timestamp_ms: i64,
) -> bytes::BytesMut {
    let control_type = if marker.commit {
        MARKER_COMMIT
    } else {
        MARKER_ABORT
    };
    let mut value = [0u8; 6]; // version 0, then the coordinator epoch
    value[2..].copy_from_slice(&marker.coordinator_epoch.to_be_bytes());
    let b = batch::control_batch(
        control_type,
        &value,
        timestamp_ms,
        Some((producer_id, producer_epoch)),
    );
    bytes::BytesMut::from(&b[..])
}

impl ProducerStates {
    /// What a Raft snapshot ending at `offset` carries: each producer's batches below it (a
    /// producer keeps batches of its current epoch only) and its transaction if that opened
    /// below it and had not closed there. The entries after the snapshot are applied again
    /// on top of it, which gives this state back; before they are, a replica takes no produce
    /// requests (`Replica::ready`). (Of the transactions closed at or after `offset`, only
    /// each producer's last is known here: a snapshot ends at most a little below the
    /// applied state it is taken from.)
    pub fn below(&self, offset: i64) -> ProducerStates {
        let producers = self
            .producers
            .iter()
            .filter_map(|(&id, entry)| {
                let batches: VecDeque<BatchMeta> = entry
                    .batches
                    .iter()
                    .filter(|b| b.base_offset < offset)
                    .copied()
                    .collect();
                // Open then, if it opened below `offset` and closed at or after it.
                let reopened = entry
                    .last_closed
                    .filter(|&(first, at)| first < offset && offset <= at)
                    .map(|(first, _)| first);
                let txn_first = entry.txn_first.filter(|&first| first < offset).or(reopened);
                if batches.is_empty() && txn_first.is_none() {
                    return None;
                }
                let entry = ProducerEntry {
                    batches,
                    txn_first,
                    ..*entry
                };
                Some((id, entry))
            })
            .collect();
        ProducerStates {
            producers,
            clock: self.clock,
            ..ProducerStates::default()
        }
        .reindex()
    }

    /// The state as a Raft snapshot carries it, compactly (at most 167 bytes a producer):
    /// version 4, the clock, the producer count, then per producer its id, epoch, last use,
    /// open transaction's first offset (-1: none), coordinator epoch, last closed transaction
    /// (first and marker offsets, -1 and -1: none), and its batches (count,
    /// then first and last sequence, base offset, timestamp each). Version 1 had no
    /// transaction fields.
    pub fn encode(&self) -> bytes::Bytes {
        let mut out = bytes::BytesMut::with_capacity(13 + self.producers.len() * 55);
        out.put_u8(STATE_VERSION);
        out.put_u64(self.clock);
        out.put_u32(u32::try_from(self.producers.len()).expect("producers fit u32"));
        for (id, entry) in &self.producers {
            out.put_i64(*id);
            out.put_i16(entry.epoch);
            out.put_u64(entry.last_used);
            out.put_i64(entry.txn_first.unwrap_or(-1));
            out.put_i32(entry.coordinator_epoch);
            let (closed_first, closed_at) = entry.last_closed.unwrap_or((-1, -1));
            out.put_i64(closed_first);
            out.put_i64(closed_at);
            out.put_u8(u8::try_from(entry.batches.len()).expect("at most five batches"));
            for b in &entry.batches {
                out.put_i32(b.first_seq);
                out.put_i32(b.last_seq);
                out.put_i64(b.base_offset);
                out.put_i64(b.timestamp);
            }
        }
        out.freeze()
    }

    /// Reads what `encode` wrote, or version 1 (nothing: no state, as in a snapshot taken
    /// before snapshots carried it); anything else is an error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<ProducerStates, StateError> {
        let mut b = bytes;
        if b.is_empty() {
            return Ok(ProducerStates::default());
        }
        let need = |b: &[u8], n: usize| match b.len() >= n {
            true => Ok(()),
            false => Err(StateError("truncated".into())),
        };
        need(b, 13)?;
        let version = b.get_u8();
        let with_txns = match version {
            STATE_VERSION => true,
            STATE_VERSION_1 => false,
            _ => return Err(StateError(format!("unknown version {version}"))),
        };
        let fixed = if with_txns { 47 } else { 19 };
        let clock = b.get_u64();
        let count = b.get_u32() as usize;
        // Each producer takes at least `fixed` bytes: a count beyond them is damage.
        need(b, count.saturating_mul(fixed))?;
        let mut producers = HashMap::with_capacity(count);
        for _ in 0..count {
            need(b, fixed)?;
            let (id, epoch, last_used) = (b.get_i64(), b.get_i16(), b.get_u64());
            let (txn_first, coordinator_epoch, closed) = match with_txns {
                true => (b.get_i64(), b.get_i32(), (b.get_i64(), b.get_i64())),
                false => (-1, -1, (-1, -1)),
            };
            let last_closed = match closed {
                (-1, -1) => None,
                (first, at) if 0 <= first && first <= at => Some((first, at)),
                _ => return Err(StateError(format!("producer {id} closed {closed:?}"))),
            };
            if txn_first < -1 {
                return Err(StateError(format!("producer {id} opened at {txn_first}")));
            }
            let n = usize::from(b.get_u8());
            if n > BATCHES_RETAINED {
                return Err(StateError(format!("producer {id} with {n} batches")));
            }
            need(b, n * 24)?;
            let batches = (0..n)
                .map(|_| BatchMeta {
                    first_seq: b.get_i32(),
                    last_seq: b.get_i32(),
                    base_offset: b.get_i64(),
                    timestamp: b.get_i64(),
                })
                .collect();
            let entry = ProducerEntry {
                epoch,
                batches,
                last_used,
                txn_first: (txn_first >= 0).then_some(txn_first),
                coordinator_epoch,
                last_closed,
            };
            if producers.insert(id, entry).is_some() {
                return Err(StateError(format!("producer {id} twice")));
            }
        }
        if !b.is_empty() {
            return Err(StateError(format!("{} trailing bytes", b.len())));
        }
        let states = ProducerStates {
            producers,
            clock,
            ..ProducerStates::default()
        }
        .reindex();
        if states.open.len()
            != states
                .producers
                .values()
                .filter(|e| e.txn_first.is_some())
                .count()
        {
            return Err(StateError("two transactions open at one offset".into()));
        }
        Ok(states)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrolog_io::batch::make_batch;

    fn h(pid: i64, epoch: i16, seq: i32, count: i32, offset: i64) -> BatchHeader {
        BatchHeader {
            base_offset: offset,
            batch_length: 100,
            partition_leader_epoch: 0,
            magic: 2,
            crc: 0,
            attributes: 0,
            last_offset_delta: count - 1,
            base_timestamp: 0,
            max_timestamp: 7,
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: seq,
            record_count: count,
        }
    }

    #[test]
    fn kafka_sequence_rules() {
        let mut s = ProducerStates::default();
        assert_eq!(
            s.check(&h(1, 0, 42, 1, 0)),
            SequenceCheck::Accept,
            "unknown producer starts anywhere"
        );
        s.record(&h(1, 0, 0, 3, 0));
        assert_eq!(s.check(&h(1, 0, 3, 2, 3)), SequenceCheck::Accept);
        s.record(&h(1, 0, 3, 2, 3));
        assert_eq!(
            s.check(&h(1, 0, 0, 3, 99)),
            SequenceCheck::Duplicate {
                base_offset: 0,
                timestamp: 7
            }
        );
        assert_eq!(s.check(&h(1, 0, 6, 1, 9)), SequenceCheck::OutOfOrder, "gap");
        assert_eq!(
            s.check(&h(1, 1, 5, 1, 9)),
            SequenceCheck::OutOfOrder,
            "new epoch must start at 0"
        );
        assert_eq!(s.check(&h(1, 1, 0, 1, 9)), SequenceCheck::Accept);
        s.record(&h(1, 1, 0, 1, 9));
        assert_eq!(s.check(&h(1, 0, 5, 1, 9)), SequenceCheck::StaleEpoch);
        for i in 1..=6 {
            s.record(&h(1, 1, i, 1, 9 + i64::from(i)));
        }
        assert_eq!(
            s.check(&h(1, 1, 1, 1, 0)),
            SequenceCheck::OutOfOrder,
            "only five batches are kept"
        );
    }

    fn txn(pid: i64, epoch: i16, seq: i32, count: i32, offset: i64) -> BatchHeader {
        BatchHeader {
            attributes: batch::ATTR_TRANSACTIONAL,
            ..h(pid, epoch, seq, count, offset)
        }
    }

    /// A marker of `pid` at `offset`, as the log would hold it.
    fn marker(
        pid: i64,
        epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
        offset: i64,
    ) -> (BatchHeader, Option<Marker>) {
        let m = Marker {
            commit,
            coordinator_epoch,
        };
        let mut bytes = marker_batch(pid, epoch, m, 5);
        batch::set_offset_and_epoch(&mut bytes, offset, 0);
        let header = batch::verify(&bytes).expect("a valid batch");
        assert_eq!(marker_of(&header, &bytes), Some(m), "parses back");
        (header, Some(m))
    }

    #[test]
    fn active_producers_show_what_describe_producers_reports() {
        let mut s = ProducerStates::default();
        s.apply(&txn(2, 3, 0, 2, 10), None);
        s.apply(&h(1, 0, 0, 5, 12), None);
        let (m, k) = marker(2, 3, true, 4, 17);
        s.apply(&m, k);
        s.apply(&txn(2, 3, 2, 1, 18), None);
        let row = |producer_id, epoch, last_sequence, coordinator_epoch, txn_start_offset| {
            ActiveProducer {
                producer_id,
                epoch,
                last_sequence,
                last_timestamp: 7,
                coordinator_epoch,
                txn_start_offset,
            }
        };
        assert_eq!(
            s.active(),
            vec![row(1, 0, 4, -1, -1), row(2, 3, 2, 4, 18)],
            "by producer id; -1 for no marker yet and no open transaction"
        );
        // A marker of a newer epoch forgets the producer's batches.
        let (m, k) = marker(2, 4, false, 4, 19);
        s.apply(&m, k);
        assert_eq!(
            s.active()[1],
            ActiveProducer {
                last_timestamp: -1,
                ..row(2, 4, -1, 4, -1)
            }
        );
    }

    #[test]
    fn transactions_hold_the_lso_until_their_marker_is_below_the_hw() {
        let mut s = ProducerStates::default();
        assert_eq!(s.first_unstable(100), None);
        s.apply(&txn(1, 0, 0, 2, 10), None);
        s.apply(&txn(2, 0, 0, 1, 12), None);
        s.apply(&txn(1, 0, 2, 1, 13), None);
        assert_eq!(s.first_unstable(20), Some(10));
        assert_eq!(
            s.check(&h(1, 0, 3, 1, 14)),
            SequenceCheck::TxnOpen,
            "a plain batch while its transaction is open"
        );
        assert_eq!(s.check(&txn(1, 0, 3, 1, 14)), SequenceCheck::Accept);
        // Producer 1 aborts at 14: its entry's LSO is producer 2's open transaction.
        let (m, k) = marker(1, 0, false, 3, 14);
        let closed = s.apply(&m, k).expect("closes a transaction");
        assert_eq!(
            closed,
            ClosedTxn {
                producer_id: 1,
                first_offset: 10,
                last_offset: 14,
                aborted: true
            }
        );
        assert_eq!(s.aborted_entry(&closed).last_stable_offset, 12);
        assert_eq!(s.first_unstable(14), Some(10), "marker not below the HW");
        assert_eq!(s.first_unstable(15), Some(12), "then producer 2's");
        let (m, k) = marker(2, 0, true, 3, 15);
        let closed = s.apply(&m, k).expect("closes");
        assert_eq!(s.aborted_entry(&closed).last_stable_offset, 16);
        assert_eq!(s.first_unstable(16), None);
        // Sequences go on across transactions of one epoch; a marker with nothing open
        // closes nothing.
        assert_eq!(s.check(&h(1, 0, 3, 1, 17)), SequenceCheck::Accept);
        let (m, k) = marker(1, 0, true, 3, 17);
        assert_eq!(s.apply(&m, k), None);
        // Markers of an older producer or coordinator epoch are refused.
        assert!(s.check_marker(1, 0, 3).is_ok());
        assert!(matches!(
            s.check_marker(1, 0, 2),
            Err(crate::errors::BrokerError::TransactionCoordinatorFenced)
        ));
        let (m, k) = marker(1, 1, false, 4, 18);
        s.apply(&m, k);
        assert!(matches!(
            s.check_marker(1, 0, 4),
            Err(crate::errors::BrokerError::InvalidProducerEpoch)
        ));
        assert_eq!(s.check(&h(1, 0, 4, 1, 19)), SequenceCheck::StaleEpoch);
        assert_eq!(
            s.check(&h(1, 1, 0, 1, 19)),
            SequenceCheck::Accept,
            "new epoch at 0"
        );
        assert!(marker_of(&h(1, 0, 0, 1, 0), &make_batch(0, 1, 0, 4)).is_none());
    }

    #[test]
    fn open_transactions_survive_snapshots_and_encoding() {
        let mut s = ProducerStates::default();
        // Producer 3's transaction opened at 4 and wrote six batches: the last five are all
        // at or after 6, where the snapshot ends, yet it stays open in the snapshot.
        for i in 0..6 {
            s.apply(&txn(3, 0, i, 1, 4 + i64::from(i)), None);
        }
        s.apply(&txn(5, 2, 0, 1, 20), None);
        // Producer 6's transaction opened at 1 and closed at 8: open at 6.
        s.apply(&txn(6, 0, 0, 1, 1), None);
        let (m, k) = marker(6, 0, false, 0, 8);
        s.apply(&m, k);
        assert_eq!(
            s.clone().below(9).first_unstable(100),
            Some(4),
            "closed by then"
        );
        let below = s.clone().below(6);
        assert_eq!(
            below.clone().first_unstable(100),
            Some(1),
            "6's is open at 6"
        );
        let below = below.reindex();
        assert_eq!(
            below.producers[&6].txn_first,
            Some(1),
            "a snapshot at 6 has 6's transaction open"
        );
        let below = s.clone().below(6);
        assert_eq!(below.producers[&3].txn_first, Some(4));
        assert!(!below.producers.contains_key(&5), "opened after the end");
        let back = ProducerStates::decode(&s.encode()).expect("decodes");
        assert_eq!(back.clone().first_unstable(100), Some(4));
        assert_eq!(back.encode().len(), s.encode().len());
        let mut back = back;
        let (m, k) = marker(3, 0, false, 0, 30);
        assert!(back.apply(&m, k).is_some(), "the reloaded state closes it");
        // Version 1 (before transactions) still decodes.
        let mut v1 = bytes::BytesMut::new();
        v1.put_u8(1);
        v1.put_u64(9);
        v1.put_u32(1);
        v1.put_i64(7);
        v1.put_i16(0);
        v1.put_u64(1);
        v1.put_u8(0);
        let old = ProducerStates::decode(&v1).expect("version 1");
        assert_eq!(old.producers.len(), 1);
        // A snapshot in JSON (a local partition's) keeps the open transaction too.
        let json = serde_json::to_vec(&s).unwrap();
        let from_json = serde_json::from_slice::<ProducerStates>(&json)
            .unwrap()
            .reindex();
        assert_eq!(from_json.clone().first_unstable(100), Some(4));
    }

    #[test]
    fn sequence_wraps_at_max() {
        let mut s = ProducerStates::default();
        s.record(&h(2, 0, i32::MAX, 1, 0));
        assert_eq!(s.check(&h(2, 0, 0, 1, 1)), SequenceCheck::Accept);
    }

    /// A Raft snapshot carries the state below its end (`below`): applying the entries after
    /// it again on top gives back the state the node had.
    #[test]
    fn the_state_below_an_offset_plus_the_batches_after_it_is_the_whole_state() {
        let mut s = ProducerStates::default();
        // Producer 1: epoch 0 at offsets 0 and 3, then epoch 1 from offset 10 (which drops
        // its epoch 0 batches); producer 4 straddles offset 10 in one epoch.
        let p1 = [
            h(1, 0, 0, 3, 0),
            h(1, 0, 3, 2, 3),
            h(1, 1, 0, 1, 10),
            h(1, 1, 1, 1, 11),
        ];
        let p4 = [h(4, 2, 0, 2, 6), h(4, 2, 2, 1, 13)];
        // Producer 2 writes only after the snapshot's end; producer 3 only before.
        let (p2, p3) = (h(2, 0, 0, 1, 12), h(3, 0, 7, 1, 5));
        for b in p1.iter().chain([&p3, &p4[0], &p2, &p4[1]]) {
            s.record(b);
        }
        let below = s.below(10);
        let dup = |base_offset| SequenceCheck::Duplicate {
            base_offset,
            timestamp: 7,
        };
        assert_eq!(below.check(&h(3, 0, 7, 1, 0)), dup(5));
        assert_eq!(below.check(&h(4, 2, 0, 2, 0)), dup(6));
        assert_eq!(
            below.check(&h(4, 2, 2, 1, 0)),
            SequenceCheck::Accept,
            "4's next"
        );
        assert_eq!(
            below.check(&h(2, 0, 9, 1, 0)),
            SequenceCheck::Accept,
            "2 unknown"
        );
        let mut again = ProducerStates::decode(&below.encode()).expect("decodes");
        for b in [&p1[2], &p1[3], &p2] {
            again.record(b);
        }
        for probe in [
            h(1, 1, 1, 1, 0),
            h(1, 1, 2, 1, 0),
            h(1, 0, 0, 3, 0),
            h(2, 0, 0, 1, 0),
            h(2, 0, 1, 1, 0),
            h(3, 0, 8, 1, 0),
        ] {
            assert_eq!(again.check(&probe), s.check(&probe), "{probe:?}");
        }
        assert!(ProducerStates::decode(b"")
            .expect("none")
            .producers
            .is_empty());
        let bytes = s.encode();
        let back = ProducerStates::decode(&bytes).expect("decodes");
        assert_eq!(back.encode().len(), bytes.len());
        for cut in 1..bytes.len() {
            assert!(
                ProducerStates::decode(&bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut longer = bytes.to_vec();
        longer.push(0);
        assert!(ProducerStates::decode(&longer).is_err());
    }
}
