"""Bare Kafka requests over one TCP connection, for what the clients do not show: whether a
broker serves requests yet (ApiVersions v0) and a record batch's header (Fetch, in
`batches`). Shared by ferrolog-check, the benchmark harness and the tests.
"""

import socket
import struct

API_VERSIONS = 18


def _read_exactly(s, n):
    data = bytearray()
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError("connection closed mid-response")
        data += chunk
    return bytes(data)


def string(s):
    """A Kafka STRING (int16 length); None is the null string."""
    if s is None:
        return struct.pack(">h", -1)
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def exchange(host, port, api_key, version, body, timeout_s, client_id=None, correlation_id=0x5E7A):
    """Sends one request (header v1) and returns its response after the correlation id,
    which must be ours."""
    request = struct.pack(">hhi", api_key, version, correlation_id) + string(client_id) + body
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.settimeout(timeout_s)
        s.sendall(struct.pack(">i", len(request)) + request)
        size = struct.unpack(">i", _read_exactly(s, 4))[0]
        response = _read_exactly(s, size)
    if struct.unpack(">i", response[:4])[0] != correlation_id:
        raise ConnectionError("a response to another request")
    return response[4:]


def answers_api_versions(host, port, timeout_s=2.0):
    """True when something on host:port answers ApiVersions v0 with our correlation id.

    A listening socket is not enough: Apache Kafka binds its port before it serves
    requests, and the kernel completes connections into the backlog.
    """
    try:
        exchange(host, port, API_VERSIONS, 0, b"", timeout_s)
        return True
    except (OSError, ConnectionError, struct.error):
        return False
