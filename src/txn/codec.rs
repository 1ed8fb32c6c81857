//! The records of `__transaction_state`, in Apache Kafka's layouts, so a log written here
//! reads like Kafka's and the other way round.
//!
//! Key (`TransactionLogKey`, version 0): int16 version, then the transactional id as an
//! int16-length string. Value (`TransactionLogValue`): int16 version, then producer id
//! (int64), producer epoch (int16), transaction timeout (int32), state (int8), the
//! partitions (nullable array of topic + int32 partitions), last update and start times
//! (int64). Version 0 is written (Kafka does so while `transaction.version` is below 1);
//! version 1, the flexible form with compact strings and tagged fields, is read too. A null
//! value is a tombstone: the transactional id expired.

use std::collections::BTreeSet;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::TxnState;

const KEY_VERSION: i16 = 0;
const VALUE_VERSION: i16 = 0;
const VALUE_VERSION_FLEXIBLE: i16 = 1;

/// Why a record of `__transaction_state` does not decode.
#[derive(Debug, thiserror::Error)]
#[error("__transaction_state record: {0}")]
pub struct CodecError(String);

fn err<T>(why: impl Into<String>) -> Result<T, CodecError> {
    Err(CodecError(why.into()))
}

/// A transactional id's state as the log keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnValue {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub timeout_ms: i32,
    pub state: TxnState,
    pub partitions: BTreeSet<(String, i32)>,
    pub last_update_ms: i64,
    pub start_ms: i64,
}

pub fn encode_key(transactional_id: &str) -> Bytes {
    let mut b = BytesMut::with_capacity(4 + transactional_id.len());
    b.put_i16(KEY_VERSION);
    put_string(&mut b, transactional_id);
    b.freeze()
}

/// The transactional id of a key; None for a key version this does not know (Kafka skips
/// those too).
pub fn decode_key(mut b: &[u8]) -> Result<Option<String>, CodecError> {
    let version = get_i16(&mut b)?;
    if version != KEY_VERSION {
        return Ok(None);
    }
    let id = get_string(&mut b)?;
    Ok(Some(id))
}

pub fn encode_value(v: &TxnValue) -> Bytes {
    let mut b = BytesMut::with_capacity(64);
    b.put_i16(VALUE_VERSION);
    b.put_i64(v.producer_id);
    b.put_i16(v.producer_epoch);
    b.put_i32(v.timeout_ms);
    b.put_i8(v.state as i8);
    if v.state == TxnState::Empty {
        b.put_i32(-1); // Kafka writes no partition list for an empty transaction
    } else {
        let topics = by_topic(&v.partitions);
        b.put_i32(topics.len() as i32);
        for (topic, partitions) in topics {
            put_string(&mut b, topic);
            b.put_i32(partitions.len() as i32);
            for p in partitions {
                b.put_i32(p);
            }
        }
    }
    b.put_i64(v.last_update_ms);
    b.put_i64(v.start_ms);
    b.freeze()
}

fn by_topic(partitions: &BTreeSet<(String, i32)>) -> Vec<(&str, Vec<i32>)> {
    let mut out: Vec<(&str, Vec<i32>)> = Vec::new();
    for (topic, p) in partitions {
        match out.last_mut() {
            Some((t, ps)) if *t == topic.as_str() => ps.push(*p),
            _ => out.push((topic.as_str(), vec![*p])),
        }
    }
    out
}

pub fn decode_value(mut b: &[u8]) -> Result<TxnValue, CodecError> {
    let version = get_i16(&mut b)?;
    let flexible = match version {
        VALUE_VERSION => false,
        VALUE_VERSION_FLEXIBLE => true,
        v => return err(format!("unknown value version {v}")),
    };
    let producer_id = get_i64(&mut b)?;
    let producer_epoch = get_i16(&mut b)?;
    let timeout_ms = get_i32(&mut b)?;
    let state = TxnState::from_id(get_i8(&mut b)?)
        .ok_or_else(|| CodecError("unknown transaction state".into()))?;
    let mut partitions = BTreeSet::new();
    let topics = match flexible {
        true => get_uvarint(&mut b)? as i64 - 1,
        false => i64::from(get_i32(&mut b)?),
    };
    for _ in 0..topics.max(0) {
        let topic = match flexible {
            true => get_compact_string(&mut b)?,
            false => get_string(&mut b)?,
        };
        let n = match flexible {
            true => get_uvarint(&mut b)? as i64 - 1,
            false => i64::from(get_i32(&mut b)?),
        };
        if n < 0 || n as usize > b.len() / 4 {
            return err("partition count past the record");
        }
        for _ in 0..n {
            partitions.insert((topic.clone(), get_i32(&mut b)?));
        }
        if flexible {
            skip_tagged_fields(&mut b)?;
        }
    }
    let last_update_ms = get_i64(&mut b)?;
    let start_ms = get_i64(&mut b)?;
    if flexible {
        skip_tagged_fields(&mut b)?;
    }
    Ok(TxnValue {
        producer_id,
        producer_epoch,
        timeout_ms,
        state,
        partitions,
        last_update_ms,
        start_ms,
    })
}

