//! A response's frame (size, header, body) as the pieces the connection writes in order.
//!
//! Most responses are encoded whole into the connection's buffer. A Fetch response's record
//! bytes are not copied there: kafka-protocol encodes the response with a 16-byte marker in
//! place of each partition's records, and the frame is cut at each marker, whose length
//! prefix is rewritten for the records that go out in its place, as they were read. Fetch
//! responses run to megabytes, nearly all records, so this saves a copy of every byte a
//! consumer reads (into a buffer that, at that size, is fresh memory for each response).

use std::sync::OnceLock;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::ResponseKind;

use crate::group::codec;
use crate::kafka::dispatch::{self, Response};

/// Records shorter than this are copied into the frame: a write of their own costs more.
const SEPARATE_RECORDS_MIN: usize = 16 << 10;
/// A connection keeps its encoding buffer for the next response up to this capacity.
const OUT_KEPT_MAX: usize = 4 << 20;

/// The first 8 bytes of every marker: random per process, so a marker cannot be anything
/// else the response holds (the rest of a marker is the records' place in the response).
fn marker_prefix() -> [u8; 8] {
    static PREFIX: OnceLock<[u8; 8]> = OnceLock::new();
    *PREFIX.get_or_init(|| {
        let random = uuid::Uuid::new_v4();
        random.as_bytes()[..8].try_into().expect("8 bytes")
    })
}

fn marker(i: usize) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[..8].copy_from_slice(&marker_prefix());
    m[8..].copy_from_slice(&(i as u64).to_be_bytes());
    m
}

/// How a records field's length is written before its bytes: an int32 up to Fetch v11, an
/// unsigned varint of length + 1 (compact bytes) from v12.
fn length_prefix(version: i16, len: usize) -> BytesMut {
    let mut out = BytesMut::with_capacity(5);
    if version >= 12 {
        codec::put_uvarint(&mut out, len as u64 + 1);
    } else {
        out.put_i32(len as i32);
    }
    out
}

/// Encodes `response` as a frame and returns it as pieces to write in order (slices of what
/// `out` received, and record bytes as they are).
pub fn encode(mut response: Response, out: &mut BytesMut) -> anyhow::Result<Vec<Bytes>> {
    let records = match &mut response.body {
        ResponseKind::Fetch(fetch) => take_records(fetch),
        _ => Vec::new(),
    };
    let encoded = encode_whole(&response, out)?;
    if records.is_empty() {
        return Ok(vec![encoded]);
    }
    match cut(&encoded, response.version, records) {
        Ok(pieces) => Ok(pieces),
        Err(records) => {
            // A marker not where it was put: impossible unless kafka-protocol changed how it
            // writes records. Encode them in place instead.
            tracing::error!(
                "a Fetch response's record markers were not found; copying the records"
            );
            if let ResponseKind::Fetch(fetch) = &mut response.body {
                put_records(fetch, records);
            }
            Ok(vec![encode_whole(&response, out)?])
        }
    }
}

/// The whole frame, encoded into `out` (cleared first).
fn encode_whole(response: &Response, out: &mut BytesMut) -> anyhow::Result<Bytes> {
    out.clear();
    out.put_i32(0);
    dispatch::encode_response(response, out)?;
    let size = (out.len() - 4) as i32;
    out[..4].copy_from_slice(&size.to_be_bytes());
    // A large frame's buffer is not kept for the connection's next responses.
    Ok(match out.capacity() > OUT_KEPT_MAX {
        true => std::mem::take(out),
        false => out.split(),
    }
    .freeze())
}

/// Replaces each partition's records of `SEPARATE_RECORDS_MIN` bytes or more with a marker;
/// returns them in encoding order.
fn take_records(fetch: &mut kafka_protocol::messages::FetchResponse) -> Vec<Bytes> {
    let mut taken = Vec::new();
    for topic in &mut fetch.responses {
        for p in &mut topic.partitions {
            if p.records
                .as_ref()
                .is_some_and(|r| r.len() >= SEPARATE_RECORDS_MIN)
            {
                let records = p
                    .records
                    .replace(Bytes::copy_from_slice(&marker(taken.len())));
                taken.push(records.expect("checked"));
            }
        }
    }
    taken
}

/// Undoes `take_records`.
fn put_records(fetch: &mut kafka_protocol::messages::FetchResponse, records: Vec<Bytes>) {
    let mut records = records.into_iter();
    for topic in &mut fetch.responses {
        for p in &mut topic.partitions {
            let marked = p
                .records
                .as_ref()
                .is_some_and(|r| r.len() == 16 && r[..8] == marker_prefix());
            if marked {
                p.records = records.next();
            }
        }
    }
}

