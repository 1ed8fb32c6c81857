"""Hand-encoded Kafka protocol frames, for requests no well-behaved client sends.

The client libraries refuse to send a corrupt CRC, two batches in one partition,
acks=5 or a version the broker never advertised, so the bad-input tests build
those bytes here. Only what they need is covered:

  * primitives: fixed-width integers, (compact) strings and bytes, varints,
    tagged-field sections;
  * CRC32C (Castagnoli), table-driven, for record batch checksums;
  * record batches in the v2 format (magic 2), with the CRC computed or spoiled,
    and a legacy magic 1 message set;
  * requests: ApiVersions v0/v3, Produce v7 (non-flexible) and v9 (flexible),
    InitProducerId v0, Metadata v8; and decoders for their responses;
  * `Connection`: one TCP connection that frames requests with request header
    v1 or v2 and reads responses by correlation id.

Field layouts follow Kafka's message schemas (clients/src/main/resources/common/
message/*.json) and the record batch layout of KIP-98.
"""

import socket
import struct
import time
import zlib

# ---- error codes the tests look for (Kafka's Errors enum) ----------------------
NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
CORRUPT_MESSAGE = 2
LEADER_NOT_AVAILABLE = 5
MESSAGE_TOO_LARGE = 10
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
INVALID_TOPIC_EXCEPTION = 17
INVALID_REQUIRED_ACKS = 21
INVALID_TIMESTAMP = 32
UNSUPPORTED_VERSION = 35
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
INVALID_RECORD = 87

# ---- API keys ------------------------------------------------------------------
PRODUCE = 0
METADATA = 3
API_VERSIONS = 18
INIT_PRODUCER_ID = 22