fn put_string(b: &mut BytesMut, s: &str) {
    let len = i16::try_from(s.len()).expect("transactional ids and topics fit an int16 length");
    b.put_i16(len);
    b.put_slice(s.as_bytes());
}

fn need(b: &[u8], n: usize) -> Result<(), CodecError> {
    match b.len() >= n {
        true => Ok(()),
        false => err("cut short"),
    }
}

fn get_i8(b: &mut &[u8]) -> Result<i8, CodecError> {
    need(b, 1)?;
    Ok(b.get_i8())
}

fn get_i16(b: &mut &[u8]) -> Result<i16, CodecError> {
    need(b, 2)?;
    Ok(b.get_i16())
}

fn get_i32(b: &mut &[u8]) -> Result<i32, CodecError> {
    need(b, 4)?;
    Ok(b.get_i32())
}

fn get_i64(b: &mut &[u8]) -> Result<i64, CodecError> {
    need(b, 8)?;
    Ok(b.get_i64())
}

fn take_utf8(b: &mut &[u8], len: usize) -> Result<String, CodecError> {
    need(b, len)?;
    let s = std::str::from_utf8(&b[..len])
        .map_err(|_| CodecError("string is not UTF-8".into()))?
        .to_string();
    b.advance(len);
    Ok(s)
}

fn get_string(b: &mut &[u8]) -> Result<String, CodecError> {
    let len = get_i16(b)?;
    if len < 0 {
        return err("null string");
    }
    take_utf8(b, len as usize)
}

fn get_compact_string(b: &mut &[u8]) -> Result<String, CodecError> {
    let len = get_uvarint(b)?;
    if len == 0 {
        return err("null string");
    }
    take_utf8(b, (len - 1) as usize)
}

fn get_uvarint(b: &mut &[u8]) -> Result<u64, CodecError> {
    let mut v = 0u64;
    for shift in (0..35).step_by(7) {
        let byte = u64::from(get_i8(b)? as u8);
        v |= (byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    err("varint too long")
}

fn skip_tagged_fields(b: &mut &[u8]) -> Result<(), CodecError> {
    for _ in 0..get_uvarint(b)? {
        let _tag = get_uvarint(b)?;
        let size = get_uvarint(b)? as usize;
        need(b, size)?;
        b.advance(size);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(state: TxnState) -> TxnValue {
        TxnValue {
            producer_id: 4000,
            producer_epoch: 3,
            timeout_ms: 60_000,
            state,
            partitions: [
                ("a".to_string(), 1),
                ("a".to_string(), 0),
                ("b".to_string(), 7),
            ]
            .into_iter()
            .filter(|_| state != TxnState::Empty)
            .collect(),
            last_update_ms: 17,
            start_ms: 11,
        }
    }

    #[test]
    fn round_trips_in_kafkas_layout() {
        assert_eq!(&encode_key("tx")[..], &[0, 0, 0, 2, b't', b'x']);
        assert_eq!(
            decode_key(&encode_key("tx")).unwrap().as_deref(),
            Some("tx")
        );
        assert_eq!(
            decode_key(&[0, 1, 0, 0]).unwrap(),
            None,
            "unknown key version"
        );
        for state in [TxnState::Empty, TxnState::Ongoing, TxnState::CompleteCommit] {
            let v = value(state);
            assert_eq!(decode_value(&encode_value(&v)).unwrap(), v);
        }
        // Empty: version 0, pid, epoch, timeout, state 0, null partitions, times.
        let empty = encode_value(&value(TxnState::Empty));
        assert_eq!(empty.len(), 2 + 8 + 2 + 4 + 1 + 4 + 8 + 8);
        assert_eq!(&empty[17..21], &(-1i32).to_be_bytes());
        let bytes = encode_value(&value(TxnState::Ongoing));
        for cut in 0..bytes.len() {
            assert!(decode_value(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    /// Version 1 (flexible), as Kafka writes it with `transaction.version` 1 or more.
    #[test]
    fn reads_the_flexible_version() {
        let mut b = BytesMut::new();
        b.put_i16(1);
        b.put_i64(9);
        b.put_i16(2);
        b.put_i32(1000);
        b.put_i8(TxnState::PrepareCommit as i8);
        b.put_u8(2); // one topic
        b.put_u8(2); // "t"
        b.put_u8(b't');
        b.put_u8(3); // two partitions
        b.put_i32(0);
        b.put_i32(5);
        b.put_u8(0); // its tagged fields
        b.put_i64(30);
        b.put_i64(20);
        b.put_u8(1); // one tagged field: previous producer id
        b.put_u8(0);
        b.put_u8(8);
        b.put_i64(8);
        let v = decode_value(&b).unwrap();
        assert_eq!(v.producer_id, 9);
        assert_eq!(v.state, TxnState::PrepareCommit);
        assert_eq!(v.partitions.len(), 2);
        assert_eq!((v.last_update_ms, v.start_ms), (30, 20));
    }
}
