#!/usr/bin/env bash
# install-kafka-cli.sh — Kafka's own command-line tools (kafka-topics.sh, kafka-configs.sh,
# ...) for machines without an Apache Kafka download, as the README's examples use them.
#
# Usage: scripts/install-kafka-cli.sh      (idempotent)
#        export PATH="$PWD/.cache/kafka/bin:$PATH"
#
# Result: <repo>/.cache/kafka/bin/kafka-*.sh, each running the same main class as the script
# of that name in Apache Kafka 4.1's bin/, on the jars scripts/fetch-apache-kafka.sh puts in
# .cache/apache-kafka/lib (Maven Central). An Apache Kafka 4.1 download's bin/ works the
# same with ferrolog; these exist because no release tarball is reachable from here.
#
# Needs: java 17+ and mvn on PATH (scripts/install-test-deps.sh installs them, and calls
# this script).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin_dir="$repo_root/.cache/kafka/bin"
"$repo_root/scripts/fetch-apache-kafka.sh"

# Script name -> main class, as in Apache Kafka 4.1's bin/.
tools=(
    "kafka-topics.sh org.apache.kafka.tools.TopicCommand"
    "kafka-configs.sh kafka.admin.ConfigCommand"
    "kafka-consumer-groups.sh org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
    "kafka-console-producer.sh org.apache.kafka.tools.ConsoleProducer"
    "kafka-console-consumer.sh org.apache.kafka.tools.consumer.ConsoleConsumer"
    "kafka-get-offsets.sh org.apache.kafka.tools.GetOffsetShell"
    "kafka-transactions.sh org.apache.kafka.tools.TransactionsCommand"
)
mkdir -p "$bin_dir"
for tool in "${tools[@]}"; do
    read -r name class <<<"$tool"
    cat >"$bin_dir/$name" <<SCRIPT
#!/usr/bin/env bash
# Written by scripts/install-kafka-cli.sh: Apache Kafka's $name.
exec java -Xmx512m -Dlog4j2.configurationFile="$repo_root/scripts/apache-kafka/tools-log4j2.properties" \\
    -cp "$repo_root/.cache/apache-kafka/lib/*" $class "\$@"
SCRIPT
    chmod +x "$bin_dir/$name"
done
echo "install-kafka-cli: ${#tools[@]} tools in $bin_dir"
