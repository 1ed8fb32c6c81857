"""The record-batch header that holds one offset, read with a bare Fetch v4 request.

The clients hide a batch's producer id, epoch and base sequence; they tell who wrote a
duplicated record twice: the same producer id and epoch means the broker took a retry for
a new batch, another producer id (or epoch) that the client sent it again as a new
producer session (librdkafka's epoch bump), where no broker can recognise it.
"""

import struct
import time

from check import wire

FETCH, FETCH_VERSION = 1, 4
# base offset, length, leader epoch, magic, crc, attributes, last offset delta, base and max
# timestamp, producer id, producer epoch, base sequence, record count (KIP-98's v2 batch).
BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
MAX_BYTES = 1 << 20


def _fetch_body(topic, partition, offset):
    body = struct.pack(">iiiib", -1, 0, 0, MAX_BYTES, 0) + struct.pack(">i", 1) + wire.string(topic)
    return body + struct.pack(">iiqi", 1, partition, offset, MAX_BYTES)


class _Reader:
    def __init__(self, data):
        self.data, self.at = data, 0

    def take(self, fmt):
        values = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return values if len(values) > 1 else values[0]

    def skip_string(self):
        length = self.take(">h")
        self.at += length


def parse_fetch_records(response):
    """The error code and the records bytes of the one partition of a Fetch v4 response
    (the correlation id already read)."""
    r = _Reader(response)
    r.take(">i")  # throttle time
    assert r.take(">i") == 1, "one topic asked"
    r.skip_string()
    assert r.take(">i") == 1, "one partition asked"
    _, error, _, _ = r.take(">ihqq")
    aborted = r.take(">i")
    r.at += max(aborted, 0) * 16
    size = r.take(">i")
    return error, response[r.at : r.at + max(size, 0)]


def headers(records):
    """The batch headers of a records blob (one whose header is cut short is left out)."""
    at = 0
    while at + BATCH_HEADER.size <= len(records):
        fields = BATCH_HEADER.unpack_from(records, at)
        yield {
            "base_offset": fields[0],
            "last_offset": fields[0] + fields[6],
            "producer_id": fields[9],
            "producer_epoch": fields[10],
            "base_sequence": fields[11],
        }
        at += 12 + fields[1]  # the length counts from after itself


def batch_at(host, port, topic, partition, offset, timeout_s=10.0):
    """The header of the batch holding `offset`, from the broker at host:port (the
    partition's leader), or None if its answer holds none."""
    response = wire.exchange(host, port, FETCH, FETCH_VERSION, _fetch_body(topic, partition, offset), timeout_s,
                             client_id="ferrolog-check")  # fmt: skip
    error, records = parse_fetch_records(response)
    if error:
        raise RuntimeError(f"Fetch of {topic}/{partition} at {offset}: error code {error}")
    return next((h for h in headers(records) if h["base_offset"] <= offset <= h["last_offset"]), None)


def reader(admin, topic, budget_s=120, tries=3):
    """A function (partition, offset) -> the header of the batch there, asking each
    partition's current leader (again, with fresh metadata, after a failure), or a string
    saying why it cannot tell. All lookups together get `budget_s`: a cluster in trouble
    must not hold the report up; whatever is not looked up stays an anomaly."""
    deadline = time.monotonic() + budget_s

    def batch_of(partition, offset):
        error = "no time left to look it up"
        for _ in range(tries):
            if time.monotonic() > deadline:
                break
            try:
                md = admin.list_topics(topic, timeout=5)
                broker = md.brokers[md.topics[topic].partitions[partition].leader]
                return batch_at(broker.host, broker.port, topic, partition, offset, timeout_s=5) or "not found"
            except Exception as err:  # a leader moving, a node down: ask again
                error = str(err)
                time.sleep(0.5)
        return error

    return batch_of
