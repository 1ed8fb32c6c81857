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
  * consumer groups (at the end): FindCoordinator, JoinGroup, SyncGroup,
    Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, DescribeGroups, ListGroups,
    DeleteGroups, OffsetDelete, ConsumerGroupHeartbeat and ConsumerGroupDescribe
    requests and responses at the versions the clients send, the consumer
    protocol's subscription and assignment blobs, and `group_call`, which picks
    the header version for each API;
  * `Connection`: one TCP connection that frames requests with request header
    v1 or v2 and reads responses by correlation id.

Field layouts follow Kafka's message schemas (clients/src/main/resources/common/
message/*.json) and the record batch layout of KIP-98.
"""

import base64
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
# consumer groups
OFFSET_METADATA_TOO_LARGE = 12
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
INVALID_GROUP_ID = 24
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
INVALID_REQUEST = 42
NON_EMPTY_GROUP = 68
GROUP_ID_NOT_FOUND = 69
MEMBER_ID_REQUIRED = 79
GROUP_MAX_SIZE_REACHED = 81
FENCED_INSTANCE_ID = 82
GROUP_SUBSCRIBED_TO_TOPIC = 86
FENCED_MEMBER_EPOCH = 110
UNRELEASED_INSTANCE_ID = 111
UNSUPPORTED_ASSIGNOR = 112
STALE_MEMBER_EPOCH = 113

# ---- API keys ------------------------------------------------------------------
PRODUCE = 0
METADATA = 3
API_VERSIONS = 18
CREATE_TOPICS = 19
DELETE_TOPICS = 20
CREATE_PARTITIONS = 37
INCREMENTAL_ALTER_CONFIGS = 44
INIT_PRODUCER_ID = 22
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
FIND_COORDINATOR = 10
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
DESCRIBE_GROUPS = 15
LIST_GROUPS = 16
DELETE_GROUPS = 42
OFFSET_DELETE = 47
CONSUMER_GROUP_HEARTBEAT = 68
CONSUMER_GROUP_DESCRIBE = 69


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

    def bytes_(self):
        """BYTES / NULLABLE_BYTES: int32 length, -1 for null."""
        n = self.i32()
        return None if n < 0 else self.raw(n)

    def compact_bytes(self):
        n = self.uvarint()
        return None if n == 0 else self.raw(n - 1)

    def uuid(self):
        """A UUID, as Kafka prints it: URL-safe base64 of the 16 bytes, without padding."""
        return base64.urlsafe_b64encode(self.raw(16)).decode().rstrip("=")


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


def create_topics_v4(topics, timeout_ms=30000):
    """topics: list of (name, partitions, replication factor), no assignments or configs."""
    each = [string(n) + i32(p) + i16(rf) + array([]) + array([]) for n, p, rf in topics]
    return array(each) + i32(timeout_ms) + boolean(False)  # validate_only


def delete_topics_v1(names, timeout_ms=30000):
    return array([string(n) for n in names]) + i32(timeout_ms)


def create_partitions_v1(topic, count, timeout_ms=30000):
    return array([string(topic) + i32(count) + i32(-1)]) + i32(timeout_ms) + boolean(False)


def incremental_alter_topic_config_v0(topic, name, value):
    """SET (operation 0) one config of one topic (resource type 2)."""
    return array([i8(2) + string(topic) + array([string(name) + i8(0) + string(value)])]) + boolean(False)


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


# ---- consumer groups ------------------------------------------------------------------
# Layouts from Kafka's message schemas for FindCoordinator (10), JoinGroup (11),
# SyncGroup (14), Heartbeat (12), LeaveGroup (13), OffsetCommit (8), OffsetFetch (9),
# DescribeGroups (15), ListGroups (16), DeleteGroups (42), OffsetDelete (47),
# ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69), for the versions
# Apache Kafka 4.1 serves (topic-id OffsetCommit v10 / OffsetFetch v10 are not
# among them). Encoders take a `version` and follow the schema's per-version
# fields; decoders return plain dicts with the schema's field names in snake_case.

# First flexible version of each group API (None: never flexible).
FLEXIBLE_FROM = {
    OFFSET_COMMIT: 8,
    OFFSET_FETCH: 6,
    FIND_COORDINATOR: 3,
    JOIN_GROUP: 6,
    HEARTBEAT: 4,
    LEAVE_GROUP: 4,
    SYNC_GROUP: 4,
    DESCRIBE_GROUPS: 5,
    LIST_GROUPS: 3,
    DELETE_GROUPS: 2,
    OFFSET_DELETE: None,
    CONSUMER_GROUP_HEARTBEAT: 0,
    CONSUMER_GROUP_DESCRIBE: 0,
}


def is_flexible(api_key, version):
    first = FLEXIBLE_FROM[api_key]
    return first is not None and version >= first


def group_call(conn, api_key, version, body):
    """Send one group-API request with the right header version; returns the response body."""
    return conn.request(api_key, version, body, flexible=is_flexible(api_key, version))


def _str(v, flex):
    return compact_string(v) if flex else string(v)


def _bytes(v, flex):
    return compact_bytes(v) if flex else nullable_bytes(v)


def _arr(items, flex):
    return compact_array(items) if flex else array(items)


def _nullable_arr(items, flex):
    if items is None:
        return uvarint(0) if flex else i32(-1)
    return _arr(items, flex)


def _tags(flex):
    return NO_TAGS if flex else b""


def uuid_bytes(text):
    """The 16 bytes of a UUID printed the Kafka way (URL-safe base64 without padding)."""
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class _GroupReader(Reader):
    """A Reader that knows whether the response is in a flexible version."""

    def __init__(self, data, flex):
        super().__init__(data)
        self.flex = flex

    def s(self):
        return self.compact_string() if self.flex else self.string()

    def b(self):
        return self.compact_bytes() if self.flex else self.bytes_()

    def a(self, item):
        return (self.compact_array if self.flex else self.array)(item)

    def t(self):
        if self.flex:
            self.tags()


# -- FindCoordinator
def find_coordinator(keys, version=6, key_type=0):
    """keys: group ids (key_type 0) or transactional ids (1); v0-v3 carry exactly one key."""
    flex = version >= 3
    if isinstance(keys, str):
        keys = [keys]
    out = b""
    if version <= 3:
        assert len(keys) == 1, "FindCoordinator v0-v3 carry one key"
        out += _str(keys[0], flex)
    if version >= 1:
        out += i8(key_type)
    if version >= 4:
        out += _arr([_str(k, flex) for k in keys], flex)
    return out + _tags(flex)


def parse_find_coordinator(body, version):
    """{"coordinators": [{"key", "node_id", "host", "port", "error_code", "error_message"}]}."""
    r = _GroupReader(body, version >= 3)
    out = {"throttle_time_ms": r.i32() if version >= 1 else 0}
    if version <= 3:
        c = {"key": None, "error_code": r.i16()}
        c["error_message"] = r.s() if version >= 1 else None
        c["node_id"], c["host"], c["port"] = r.i32(), r.s(), r.i32()
        out["coordinators"] = [c]
    else:

        def coordinator(r):
            c = {"key": r.s(), "node_id": r.i32(), "host": r.s(), "port": r.i32(), "error_code": r.i16()}
            c["error_message"] = r.s()
            r.t()
            return c

        out["coordinators"] = r.a(coordinator)
    r.t()
    return out


_COORDINATOR_RETRIABLE = {COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR}


def wait_for_coordinator(bootstrap, group, timeout_s=60.0, version=6):
    """FindCoordinator until it names a coordinator for `group` (Kafka answers
    COORDINATOR_NOT_AVAILABLE while it creates and loads __consumer_offsets)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with Connection(bootstrap) as conn:
            resp = parse_find_coordinator(
                group_call(conn, FIND_COORDINATOR, version, find_coordinator(group, version)), version
            )
        c = resp["coordinators"][0]
        if c["error_code"] not in _COORDINATOR_RETRIABLE or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert c["error_code"] == NONE, f"FindCoordinator for {group!r} failed: {c}"
    return c


# -- JoinGroup
def join_group(
    group,
    member_id="",
    protocols=(("range", b""),),
    version=9,
    session_timeout_ms=10_000,
    rebalance_timeout_ms=10_000,
    instance_id=None,
    protocol_type="consumer",
    reason=None,
):
    """protocols: (name, metadata bytes) pairs, in the member's order of preference."""
    flex = version >= 6
    out = _str(group, flex) + i32(session_timeout_ms)
    if version >= 1:
        out += i32(rebalance_timeout_ms)
    out += _str(member_id, flex)
    if version >= 5:
        out += _str(instance_id, flex)
    out += _str(protocol_type, flex)
    out += _arr([_str(name, flex) + _bytes(meta, flex) + _tags(flex) for name, meta in protocols], flex)
    if version >= 8:
        out += _str(reason, flex)
    return out + _tags(flex)


def parse_join_group(body, version):
    """{"error_code", "generation_id", "protocol_type", "protocol_name", "leader", "member_id",
    "skip_assignment", "members": [{"member_id", "group_instance_id", "metadata"}]}."""
    r = _GroupReader(body, version >= 6)
    out = {"throttle_time_ms": r.i32() if version >= 2 else 0, "error_code": r.i16(), "generation_id": r.i32()}
    out["protocol_type"] = r.s() if version >= 7 else None
    out["protocol_name"] = r.s()
    out["leader"] = r.s()
    out["skip_assignment"] = r.boolean() if version >= 9 else False
    out["member_id"] = r.s()

    def member(r):
        m = {"member_id": r.s()}
        m["group_instance_id"] = r.s() if version >= 5 else None
        m["metadata"] = r.b()
        r.t()
        return m

    out["members"] = r.a(member)
    r.t()
    return out


# -- SyncGroup
def sync_group(
    group,
    generation_id,
    member_id,
    assignments=None,
    version=5,
    instance_id=None,
    protocol_type="consumer",
    protocol_name=None,
):
    """assignments: {member_id: assignment bytes} (the leader's), or None/{} for followers."""
    flex = version >= 4
    out = _str(group, flex) + i32(generation_id) + _str(member_id, flex)
    if version >= 3:
        out += _str(instance_id, flex)
    if version >= 5:
        out += _str(protocol_type, flex) + _str(protocol_name, flex)
    items = (assignments or {}).items()
    out += _arr([_str(m, flex) + _bytes(a, flex) + _tags(flex) for m, a in items], flex)
    return out + _tags(flex)


def parse_sync_group(body, version):
    r = _GroupReader(body, version >= 4)
    out = {"throttle_time_ms": r.i32() if version >= 1 else 0, "error_code": r.i16()}
    out["protocol_type"] = r.s() if version >= 5 else None
    out["protocol_name"] = r.s() if version >= 5 else None
    out["assignment"] = r.b()
    r.t()
    return out


# -- Heartbeat
def heartbeat(group, generation_id, member_id, version=4, instance_id=None):
    flex = version >= 4
    out = _str(group, flex) + i32(generation_id) + _str(member_id, flex)
    if version >= 3:
        out += _str(instance_id, flex)
    return out + _tags(flex)


def parse_heartbeat(body, version):
    r = _GroupReader(body, version >= 4)
    out = {"throttle_time_ms": r.i32() if version >= 1 else 0, "error_code": r.i16()}
    r.t()
    return out


# -- LeaveGroup
def leave_group(group, members, version=5, reason=None):
    """members: (member_id, group_instance_id) pairs; v0-v2 carry exactly one member id."""
    flex = version >= 4
    out = _str(group, flex)
    if version <= 2:
        assert len(members) == 1, "LeaveGroup v0-v2 carry one member"
        out += _str(members[0][0], flex)
    else:
        out += _arr(
            [
                _str(m, flex) + _str(inst, flex) + (_str(reason, flex) if version >= 5 else b"") + _tags(flex)
                for m, inst in members
            ],
            flex,
        )
    return out + _tags(flex)


def parse_leave_group(body, version):
    """{"error_code", "members": [{"member_id", "group_instance_id", "error_code"}]}."""
    r = _GroupReader(body, version >= 4)
    out = {"throttle_time_ms": r.i32() if version >= 1 else 0, "error_code": r.i16(), "members": []}
    if version >= 3:

        def member(r):
            m = {"member_id": r.s(), "group_instance_id": r.s(), "error_code": r.i16()}
            r.t()
            return m

        out["members"] = r.a(member)
    r.t()
    return out


# -- OffsetCommit
def offset_commit(group, offsets, generation_id=-1, member_id="", instance_id=None, version=9):
    """offsets: {(topic, partition): offset or (offset, metadata) or (offset, metadata, leader_epoch)}.

    Generation -1 with an empty member id is a commit from outside the group
    (a standalone consumer or an admin tool). v2+ only.
    """
    assert 2 <= version <= 9, "OffsetCommit v2..v9 (v10 names topics by id)"
    flex = version >= 8
    topics = {}
    for (topic, partition), value in offsets.items():
        if isinstance(value, int):
            value = (value,)
        offset, metadata, leader_epoch = (*value, "", -1)[:3] if len(value) == 1 else (*value, -1)[:3]
        topics.setdefault(topic, []).append((partition, offset, metadata, leader_epoch))
    out = _str(group, flex) + i32(generation_id) + _str(member_id, flex)
    if version >= 7:
        out += _str(instance_id, flex)
    if version <= 4:
        out += i64(-1)  # retention_time_ms: the broker's default
    out += _arr(
        [
            _str(t, flex)
            + _arr(
                [
                    i32(p) + i64(o) + (i32(e) if version >= 6 else b"") + _str(m, flex) + _tags(flex)
                    for p, o, m, e in parts
                ],
                flex,
            )
            + _tags(flex)
            for t, parts in topics.items()
        ],
        flex,
    )
    return out + _tags(flex)


def parse_offset_commit(body, version):
    """{(topic, partition): error_code}."""
    r = _GroupReader(body, version >= 8)
    if version >= 3:
        r.i32()  # throttle_time_ms
    out = {}

    def topic(r):
        name = r.s()

        def partition(r):
            p, code = r.i32(), r.i16()
            r.t()
            out[(name, p)] = code

        r.a(partition)
        r.t()

    r.a(topic)
    r.t()
    return out


# -- OffsetFetch
def offset_fetch(group, topics=None, version=9, member_id=None, member_epoch=-1, require_stable=False):
    """topics: {topic: [partitions]}, or None for every partition the group has offsets for.

    v8+ batch groups; this asks for one. v9 carries the member id and epoch of a
    KIP-848 member (null / -1 from outside the group).
    """
    assert 1 <= version <= 9, "OffsetFetch v1..v9 (v10 names topics by id)"
    flex = version >= 6
    topic_items = (
        None
        if topics is None
        else [_str(t, flex) + _arr([i32(p) for p in parts], flex) + _tags(flex) for t, parts in topics.items()]
    )
    if version <= 7:
        out = _str(group, flex) + (_nullable_arr(topic_items, flex) if version >= 2 else _arr(topic_items, flex))
    else:
        g = _str(group, flex)
        if version >= 9:
            g += _str(member_id, flex) + i32(member_epoch)
        g += _nullable_arr(topic_items, flex) + _tags(flex)
        out = _arr([g], flex)
    if version >= 7:
        out += boolean(require_stable)
    return out + _tags(flex)


def parse_offset_fetch(body, version):
    """{"error_code", "offsets": {(topic, partition): {"offset", "leader_epoch", "metadata", "error_code"}}}
    for the (first) group asked about."""
    r = _GroupReader(body, version >= 6)
    if version >= 3:
        r.i32()  # throttle_time_ms

    def topics(r, into):
        def topic(r):
            name = r.s()

            def partition(r):
                p = r.i32()
                o = {"offset": r.i64()}
                o["leader_epoch"] = r.i32() if version >= 5 else -1
                o["metadata"], o["error_code"] = r.s(), r.i16()
                r.t()
                into[(name, p)] = o

            r.a(partition)
            r.t()

        r.a(topic)

    if version <= 7:
        out = {"group_id": None, "offsets": {}}
        topics(r, out["offsets"])
        out["error_code"] = r.i16() if version >= 2 else NONE
        r.t()
        return out

    def group(r):
        g = {"group_id": r.s(), "offsets": {}}
        topics(r, g["offsets"])
        g["error_code"] = r.i16()
        r.t()
        return g

    groups = r.a(group)
    r.t()
    return groups[0]


# -- DescribeGroups
def describe_groups(groups, version=6, include_authorized_operations=False):
    flex = version >= 5
    out = _arr([_str(g, flex) for g in groups], flex)
    if version >= 3:
        out += boolean(include_authorized_operations)
    return out + _tags(flex)


def parse_describe_groups(body, version):
    """[{"error_code", "error_message", "group_id", "state", "protocol_type", "protocol_data",
    "members": [{"member_id", "group_instance_id", "client_id", "client_host", "metadata", "assignment"}]}]."""
    r = _GroupReader(body, version >= 5)
    if version >= 1:
        r.i32()  # throttle_time_ms

    def member(r):
        m = {"member_id": r.s()}
        m["group_instance_id"] = r.s() if version >= 4 else None
        m["client_id"], m["client_host"], m["metadata"], m["assignment"] = r.s(), r.s(), r.b(), r.b()
        r.t()
        return m

    def group(r):
        g = {"error_code": r.i16()}
        g["error_message"] = r.s() if version >= 6 else None
        g["group_id"], g["state"], g["protocol_type"], g["protocol_data"] = r.s(), r.s(), r.s(), r.s()
        g["members"] = r.a(member)
        if version >= 3:
            g["authorized_operations"] = r.i32()
        r.t()
        return g

    groups = r.a(group)
    r.t()
    return groups


# -- ListGroups
def list_groups(states=(), types=(), version=5):
    """states (v4+) and types (v5+) filter; empty means all."""
    flex = version >= 3
    out = b""
    if version >= 4:
        out += _arr([_str(s, flex) for s in states], flex)
    if version >= 5:
        out += _arr([_str(t, flex) for t in types], flex)
    return out + _tags(flex)


def parse_list_groups(body, version):
    """{"error_code", "groups": {group_id: {"protocol_type", "state", "type"}}}."""
    r = _GroupReader(body, version >= 3)
    if version >= 1:
        r.i32()  # throttle_time_ms
    out = {"error_code": r.i16(), "groups": {}}

    def group(r):
        g = {"group_id": r.s(), "protocol_type": r.s()}
        g["state"] = r.s() if version >= 4 else None
        g["type"] = r.s() if version >= 5 else None
        r.t()
        out["groups"][g["group_id"]] = g

    r.a(group)
    r.t()
    return out


# -- DeleteGroups
def delete_groups(groups, version=2):
    flex = version >= 2
    return _arr([_str(g, flex) for g in groups], flex) + _tags(flex)


def parse_delete_groups(body, version):
    """{group_id: error_code}."""
    r = _GroupReader(body, version >= 2)
    r.i32()  # throttle_time_ms
    out = {}

    def result(r):
        g, code = r.s(), r.i16()
        r.t()
        out[g] = code

    r.a(result)
    r.t()
    return out


# -- OffsetDelete (v0 only, never flexible)
def offset_delete(group, topics):
    """topics: {topic: [partitions]}."""
    return string(group) + array([string(t) + array([i32(p) for p in parts]) for t, parts in topics.items()])


def parse_offset_delete(body):
    """{"error_code", "partitions": {(topic, partition): error_code}}."""
    r = Reader(body)
    out = {"error_code": r.i16()}
    r.i32()  # throttle_time_ms
    parts = {}

    def topic(r):
        name = r.string()
        r.array(lambda r: parts.__setitem__((name, r.i32()), r.i16()))

    r.array(topic)
    out["partitions"] = parts
    return out


# -- ConsumerGroupHeartbeat (KIP-848)
def consumer_group_heartbeat(
    group,
    member_id,
    member_epoch,
    version=1,
    instance_id=None,
    rack_id=None,
    rebalance_timeout_ms=-1,
    subscribed_topic_names=None,
    subscribed_topic_regex=None,
    server_assignor=None,
    topic_partitions=None,
):
    """None means "unchanged since the last heartbeat" for every optional field.
    topic_partitions: [(topic id as printed by Kafka, [partitions])] the member owns."""
    flex = True
    out = _str(group, flex) + _str(member_id, flex) + i32(member_epoch)
    out += _str(instance_id, flex) + _str(rack_id, flex) + i32(rebalance_timeout_ms)
    out += _nullable_arr(
        None if subscribed_topic_names is None else [_str(t, flex) for t in subscribed_topic_names], flex
    )
    if version >= 1:
        out += _str(subscribed_topic_regex, flex)
    out += _str(server_assignor, flex)
    owned = None
    if topic_partitions is not None:
        owned = [uuid_bytes(tid) + _arr([i32(p) for p in parts], flex) + NO_TAGS for tid, parts in topic_partitions]
    out += _nullable_arr(owned, flex)
    return out + NO_TAGS


def parse_consumer_group_heartbeat(body):
    """{"error_code", "error_message", "member_id", "member_epoch", "heartbeat_interval_ms",
    "assignment": None or {topic id: [partitions]}}."""
    r = _GroupReader(body, True)
    out = {"throttle_time_ms": r.i32(), "error_code": r.i16(), "error_message": r.s(), "member_id": r.s()}
    out["member_epoch"], out["heartbeat_interval_ms"] = r.i32(), r.i32()
    present = r.i8()
    out["assignment"] = None
    if present >= 0:
        assignment = {}

        def topic(r):
            tid = r.uuid()
            assignment[tid] = sorted(r.a(Reader.i32))
            r.t()

        r.a(topic)
        r.t()
        out["assignment"] = assignment
    r.t()
    return out


# -- ConsumerGroupDescribe (KIP-848)
def consumer_group_describe(groups, version=1, include_authorized_operations=False):
    return compact_array([compact_string(g) for g in groups]) + boolean(include_authorized_operations) + NO_TAGS


def parse_consumer_group_describe(body, version):
    """[{"error_code", "error_message", "group_id", "state", "epoch", "assignment_epoch", "assignor",
    "members": [{"member_id", "instance_id", "rack_id", "member_epoch", "client_id", "client_host",
    "subscribed_topic_names", "subscribed_topic_regex", "assignment", "target_assignment", "member_type"}]}]
    with assignments as {topic name: [partitions]}."""
    r = _GroupReader(body, True)
    r.i32()  # throttle_time_ms

    def assignment(r):
        out = {}

        def tp(r):
            r.uuid()
            name = r.s()
            out[name] = sorted(r.a(Reader.i32))
            r.t()

        r.a(tp)
        r.t()
        return out

    def member(r):
        m = {"member_id": r.s(), "instance_id": r.s(), "rack_id": r.s(), "member_epoch": r.i32()}
        m["client_id"], m["client_host"] = r.s(), r.s()
        m["subscribed_topic_names"] = r.a(_GroupReader.s)
        m["subscribed_topic_regex"] = r.s()
        m["assignment"] = assignment(r)
        m["target_assignment"] = assignment(r)
        m["member_type"] = r.i8() if version >= 1 else None
        r.t()
        return m

    def group(r):
        g = {"error_code": r.i16(), "error_message": r.s(), "group_id": r.s(), "state": r.s()}
        g["epoch"], g["assignment_epoch"], g["assignor"] = r.i32(), r.i32(), r.s()
        g["members"] = r.a(member)
        g["authorized_operations"] = r.i32()
        r.t()
        return g

    groups = r.a(group)
    r.t()
    return groups


# -- the consumer protocol's JoinGroup metadata and SyncGroup assignment blobs
def consumer_subscription(topics, version=1, user_data=None, owned=None, generation_id=-1, rack_id=None):
    """ConsumerProtocolSubscription (versioned, never flexible); owned: {topic: [partitions]} (v1+)."""
    out = i16(version) + array([string(t) for t in topics]) + nullable_bytes(user_data)
    if version >= 1:
        out += array([string(t) + array([i32(p) for p in ps]) for t, ps in (owned or {}).items()])
    if version >= 2:
        out += i32(generation_id)
    if version >= 3:
        out += string(rack_id)
    return out


def parse_consumer_subscription(data):
    r = Reader(data)
    version = r.i16()
    out = {"version": version, "topics": r.array(Reader.string), "user_data": r.bytes_()}
    if version >= 1 and r.remaining():
        out["owned"] = {t: ps for t, ps in r.array(lambda r: (r.string(), r.array(Reader.i32)))}
    return out


def consumer_assignment(partitions, version=1, user_data=None):
    """ConsumerProtocolAssignment; partitions: {topic: [partitions]}."""
    return (
        i16(version)
        + array([string(t) + array([i32(p) for p in ps]) for t, ps in partitions.items()])
        + nullable_bytes(user_data)
    )


def parse_consumer_assignment(data):
    """{topic: sorted partitions}; empty for an empty (or null) assignment."""
    if not data:
        return {}
    r = Reader(data)
    r.i16()  # version
    return {t: sorted(ps) for t, ps in r.array(lambda r: (r.string(), r.array(Reader.i32)))}


# ---- OffsetForLeaderEpoch (API 23) -------------------------------------------------
OFFSET_FOR_LEADER_EPOCH = 23


def offset_for_leader_epoch(port, topic, partition, leader_epoch, current_leader_epoch):
    """OffsetForLeaderEpoch v3 as a consumer sends it (replica id -1) for one partition:
    the answer's error_code, leader_epoch and end_offset."""
    body = i32(-1) + array([string(topic) + array([i32(partition) + i32(current_leader_epoch) + i32(leader_epoch)])])
    conn = Connection(f"127.0.0.1:{port}")
    try:
        r = Reader(conn.request(OFFSET_FOR_LEADER_EPOCH, 3, body))
    finally:
        conn.sock.close()
    r.i32()  # throttle time
    topics = r.array(lambda t: (t.string(), t.array(lambda p: {
        "error_code": p.i16(), "partition": p.i32(), "leader_epoch": p.i32(), "end_offset": p.i64(),
    })))  # fmt: skip
    return topics[0][1][0]


def parse_create_topics_v4(body):
    """{topic: (error_code, error_message)} from a CreateTopics v4 response."""
    r = Reader(body)
    r.i32()  # throttle_time_ms
    return {r.string(): (r.i16(), r.string()) for _ in range(r.i32())}


def parse_delete_topics_v1(body):
    """{topic: error_code} from a DeleteTopics v1 response."""
    r = Reader(body)
    r.i32()  # throttle_time_ms
    return {r.string(): r.i16() for _ in range(r.i32())}


def parse_create_partitions_v1(body):
    """{topic: (error_code, error_message)} from a CreatePartitions v1 response."""
    r = Reader(body)
    r.i32()  # throttle_time_ms
    return {r.string(): (r.i16(), r.string()) for _ in range(r.i32())}


def parse_incremental_alter_configs_v0(body):
    """{resource name: (error_code, error_message)} from an IncrementalAlterConfigs v0 response."""
    r = Reader(body)
    r.i32()  # throttle_time_ms
    out = {}
    for _ in range(r.i32()):
        code, message, _type, name = r.i16(), r.string(), r.i8(), r.string()
        out[name] = (code, message)
    return out
