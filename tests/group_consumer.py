#!/usr/bin/env python3
"""One member of a consumer group, through confluent-kafka (librdkafka), for
test_consumer_groups_clients.py. Not a test itself: the test starts several of
these as processes, kills one with SIGKILL, stops the others with SIGTERM and
reads what they wrote.

Usage: group_consumer.py BOOTSTRAP GROUP TOPIC PROTOCOL DELAY_MS
  PROTOCOL  range | cooperative-sticky (classic protocol, client-side assignor)
            | consumer (KIP-848, the broker assigns)
  DELAY_MS  processing time per record, so that consumption takes a while

Writes one JSON object per line to stdout, flushed at once, each with "t"
(wall-clock seconds, comparable between processes on one machine) and "ev":
  assign  {"partitions": [...]}  partitions added (eager: the whole new assignment)
  revoke  {"partitions": [...]}  partitions taken away
  lost    {"partitions": [...]}  partitions lost without a clean revoke
  msg     {"p", "o", "v"}        a record consumed (logged before it is processed)
  commit  {"offsets": {p: o}}    a synchronous commit that succeeded, offsets as committed
  commit_failed {"error"}        a commit that did not
  error   {"error"}              an error event from the consumer
Processing = log, sleep DELAY_MS. After each batch from consume() it commits,
synchronously, the next offset of every partition processed and not yet committed;
a commit that fails (say, ILLEGAL_GENERATION during a rebalance) is tried again
after the next batch, or in the revoke callback for partitions being taken away
(partitions lost are forgotten). SIGTERM: close the consumer (which revokes,
commits and leaves the group) and exit 0.
"""

import json
import signal
import sys
import time

from confluent_kafka import Consumer, KafkaException, TopicPartition

bootstrap, group, topic, protocol, delay_ms = sys.argv[1:6]
delay_s = int(delay_ms) / 1000.0
stopping = False


def log(ev, **fields):
    sys.stdout.write(json.dumps({"t": time.time(), "ev": ev, **fields}) + "\n")
    sys.stdout.flush()


def on_sigterm(signum, frame):
    global stopping
    stopping = True


signal.signal(signal.SIGTERM, on_sigterm)

config = {
    "bootstrap.servers": bootstrap,
    "group.id": group,
    "client.id": f"group-consumer-{protocol}",
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "error_cb": lambda err: log("error", error=str(err)),
}
if protocol == "consumer":
    # KIP-848: session timeout, heartbeat interval and assignor are the broker's
    # (group.consumer.*); librdkafka refuses the classic settings here.
    config["group.protocol"] = "consumer"
else:
    config.update(
        {
            "group.protocol": "classic",
            "partition.assignment.strategy": protocol,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            # Also the rebalance timeout the client sends in JoinGroup: bounds how long
            # a rebalance may wait for a member that does not rejoin.
            "max.poll.interval.ms": 20000,
        }
    )

consumer = Consumer(config)
pending = {}  # partition -> next offset: processed, not yet committed


def commit_pending(only=None):
    offsets = {p: o for p, o in pending.items() if only is None or p in only}
    if not offsets:
        return
    try:
        done = consumer.commit(
            offsets=[TopicPartition(topic, p, o) for p, o in sorted(offsets.items())], asynchronous=False
        )
    except KafkaException as e:
        log("commit_failed", error=str(e.args[0]))
        return
    ok = {tp.partition: tp.offset for tp in done if tp.error is None}
    bad = [f"{tp.partition}: {tp.error}" for tp in done if tp.error is not None]
    for p, o in ok.items():
        if pending.get(p) == o:
            del pending[p]
    if ok:
        log("commit", offsets={str(p): o for p, o in sorted(ok.items())})
    if bad:
        log("commit_failed", error="; ".join(bad))


def parts(partitions):
    return sorted(tp.partition for tp in partitions)


def on_assign(c, partitions):
    log("assign", partitions=parts(partitions))


def on_revoke(c, partitions):
    log("revoke", partitions=parts(partitions))
    revoked = set(parts(partitions))
    commit_pending(revoked)
    for p in revoked:
        pending.pop(p, None)


def on_lost(c, partitions):
    log("lost", partitions=parts(partitions))
    for p in parts(partitions):
        pending.pop(p, None)


consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
log("start")
try:
    while not stopping:
        msgs = consumer.consume(num_messages=20, timeout=0.5)
        for m in msgs:
            if m.error():
                log("error", error=str(m.error()))
                continue
            log("msg", p=m.partition(), o=m.offset(), v=m.value().decode())
            time.sleep(delay_s)
            pending[m.partition()] = m.offset() + 1
        commit_pending()
finally:
    consumer.close()
    log("closed")