# ---- CRC32C ----------------------------------------------------------------------
def _crc32c_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as record batches use."""
    crc = 0xFFFFFFFF
    table = _CRC32C_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283, "CRC32C check value"


# ---- primitives ------------------------------------------------------------------
def i8(v):
    return struct.pack(">b", v)


def i16(v):
    return struct.pack(">h", v)


def i32(v):
    return struct.pack(">i", v)


def i64(v):
    return struct.pack(">q", v)


def boolean(v):
    return b"\x01" if v else b"\x00"


def uvarint(v):
    assert v >= 0
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def varint(v):
    """Zig-zag signed varint (record fields); fits varlong too."""
    return uvarint((v << 1) ^ (v >> 63))


def string(s):
    """STRING / NULLABLE_STRING: int16 length, -1 for null."""
    if s is None:
        return i16(-1)
    b = s.encode()
    return i16(len(b)) + b


def compact_string(s):
    """COMPACT_(NULLABLE_)STRING: uvarint length + 1, 0 for null."""
    if s is None:
        return uvarint(0)
    b = s.encode()
    return uvarint(len(b) + 1) + b


def nullable_bytes(b):
    return i32(-1) if b is None else i32(len(b)) + b


def compact_bytes(b):
    return uvarint(0) if b is None else uvarint(len(b) + 1) + b


def array(items):
    return i32(len(items)) + b"".join(items)


def compact_array(items):
    return uvarint(len(items) + 1) + b"".join(items)


NO_TAGS = uvarint(0)  # an empty tagged-field section


class Reader:
    """Cursor over a response body."""

    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def _take(self, fmt):
        (v,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def i8(self):
        return self._take(">b")

    def i16(self):
        return self._take(">h")

    def i32(self):
        return self._take(">i")

    def i64(self):
        return self._take(">q")

    def boolean(self):
        return self._take(">b") != 0

    def uvarint(self):
        shift = value = 0
        while True:
            b = self.data[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7

    def raw(self, n):
        b = self.data[self.pos : self.pos + n]
        assert len(b) == n, f"response truncated: wanted {n} bytes at {self.pos}, have {len(self.data) - self.pos}"
        self.pos += n
        return b

    def string(self):
        n = self.i16()
        return None if n < 0 else self.raw(n).decode()

    def compact_string(self):
        n = self.uvarint()
        return None if n == 0 else self.raw(n - 1).decode()

    def array(self, item):
        n = self.i32()
        return None if n < 0 else [item(self) for _ in range(n)]

    def compact_array(self, item):
        n = self.uvarint()
        return None if n == 0 else [item(self) for _ in range(n - 1)]

    def tags(self):
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.raw(self.uvarint())

    def remaining(self):
        return len(self.data) - self.pos


# ---- record batches (magic 2) ------------------------------------------------------
def record(offset_delta, value, key=None, timestamp_delta=0, headers=()):
    body = (
        i8(0)
        + varint(timestamp_delta)
        + varint(offset_delta)
        + (varint(-1) if key is None else varint(len(key)) + key)
        + (varint(-1) if value is None else varint(len(value)) + value)
        + varint(len(headers))
        + b"".join(varint(len(k)) + k + (varint(-1) if v is None else varint(len(v)) + v) for k, v in headers)
    )
    return varint(len(body)) + body


def record_batch(
    values,
    keys=None,
    base_timestamp=None,
    producer_id=-1,
    producer_epoch=-1,
    base_sequence=-1,
    base_offset=0,
    attributes=0,
    corrupt_crc=False,
):
    """One uncompressed v2 batch holding one record per value (bytes); keys default to null."""
    if base_timestamp is None:
        base_timestamp = int(time.time() * 1000)
    keys = keys or [None] * len(values)
    records = b"".join(record(i, v, key=k) for i, (k, v) in enumerate(zip(keys, values)))
    after_crc = (
        i16(attributes)
        + i32(len(values) - 1)  # lastOffsetDelta
        + i64(base_timestamp)
        + i64(base_timestamp)  # maxTimestamp: every record has timestamp delta 0
        + i64(producer_id)
        + i16(producer_epoch)
        + i32(base_sequence)
        + i32(len(values))
        + records
    )
    crc = crc32c(after_crc)
    if corrupt_crc:
        crc ^= 0xDEADBEEF
    # batchLength counts everything after itself: epoch(4) + magic(1) + crc(4) + the rest.
    return i64(base_offset) + i32(4 + 1 + 4 + len(after_crc)) + i32(-1) + i8(2) + struct.pack(">I", crc) + after_crc


def legacy_message_set(value, timestamp=None):
    """One magic 1 message (the pre-KIP-98 format, Produce v0-v2), uncompressed, null key."""
    if timestamp is None:
        timestamp = int(time.time() * 1000)
    after_crc = i8(1) + i8(0) + i64(timestamp) + nullable_bytes(None) + nullable_bytes(value)
    message = struct.pack(">I", zlib.crc32(after_crc)) + after_crc
    return i64(0) + i32(len(message)) + message


# ---- requests ------------------------------------------------------------------------
def api_versions_v0():
    return b""


def api_versions_v3(software_name="ferrolog-tests", software_version="1.0"):
    return compact_string(software_name) + compact_string(software_version) + NO_TAGS


def produce_v7(topic_partitions, acks=-1, timeout_ms=10_000, transactional_id=None):
    """topic_partitions: {topic: {partition: records bytes}}. Produce v3..v8 share this layout."""
    topics = [
        string(t) + array([i32(p) + nullable_bytes(r) for p, r in parts.items()])
        for t, parts in topic_partitions.items()
    ]
    return string(transactional_id) + i16(acks) + i32(timeout_ms) + array(topics)


def produce_v9(topic_partitions, acks=-1, timeout_ms=10_000, transactional_id=None):
    """Flexible Produce (v9..v12 share this layout); same argument as produce_v7."""
    topics = [
        compact_string(t) + compact_array([i32(p) + compact_bytes(r) + NO_TAGS for p, r in parts.items()]) + NO_TAGS
        for t, parts in topic_partitions.items()
    ]
    return compact_string(transactional_id) + i16(acks) + i32(timeout_ms) + compact_array(topics) + NO_TAGS


def init_producer_id_v0(transactional_id=None, transaction_timeout_ms=60_000):
    return string(transactional_id) + i32(transaction_timeout_ms)


def metadata_v8(topics, allow_auto_topic_creation=True):
    """topics: list of names, or None for all topics."""
    return (
        (i32(-1) if topics is None else array([string(t) for t in topics]))
        + boolean(allow_auto_topic_creation)
        + boolean(False)  # include_cluster_authorized_operations
        + boolean(False)  # include_topic_authorized_operations
    )


# ---- responses -----------------------------------------------------------------------
def parse_api_versions(body, version):
    """{"error_code", "api_keys": {key: (min, max)}}; v0 layout for version 0, flexible for 3+."""
    r = Reader(body)
    error_code = r.i16()
    if version >= 3:
        keys = r.compact_array(lambda r: (r.i16(), r.i16(), r.i16(), r.tags())[:3])
    else:
        keys = r.array(lambda r: (r.i16(), r.i16(), r.i16()))
    out = {"error_code": error_code, "api_keys": {k: (lo, hi) for k, lo, hi in keys or []}}
    if version >= 1:
        out["throttle_time_ms"] = r.i32()
    if version >= 3:
        r.tags()
    out["trailing_bytes"] = r.remaining()
    return out


def parse_produce(body, version):
    """{(topic, partition): {"error_code", "base_offset", "log_start_offset", ...}} for v7..v12."""
    r = Reader(body)
    flexible = version >= 9
    result = {}

    def record_error(r):
        batch_index, message = r.i32(), r.compact_string() if flexible else r.string()
        if flexible:
            r.tags()
        return batch_index, message

    def partition(r, topic):
        p = {"index": r.i32(), "error_code": r.i16(), "base_offset": r.i64(), "log_append_time_ms": r.i64()}
        p["log_start_offset"] = r.i64()
        if version >= 8:
            p["record_errors"] = (r.compact_array if flexible else r.array)(record_error) or []
            p["error_message"] = r.compact_string() if flexible else r.string()
        if flexible:
            r.tags()
        result[(topic, p["index"])] = p

    def topic(r):
        name = r.compact_string() if flexible else r.string()
        (r.compact_array if flexible else r.array)(lambda r: partition(r, name))
        if flexible:
            r.tags()

    (r.compact_array if flexible else r.array)(topic)
    r.i32()  # throttle_time_ms
    if flexible:
        r.tags()
    return result


def parse_init_producer_id_v0(body):
    r = Reader(body)
    return {"throttle_time_ms": r.i32(), "error_code": r.i16(), "producer_id": r.i64(), "producer_epoch": r.i16()}


def parse_metadata_v8(body):
    """{"brokers": [...], "cluster_id", "controller_id", "topics": {name: {"error_code", "partitions"}}}."""
    r = Reader(body)
    r.i32()  # throttle_time_ms
    brokers = r.array(lambda r: {"node_id": r.i32(), "host": r.string(), "port": r.i32(), "rack": r.string()})
    cluster_id = r.string()
    controller_id = r.i32()

    def partition(r):
        p = {"error_code": r.i16(), "index": r.i32(), "leader": r.i32(), "leader_epoch": r.i32()}
        p["replicas"] = r.array(Reader.i32)
        p["isr"] = r.array(Reader.i32)
        p["offline"] = r.array(Reader.i32)
        return p

    def topic(r):
        t = {"error_code": r.i16(), "name": r.string(), "is_internal": r.boolean()}
        t["partitions"] = r.array(partition)
        r.i32()  # topic_authorized_operations
        return t

    topics = r.array(topic)
    r.i32()  # cluster_authorized_operations
    return {
        "brokers": brokers,
        "cluster_id": cluster_id,
        "controller_id": controller_id,
        "topics": {t["name"]: t for t in topics},
    }


# ---- connection --------------------------------------------------------------------------
class Closed(Exception):
    """The broker closed the connection (or reset it) instead of answering."""


class Connection:
    """One TCP connection to a broker; requests are framed with header v1 (or v2 when flexible)."""

    def __init__(self, bootstrap, timeout_s=15.0, client_id="ferrolog-wire"):
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.client_id = client_id
        self.next_correlation_id = 1

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send_raw(self, data: bytes):
        self.sock.sendall(data)

    def send(self, api_key, api_version, body, flexible=False):
        """Frame and send one request; returns its correlation id."""
        correlation_id = self.next_correlation_id
        self.next_correlation_id += 1
        header = i16(api_key) + i16(api_version) + i32(correlation_id) + string(self.client_id)
        if flexible:
            header += NO_TAGS
        payload = header + body
        self.sock.sendall(i32(len(payload)) + payload)
        return correlation_id

    def _read_exactly(self, n):
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except ConnectionResetError as e:
                raise Closed(f"connection reset after {len(buf)} of {n} bytes") from e
            if not chunk:
                raise Closed(f"connection closed after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def receive(self, correlation_id, flexible_header=False):
        """The body of the next response, checking that it answers `correlation_id`.

        Response header v1 (flexible APIs other than ApiVersions) has a tagged-field
        section after the correlation id.
        """
        (size,) = struct.unpack(">i", self._read_exactly(4))
        frame = self._read_exactly(size)
        r = Reader(frame)
        got = r.i32()
        assert got == correlation_id, f"response has correlation id {got}, expected {correlation_id}"
        if flexible_header:
            r.tags()
        return frame[r.pos :]

    def request(self, api_key, api_version, body, flexible=False):
        """Send one request and return its response body. ApiVersions always answers with header v0."""
        cid = self.send(api_key, api_version, body, flexible=flexible)
        return self.receive(cid, flexible_header=flexible and api_key != API_VERSIONS)

    def closed_by_peer(self, timeout_s=10.0):
        """True when the broker closes the connection within timeout_s without sending anything."""
        self.sock.settimeout(timeout_s)
        try:
            data = self.sock.recv(1)
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False
        return data == b""


def produce(conn, topic_partitions, version=9, acks=-1, timeout_ms=10_000):
    """Send a Produce request and return parse_produce's dict."""
    encode = produce_v9 if version >= 9 else produce_v7
    body = conn.request(PRODUCE, version, encode(topic_partitions, acks, timeout_ms), flexible=version >= 9)
    return parse_produce(body, version)


# Retriable InitProducerId errors: Apache Kafka answers COORDINATOR_LOAD_IN_PROGRESS
# until its producer id manager has a block of ids from the controller.
_INIT_PRODUCER_ID_RETRIABLE = {COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR}


def init_producer_id(conn, timeout_s=30.0):
    """A fresh idempotent producer id and epoch (InitProducerId v0, no transactional id)."""
    deadline = time.monotonic() + timeout_s
    while True:
        resp = parse_init_producer_id_v0(conn.request(INIT_PRODUCER_ID, 0, init_producer_id_v0()))
        if resp["error_code"] not in _INIT_PRODUCER_ID_RETRIABLE or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert resp["error_code"] == NONE, f"InitProducerId failed: {resp}"
    return resp["producer_id"], resp["producer_epoch"]
