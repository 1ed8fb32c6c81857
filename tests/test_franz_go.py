"""franz-go (kgo client, kadm admin), the most widely used pure-Go Kafka client.

franz-go negotiates the newest request versions it knows and is strict about
the protocol, so it catches broker answers that the Java client tolerates.
"""

import json

import roundtrip
from support import CACHE, need, run


def test_franz_go_round_trip(broker, tmp_path):
    """kadm creates the topic; idempotent kgo producers with every codec; direct partition
    consumption reads everything back exactly; kadm.ListOffsetsAfterMilli finds the offsets."""
    binary = need(CACHE / "go" / "franzcheck")
    spec = roundtrip.make_spec("franz-go-roundtrip")
    spec_path, result_path = tmp_path / "spec.json", tmp_path / "result.json"
    spec_path.write_text(json.dumps(spec))

    run([binary, broker.bootstrap, spec_path, result_path], timeout_s=180)

    roundtrip.check(spec, json.loads(result_path.read_text()))
