package dev.ferrolog.tests;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.File;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Drives the round trip of tests/roundtrip.py with Kafka's own Java client.
 *
 * <p>Usage: {@code RoundTrip BOOTSTRAP SPEC_JSON RESULT_JSON}. Creates the spec's topic
 * with Admin, produces each compression group with its own idempotent KafkaProducer
 * (acks=all) and waits for all acks before the next group, reads every partition from
 * the beginning with KafkaConsumer.assign (no group), answers the offsetsForTimes
 * look-ups and writes what it saw to RESULT_JSON. It judges nothing: the Python test
 * compares the result with what it asked for. Any client exception ends the program
 * with a non-zero status and the stack trace on stderr.
 */
public final class RoundTrip {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final Duration DEADLINE = Duration.ofSeconds(90);

    private RoundTrip() {}

    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: RoundTrip BOOTSTRAP SPEC_JSON RESULT_JSON");
            System.exit(2);
        }
        String bootstrap = args[0];
        JsonNode spec = JSON.readTree(new File(args[1]));
        String topic = spec.get("topic").asText();
        int partitions = spec.get("partitions").asInt();
        ObjectNode result = JSON.createObjectNode();

        try (Admin admin = Admin.create(Map.of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap))) {
            admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get();
        }

        ArrayNode acks = result.putArray("acks");
        for (JsonNode group : spec.get("groups")) {
            produceGroup(bootstrap, topic, group, acks);
        }

        List<TopicPartition> tps = new ArrayList<>();
        for (int p = 0; p < partitions; p++) {
            tps.add(new TopicPartition(topic, p));
        }
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consumerConfig(bootstrap))) {
            consumer.assign(tps);
            Map<TopicPartition, Long> start = consumer.beginningOffsets(tps, DEADLINE);
            Map<TopicPartition, Long> end = consumer.endOffsets(tps, DEADLINE);
            ObjectNode startJson = result.putObject("start_offsets");
            ObjectNode endJson = result.putObject("end_offsets");
            for (TopicPartition tp : tps) {
                startJson.put(Integer.toString(tp.partition()), start.get(tp));
                endJson.put(Integer.toString(tp.partition()), end.get(tp));
            }

            consumer.seekToBeginning(tps);
            ArrayNode records = result.putArray("records");
            long deadline = System.nanoTime() + DEADLINE.toNanos();
            while (!caughtUp(consumer, tps, end)) {
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException("did not reach end offsets " + end + " within " + DEADLINE);
                }
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(500))) {
                    records.add(recordJson(r));
                }
            }

            ArrayNode answers = result.putArray("time_queries");
            for (JsonNode q : spec.get("time_queries")) {
                TopicPartition tp = new TopicPartition(topic, q.get("partition").asInt());
                long ts = q.get("timestamp").asLong();
                // One look-up per query, as a user would make it; null means no such offset.
                OffsetAndTimestamp hit = consumer.offsetsForTimes(Map.of(tp, ts), DEADLINE).get(tp);
                ObjectNode a = answers.addObject();
                a.put("partition", tp.partition());
                a.put("timestamp", ts);
                if (hit == null) {
                    a.putNull("offset");
                } else {
                    a.put("offset", hit.offset());
                }
            }
        }
        JSON.writeValue(new File(args[2]), result);
    }

    private static void produceGroup(String bootstrap, String topic, JsonNode group, ArrayNode acks)
            throws Exception {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, group.get("compression").asText());
        props.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (JsonNode r : group.get("records")) {
                RecordHeaders headers = new RecordHeaders();
                for (JsonNode h : r.get("headers")) {
                    headers.add(h.get(0).asText(), bytes(h.get(1)));
                }
                sent.add(producer.send(new ProducerRecord<>(
                        topic,
                        r.get("partition").asInt(),
                        r.get("timestamp").asLong(),
                        bytes(r.get("key")),
                        bytes(r.get("value")),
                        headers)));
            }
            producer.flush();
            for (Future<RecordMetadata> f : sent) {
                RecordMetadata md = f.get();
                ObjectNode a = acks.addObject();
                a.put("partition", md.partition());
                a.put("offset", md.offset());
            }
        }
    }

    private static Properties consumerConfig(String bootstrap) {
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        return props;
    }

    private static boolean caughtUp(KafkaConsumer<?, ?> consumer, List<TopicPartition> tps, Map<TopicPartition, Long> end) {
        for (TopicPartition tp : tps) {
            if (consumer.position(tp) < end.get(tp)) {
                return false;
            }
        }
        return true;
    }

    private static ObjectNode recordJson(ConsumerRecord<byte[], byte[]> r) {
        ObjectNode o = JSON.createObjectNode();
        o.put("partition", r.partition());
        o.put("offset", r.offset());
        o.put("timestamp", r.timestamp());
        o.put("timestamp_type", r.timestampType().name);
        o.put("key", text(r.key()));
        o.put("value", text(r.value()));
        ArrayNode hs = o.putArray("headers");
        for (Header h : r.headers()) {
            ArrayNode pair = hs.addArray();
            pair.add(h.key());
            pair.add(text(h.value()));
        }
        return o;
    }

    private static byte[] bytes(JsonNode n) {
        return n == null || n.isNull() ? null : n.asText().getBytes(StandardCharsets.UTF_8);
    }

    private static String text(byte[] b) {
        return b == null ? null : new String(b, StandardCharsets.UTF_8);
    }
}
