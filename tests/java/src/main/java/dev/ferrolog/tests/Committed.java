package dev.ferrolog.tests;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.time.Duration;
import java.util.LinkedHashSet;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * Prints a group's committed offsets as KafkaConsumer.committed() returns them (one
 * OffsetFetch), without joining the group.
 *
 * <p>Usage: {@code Committed BOOTSTRAP GROUP TOPIC PARTITIONS}. Prints one JSON object:
 * {"0": {"offset": 17, "metadata": "..."}, "1": null, ...}, null where the group has
 * no committed offset for the partition.
 */
public final class Committed {
    private Committed() {}

    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println("usage: Committed BOOTSTRAP GROUP TOPIC PARTITIONS");
            System.exit(2);
        }
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, args[1]);
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        Set<TopicPartition> tps = new LinkedHashSet<>();
        for (int p = 0; p < Integer.parseInt(args[3]); p++) {
            tps.add(new TopicPartition(args[2], p));
        }
        ObjectNode out = new ObjectMapper().createObjectNode();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            Map<TopicPartition, OffsetAndMetadata> committed = consumer.committed(tps, Duration.ofSeconds(60));
            for (TopicPartition tp : tps) {
                OffsetAndMetadata om = committed.get(tp);
                String key = Integer.toString(tp.partition());
                if (om == null) {
                    out.putNull(key);
                } else {
                    ObjectNode o = out.putObject(key);
                    o.put("offset", om.offset());
                    o.put("metadata", om.metadata());
                }
            }
        }
        System.out.println(out.toString());
    }
}
