package dev.ferrolog.tests;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.CooperativeStickyAssignor;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.RangeAssignor;
import org.apache.kafka.clients.consumer.RoundRobinAssignor;
import org.apache.kafka.clients.consumer.StickyAssignor;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * A consumer-group member as an application would write it: subscribe, poll, "process"
 * each record (log it, then sleep --pace-ms), commitSync the processed positions after
 * every poll, and commit what is still pending when partitions are revoked.
 *
 * <p>Usage: {@code GroupConsumer --bootstrap B --group G --topic T [options]}
 *
 * <pre>
 *   --protocol classic|consumer      group.protocol (default classic)
 *   --strategy range|cooperative-sticky|sticky|roundrobin
 *                                    partition.assignment.strategy, classic only (default range)
 *   --remote-assignor NAME           group.remote.assignor, consumer protocol only
 *   --instance-id ID                 group.instance.id (static membership)
 *   --client-id ID                   client.id
 *   --session-timeout-ms N           session.timeout.ms, classic only
 *   --heartbeat-interval-ms N        heartbeat.interval.ms, classic only
 *   --max-poll-records N             max.poll.records (default 20)
 *   --pace-ms N                      sleep after each record (default 0)
 *   --metadata TEMPLATE              commit metadata; {partition} and {offset} are replaced
 *   --max-records N                  process exactly N records, then stop (or hold)
 *   --hold                           after --max-records: pause every partition and stay
 *                                    in the group (polling) until --stop-file appears
 *   --idle-ms N                      stop after N ms without a record (default 30000),
 *                                    counted from the first assignment
 *   --stop-file PATH                 stop as soon as this file exists
 * </pre>
 *
 * <p>Writes one JSON object per line to stdout, flushed at once (a kill -9 loses nothing
 * that was printed). Every event has "ev" and "ts" (wall clock, microseconds since the
 * epoch, comparable between processes on one machine) and, where a group is joined,
 * "gen" (consumer.groupMetadata().generationId(); the member epoch for the consumer
 * protocol):
 *
 * <pre>
 *   {"ev":"start", "pid":..., "client_id":...}
 *   {"ev":"assigned"|"revoked"|"lost", "partitions":[...], "assignment":[...]}  (rebalance listener)
 *   {"ev":"record", "p":..., "o":..., "key":..., "value":...}                (one per processed record)
 *   {"ev":"committing", "offsets":{"p":offset,...}}                           (before commitSync)
 *   {"ev":"commit", "offsets":{"p":offset,...}, "where":"poll"|"revoke"}      (commitSync returned)
 *   {"ev":"commit_failed", "offsets":{...}, "error":"..."}
 *   {"ev":"hold"} {"ev":"closing", "reason":...} {"ev":"closed"}
 * </pre>
 *
 * <p>It judges nothing; the Python tests check the logs. Any other exception ends the
 * program with status 1 after an {"ev":"error"} line.
 */
public final class GroupConsumer implements ConsumerRebalanceListener {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final PrintStream OUT = new PrintStream(System.out, false, StandardCharsets.UTF_8);

    private final KafkaConsumer<String, String> consumer;
    private final String metadataTemplate;
    /** Processed positions (last processed offset + 1) not yet committed, per partition. */
    private final Map<TopicPartition, Long> pending = new HashMap<>();

