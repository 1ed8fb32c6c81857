//! Idempotent-producer state of one partition (KIP-98): per producer id, its epoch and the
//! last five batches it wrote, so retries are recognised and gaps are refused.
//!
//! The rules follow Kafka 4.1's `ProducerAppendInfo`: an older epoch is fenced
//! (INVALID_PRODUCER_EPOCH); a new epoch must start at sequence 0; within an epoch each batch
//! must follow the last one (wrapping at `i32::MAX`); a producer with no state here may start
//! anywhere; a batch equal to one of the last five is a duplicate and is answered with the
//! offset it got the first time.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use ferrolog_io::batch::BatchHeader;

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
}

/// Serialisable: partitions snapshot it at each segment roll.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct ProducerStates {
    producers: HashMap<i64, ProducerEntry>,
    clock: u64,
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
            return if h.base_sequence == 0 {
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
            _ => SequenceCheck::Accept,
        }
    }

    /// Records an appended batch (or one found during recovery).
    pub fn record(&mut self, h: &BatchHeader) {
        if !h.has_producer_id() || h.is_control() {
            return;
        }
        self.clock += 1;
        let clock = self.clock;
        let entry = self
            .producers
            .entry(h.producer_id)
            .or_insert_with(|| ProducerEntry {
                epoch: h.producer_epoch,
                batches: VecDeque::with_capacity(BATCHES_RETAINED),
                last_used: clock,
            });
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
            if let Some((&oldest, _)) = self.producers.iter().min_by_key(|(_, e)| e.last_used) {
                self.producers.remove(&oldest);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn sequence_wraps_at_max() {
        let mut s = ProducerStates::default();
        s.record(&h(2, 0, i32::MAX, 1, 0));
        assert_eq!(s.check(&h(2, 0, 0, 1, 1)), SequenceCheck::Accept);
    }
}
