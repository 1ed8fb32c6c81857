package dev.ferrolog.tests;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * The Java client's transactional producer against one topic, and read_committed and
 * read_uncommitted consumers reading it back.
 *
 * <p>Usage: {@code TxnRoundTrip BOOTSTRAP TOPIC PARTITIONS RESULT_JSON}. The topic must
 * exist. Writes, in order: a committed transaction (commit-1-*), an aborted one whose
 * records were sent (abort-2-*), a committed one (commit-3-*); then a second producer with
 * the same transactional id fences the first (whose next commit fails) and commits
 * commit-4-*; a third producer leaves a transaction open (open-5-*) while both consumers'
 * end offsets are taken, then commits it; a fourth, with a 2 s transaction timeout, sends
 * timeout-6-* and waits until the coordinator has aborted it. The result holds every
 * value each consumer read, the end offsets with the transaction open, and the exceptions
 * the fenced and the timed-out producers got.
 */
public final class TxnRoundTrip {
    private TxnRoundTrip() {}

    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println("usage: TxnRoundTrip BOOTSTRAP TOPIC PARTITIONS RESULT_JSON");
            System.exit(2);
        }
        String bootstrap = args[0];
        String topic = args[1];
        int partitions = Integer.parseInt(args[2]);
        ObjectNode out = new ObjectMapper().createObjectNode();

        KafkaProducer<String, String> first = producer(bootstrap, "txn-java", 60_000);
        first.initTransactions();
        send(first, topic, partitions, "commit-1", 30, true);
        first.beginTransaction();
        for (int i = 0; i < 20; i++) {
            first.send(record(topic, partitions, "abort-2", i));
        }
        first.flush();
        first.abortTransaction();
        send(first, topic, partitions, "commit-3", 10, true);

        // A second producer with the same id fences the first.
        KafkaProducer<String, String> second = producer(bootstrap, "txn-java", 60_000);
        second.initTransactions();
        out.put("fenced", failure(() -> send(first, topic, partitions, "zombie", 3, true)));
        first.close(Duration.ZERO);
        send(second, topic, partitions, "commit-4", 5, true);
        second.close();

        // An open transaction holds read_committed's end offsets back.
        KafkaProducer<String, String> open = producer(bootstrap, "txn-java-open", 60_000);
        open.initTransactions();
        open.beginTransaction();
        for (int i = 0; i < 4; i++) {
            open.send(record(topic, partitions, "open-5", i));
        }
        open.flush();
        out.set("end_offsets_open", endOffsets(bootstrap, topic, partitions));
        open.commitTransaction();
        open.close();

        // A transaction past its timeout is aborted by the coordinator, which fences its
        // producer.
        KafkaProducer<String, String> slow = producer(bootstrap, "txn-java-slow", 2_000);
        slow.initTransactions();
        slow.beginTransaction();
        for (int i = 0; i < 3; i++) {
            slow.send(record(topic, partitions, "timeout-6", i));
        }
        slow.flush();
        // The coordinator's abort moves read_committed's end offsets up to read_uncommitted's.
        long deadline = System.currentTimeMillis() + 60_000;
        while (System.currentTimeMillis() < deadline) {
            ObjectNode ends = endOffsets(bootstrap, topic, partitions);
            if (ends.get("read_committed").asLong() == ends.get("read_uncommitted").asLong()) {
                break;
            }
            Thread.sleep(200);
        }
        out.put("timed_out", failure(slow::commitTransaction));
        slow.close(Duration.ZERO);

        out.set("end_offsets", endOffsets(bootstrap, topic, partitions));
        out.set("read_committed", readAll(bootstrap, topic, partitions, "read_committed"));
        out.set("read_uncommitted", readAll(bootstrap, topic, partitions, "read_uncommitted"));
        Files.writeString(Path.of(args[3]), out.toString());
    }

    private static KafkaProducer<String, String> producer(String bootstrap, String id, int timeoutMs) {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, id);
        props.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, timeoutMs);
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        return new KafkaProducer<>(props);
    }

    private static ProducerRecord<String, String> record(String topic, int partitions, String prefix, int i) {
        return new ProducerRecord<>(topic, i % partitions, "k" + i, prefix + "-" + i);
    }

    private static void send(KafkaProducer<String, String> p, String topic, int partitions, String prefix, int n,
            boolean commit) {
        p.beginTransaction();
        for (int i = 0; i < n; i++) {
            p.send(record(topic, partitions, prefix, i));
        }
        if (commit) {
            p.commitTransaction();
        } else {
            p.abortTransaction();
        }
    }

    /** The class of the exception `action` threw, or null. */
    private static String failure(Runnable action) {
        try {
            action.run();
            return null;
        } catch (RuntimeException e) {
            return e.getClass().getSimpleName();
        }
    }

    private static KafkaConsumer<String, String> consumer(String bootstrap, String isolation) {
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        return new KafkaConsumer<>(props);
    }

    private static List<TopicPartition> tps(String topic, int partitions) {
        List<TopicPartition> tps = new ArrayList<>();
        for (int p = 0; p < partitions; p++) {
            tps.add(new TopicPartition(topic, p));
        }
        return tps;
    }

    /** Both isolation levels' end offsets (ListOffsets latest), summed over partitions. */
    private static ObjectNode endOffsets(String bootstrap, String topic, int partitions) {
        ObjectNode out = new ObjectMapper().createObjectNode();
        for (String isolation : new String[] {"read_committed", "read_uncommitted"}) {
            try (KafkaConsumer<String, String> c = consumer(bootstrap, isolation)) {
                long sum = 0;
                for (long end : c.endOffsets(tps(topic, partitions), Duration.ofSeconds(30)).values()) {
                    sum += end;
                }
                out.put(isolation, sum);
            }
        }
        return out;
    }

    /** Every value up to the end offsets of `isolation`, from the beginning. */
    private static ArrayNode readAll(String bootstrap, String topic, int partitions, String isolation) {
        ArrayNode values = new ObjectMapper().createArrayNode();
        try (KafkaConsumer<String, String> c = consumer(bootstrap, isolation)) {
            List<TopicPartition> tps = tps(topic, partitions);
            c.assign(tps);
            c.seekToBeginning(tps);
            Map<TopicPartition, Long> ends = c.endOffsets(tps, Duration.ofSeconds(30));
            long deadline = System.currentTimeMillis() + 60_000;
            while (System.currentTimeMillis() < deadline) {
                boolean done = true;
                for (TopicPartition tp : tps) {
                    done &= c.position(tp) >= ends.get(tp);
                }
                if (done) {
                    break;
                }
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500))) {
                    values.add(r.value());
                }
            }
        }
        return values;
    }
}