    private GroupConsumer(KafkaConsumer<String, String> consumer, String metadataTemplate) {
        this.consumer = consumer;
        this.metadataTemplate = metadataTemplate;
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> opt = parse(args);
        String bootstrap = required(opt, "bootstrap");
        String group = required(opt, "group");
        String topic = required(opt, "topic");
        String protocol = opt.getOrDefault("protocol", "classic");
        String clientId = opt.getOrDefault("client-id", "group-consumer-" + ProcessHandle.current().pid());
        long paceMs = Long.parseLong(opt.getOrDefault("pace-ms", "0"));
        long maxRecords = Long.parseLong(opt.getOrDefault("max-records", "-1"));
        long idleMs = Long.parseLong(opt.getOrDefault("idle-ms", "30000"));
        boolean hold = opt.containsKey("hold");
        Path stopFile = opt.containsKey("stop-file") ? Path.of(opt.get("stop-file")) : null;

        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, clientId);
        props.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, opt.getOrDefault("max-poll-records", "20"));
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        if (opt.containsKey("instance-id")) {
            props.put(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, opt.get("instance-id"));
        }
        if (protocol.equalsIgnoreCase("classic")) {
            props.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, assignor(opt.getOrDefault("strategy", "range")));
            if (opt.containsKey("session-timeout-ms")) {
                props.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, opt.get("session-timeout-ms"));
            }
            if (opt.containsKey("heartbeat-interval-ms")) {
                props.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, opt.get("heartbeat-interval-ms"));
            }
        } else if (opt.containsKey("remote-assignor")) {
            props.put(ConsumerConfig.GROUP_REMOTE_ASSIGNOR_CONFIG, opt.get("remote-assignor"));
        }

        ObjectNode start = event("start");
        start.put("pid", ProcessHandle.current().pid());
        start.put("client_id", clientId);
        start.put("protocol", protocol);
        emit(start);

        int status = 0;
        KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props);
        GroupConsumer app = new GroupConsumer(consumer, opt.get("metadata"));
        try {
            consumer.subscribe(List.of(topic), app);
            long processed = 0;
            long lastProgress = System.nanoTime();
            boolean assignedOnce = false;
            boolean holding = false;
            String reason;
            while (true) {
                if (stopFile != null && Files.exists(stopFile)) {
                    reason = "stop-file";
                    break;
                }
                if (!holding && maxRecords >= 0 && processed >= maxRecords) {
                    if (!hold) {
                        reason = "max-records";
                        break;
                    }
                    holding = true;
                    emit(event("hold"));
                }
                if (holding) {
                    // Stay a member with fixed committed offsets: no more records.
                    consumer.pause(consumer.assignment());
                }
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(200));
                if (!consumer.assignment().isEmpty() && !assignedOnce) {
                    assignedOnce = true;
                    lastProgress = System.nanoTime();
                }
                if (holding) {
                    // Paused partitions return no records; retry a commit that failed, if any.
                    app.commitPending(app.pendingFor(consumer.assignment()), "poll");
                    continue;
                }
                int gen = consumer.groupMetadata().generationId();
                for (ConsumerRecord<String, String> r : records) {
                    if (maxRecords >= 0 && processed >= maxRecords) {
                        break;
                    }
                    ObjectNode e = event("record");
                    e.put("gen", gen);
                    e.put("p", r.partition());
                    e.put("o", r.offset());
                    e.put("key", r.key());
                    e.put("value", r.value());
                    emit(e);
                    app.pending.put(new TopicPartition(r.topic(), r.partition()), r.offset() + 1);
                    processed++;
                    lastProgress = System.nanoTime();
                    if (paceMs > 0) {
                        Thread.sleep(paceMs);
                    }
                }
                app.commitPending(app.pendingFor(consumer.assignment()), "poll");
                if (assignedOnce && !holding && System.nanoTime() - lastProgress > idleMs * 1_000_000L) {
                    reason = "idle";
                    break;
                }
            }
            ObjectNode closing = event("closing");
            closing.put("reason", reason);
            closing.put("processed", processed);
            emit(closing);
        } catch (Exception e) {
            ObjectNode err = event("error");
            err.put("error", e.toString());
            emit(err);
            e.printStackTrace();
            status = 1;
        } finally {
            consumer.close();
            emit(event("closed"));
        }
        System.exit(status);
    }

    private Map<TopicPartition, Long> pendingFor(Collection<TopicPartition> partitions) {
        Map<TopicPartition, Long> out = new LinkedHashMap<>();
        for (TopicPartition tp : partitions) {
            Long o = pending.get(tp);
            if (o != null) {
                out.put(tp, o);
            }
        }
        return out;
    }

    private void commitPending(Map<TopicPartition, Long> positions, String where) {
        if (positions.isEmpty()) {
            return;
        }
        Map<TopicPartition, OffsetAndMetadata> offsets = new LinkedHashMap<>();
        for (Map.Entry<TopicPartition, Long> e : positions.entrySet()) {
            String md = metadataTemplate == null ? ""
                    : metadataTemplate.replace("{partition}", Integer.toString(e.getKey().partition()))
                            .replace("{offset}", Long.toString(e.getValue()));
            offsets.put(e.getKey(), new OffsetAndMetadata(e.getValue(), md));
        }
        ObjectNode before = event("committing");
        before.set("offsets", offsetsJson(positions));
        before.put("where", where);
        emit(before);
        try {
            consumer.commitSync(offsets);
        } catch (RuntimeException ex) {
            // CommitFailedException, RebalanceInProgressException, ...: the records stay
            // pending and are committed with the next poll or on revocation, if still ours.
            ObjectNode e = event("commit_failed");
            e.put("gen", consumer.groupMetadata().generationId());
            e.set("offsets", offsetsJson(positions));
            e.put("where", where);
            e.put("error", ex.toString());
            emit(e);
            if (ex instanceof org.apache.kafka.common.errors.WakeupException
                    || ex instanceof org.apache.kafka.common.errors.InterruptException) {
                throw ex;
            }
            return;
        }
        ObjectNode e = event("commit");
        e.put("gen", consumer.groupMetadata().generationId());
        e.set("offsets", offsetsJson(positions));
        e.put("where", where);
        emit(e);
        for (Map.Entry<TopicPartition, Long> p : positions.entrySet()) {
            pending.remove(p.getKey(), p.getValue());
        }
    }

    @Override
    public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
        rebalanceEvent("revoked", partitions);
        commitPending(pendingFor(partitions), "revoke");
        for (TopicPartition tp : partitions) {
            pending.remove(tp);
        }
    }

    @Override
    public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
        rebalanceEvent("assigned", partitions);
    }

    @Override
    public void onPartitionsLost(Collection<TopicPartition> partitions) {
        rebalanceEvent("lost", partitions);
        for (TopicPartition tp : partitions) {
            pending.remove(tp); // no longer ours: another member may already own it
        }
    }

    private void rebalanceEvent(String name, Collection<TopicPartition> partitions) {
        ObjectNode e = event(name);
        e.put("gen", consumer.groupMetadata().generationId());
        e.put("member_id", consumer.groupMetadata().memberId());
        ArrayNode ps = e.putArray("partitions");
        partitions.stream().mapToInt(TopicPartition::partition).sorted().forEach(ps::add);
        ArrayNode as = e.putArray("assignment");
        consumer.assignment().stream().mapToInt(TopicPartition::partition).sorted().forEach(as::add);
        emit(e);
    }

    private static ObjectNode offsetsJson(Map<TopicPartition, Long> positions) {
        Map<Integer, Long> sorted = new TreeMap<>();
        positions.forEach((tp, off) -> sorted.put(tp.partition(), off));
        ObjectNode o = JSON.createObjectNode();
        sorted.forEach((p, off) -> o.put(Integer.toString(p), off));
        return o;
    }

    private static ObjectNode event(String name) {
        ObjectNode e = JSON.createObjectNode();
        e.put("ev", name);
        Instant now = Instant.now();
        e.put("ts", now.getEpochSecond() * 1_000_000L + now.getNano() / 1_000);
        return e;
    }

    private static synchronized void emit(ObjectNode e) {
        OUT.println(e.toString());
        OUT.flush();
    }

    private static String assignor(String name) {
        switch (name) {
            case "range":
                return RangeAssignor.class.getName();
            case "roundrobin":
                return RoundRobinAssignor.class.getName();
            case "sticky":
                return StickyAssignor.class.getName();
            case "cooperative-sticky":
                return CooperativeStickyAssignor.class.getName();
            default:
                throw new IllegalArgumentException("unknown --strategy " + name);
        }
    }

    private static Map<String, String> parse(String[] args) {
        Map<String, String> opt = new HashMap<>();
        List<String> flags = new ArrayList<>(List.of("hold"));
        for (int i = 0; i < args.length; i++) {
            if (!args[i].startsWith("--")) {
                throw new IllegalArgumentException("unexpected argument " + args[i]);
            }
            String key = args[i].substring(2);
            if (flags.contains(key)) {
                opt.put(key, "true");
            } else if (i + 1 < args.length) {
                opt.put(key, args[++i]);
            } else {
                throw new IllegalArgumentException("--" + key + " needs a value");
            }
        }
        return opt;
    }

    private static String required(Map<String, String> opt, String key) {
        String v = opt.get(key);
        if (v == null) {
            System.err.println("usage: GroupConsumer --bootstrap B --group G --topic T [options]; missing --" + key);
            System.exit(2);
        }
        return v;
    }
}
