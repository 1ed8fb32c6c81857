//! Idempotent-producer state of one partition (KIP-98): per producer id, its epoch and the
//! last five batches it wrote, so retries are recognised and gaps are refused.
//!
//! The rules follow Kafka 4.1's `ProducerAppendInfo`: an older epoch is fenced
//! (INVALID_PRODUCER_EPOCH); a new epoch must start at sequence 0; within an epoch each batch
//! must follow the last one (wrapping at `i32::MAX`); a producer with no state here may start
//! anywhere; a batch equal to one of the last five is a duplicate and is answered with the
//! offset it got the first time.

use std::collections::{HashMap, VecDeque};

use bytes::{Buf, BufMut};
use serde::{Deserialize, Serialize};

use ferrolog_io::batch::BatchHeader;

/// The version of `ProducerStates::encode` (a Raft snapshot's partition state tells its own
/// layout from this one by it: `replication::raft::SnapshotState`).
pub(crate) const STATE_VERSION: u8 = 1;

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

impl ProducerStates {
    /// What a Raft snapshot ending at `offset` carries: each producer's batches below it (a
    /// producer keeps batches of its current epoch only). The entries after the snapshot
    /// are applied again on top of it, which gives this state back; before they are, a
    /// replica takes no produce requests (`Replica::ready`).
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
                batches.back()?;
                let entry = ProducerEntry {
                    epoch: entry.epoch,
                    batches,
                    last_used: entry.last_used,
                };
                Some((id, entry))
            })
            .collect();
        ProducerStates {
            producers,
            clock: self.clock,
        }
    }

    /// The state as a Raft snapshot carries it, compactly (at most 139 bytes a producer):
    /// version 1, the clock, the producer count, then per producer its id, epoch, last use,
    /// and its batches (count, then first and last sequence, base offset, timestamp each).
    pub fn encode(&self) -> bytes::Bytes {
        let mut out = bytes::BytesMut::with_capacity(13 + self.producers.len() * 43);
        out.put_u8(STATE_VERSION);
        out.put_u64(self.clock);
        out.put_u32(u32::try_from(self.producers.len()).expect("producers fit u32"));
        for (id, entry) in &self.producers {
            out.put_i64(*id);
            out.put_i16(entry.epoch);
            out.put_u64(entry.last_used);
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

    /// Reads what `encode` wrote (nothing: no state, as in a snapshot taken before
    /// snapshots carried it); anything else is an error, never a panic.
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
        if version != STATE_VERSION {
            return Err(StateError(format!("unknown version {version}")));
        }
        let clock = b.get_u64();
        let count = b.get_u32() as usize;
        // Each producer takes at least 19 bytes: a count beyond them is damage.
        need(b, count.saturating_mul(19))?;
        let mut producers = HashMap::with_capacity(count);
        for _ in 0..count {
            need(b, 19)?;
            let (id, epoch, last_used) = (b.get_i64(), b.get_i16(), b.get_u64());
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
            };
            if producers.insert(id, entry).is_some() {
                return Err(StateError(format!("producer {id} twice")));
            }
        }
        if !b.is_empty() {
            return Err(StateError(format!("{} trailing bytes", b.len())));
        }
        Ok(ProducerStates { producers, clock })
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