/// Cuts `encoded` at each marker, in order, and puts the records there with their length;
/// the records back if a marker is not where it must be.
fn cut(encoded: &Bytes, version: i16, records: Vec<Bytes>) -> Result<Vec<Bytes>, Vec<Bytes>> {
    let marked = length_prefix(version, 16);
    let mut from = 0;
    let mut size = encoded.len() - 4;
    let mut heads = Vec::with_capacity(records.len());
    for (i, r) in records.iter().enumerate() {
        let m = marker(i);
        let found = encoded[from..].windows(16).position(|w| w == m);
        let Some(at) = found.map(|p| from + p) else {
            return Err(records);
        };
        let prefix_at = at.checked_sub(marked.len()).filter(|&p| p >= from);
        let Some(prefix_at) = prefix_at.filter(|&p| encoded[p..at] == marked[..]) else {
            return Err(records);
        };
        let prefix = length_prefix(version, r.len());
        size = size + prefix.len() + r.len() - marked.len() - 16;
        heads.push((from, prefix_at, prefix));
        from = at + 16;
    }
    let size = i32::try_from(size).expect("a Fetch response is bounded by its max_bytes");
    let mut pieces = Vec::with_capacity(records.len() * 2 + 1);
    for ((from, to, prefix), r) in heads.into_iter().zip(records) {
        let mut head = BytesMut::with_capacity(to - from + prefix.len());
        head.extend_from_slice(&encoded[from..to]);
        if from == 0 {
            head[..4].copy_from_slice(&size.to_be_bytes());
        }
        head.extend_from_slice(&prefix);
        pieces.push(head.freeze());
        pieces.push(r);
    }
    pieces.push(encoded.slice(from..));
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::{ApiKey, BrokerId, FetchResponse, TopicName};
    use kafka_protocol::protocol::StrBytes;

    use super::*;

    fn response(version: i16, sizes: &[Option<usize>]) -> Response {
        let partitions = sizes
            .iter()
            .enumerate()
            .map(|(i, size)| {
                let records = size
                    .map(|n| Bytes::from((0..n).map(|b| (b * 7 + i) as u8).collect::<Vec<_>>()));
                PartitionData::default()
                    .with_partition_index(i as i32)
                    .with_high_watermark(1 << 40)
                    .with_last_stable_offset(1 << 40)
                    .with_log_start_offset(if version >= 5 { 3 } else { -1 })
                    .with_preferred_read_replica(BrokerId(-1))
                    .with_records(records)
            })
            .collect();
        let topic = FetchableTopicResponse::default().with_partitions(partitions);
        let topic = match version {
            13.. => topic.with_topic_id(uuid::Uuid::from_u128(7)),
            _ => topic.with_topic(TopicName(StrBytes::from_static_str("t"))),
        };
        let session_id = if version >= 7 { 9 } else { 0 };
        Response {
            correlation_id: 42,
            key: ApiKey::Fetch,
            version,
            body: ResponseKind::Fetch(
                FetchResponse::default()
                    .with_session_id(session_id)
                    .with_responses(vec![topic.clone(), topic]),
            ),
        }
    }

    /// Every Fetch version served: the pieces make exactly the frame encoded whole, with
    /// records of every size around the threshold and the varint's widths (v12+), empty and
    /// null records among them.
    #[test]
    fn pieces_make_the_whole_frame() {
        let sizes = [
            Some(SEPARATE_RECORDS_MIN),
            None,
            Some(0),
            Some(100),
            Some(SEPARATE_RECORDS_MIN - 1),
            Some(1 << 20),
            Some((1 << 21) + 3),
        ];
        for version in 4..=18 {
            let mut out = BytesMut::new();
            let pieces = encode(response(version, &sizes), &mut out).unwrap();
            assert_eq!(
                pieces.len(),
                2 * 6 + 1,
                "v{version}: three large records in each of two topics"
            );
            let got: Vec<u8> = pieces.concat();
            let whole = encode_whole(&response(version, &sizes), &mut BytesMut::new()).unwrap();
            assert_eq!(got.len(), whole.len(), "v{version}");
            assert!(
                got == whole[..],
                "v{version}: the pieces differ from the whole frame"
            );
        }
    }

    #[test]
    fn other_responses_are_one_piece() {
        let mut out = BytesMut::new();
        let pieces = encode(response(12, &[Some(10), None]), &mut out).unwrap();
        assert_eq!(pieces.len(), 1);
        let whole = encode_whole(&response(12, &[Some(10), None]), &mut BytesMut::new()).unwrap();
        assert_eq!(pieces[0], whole);
    }
}
