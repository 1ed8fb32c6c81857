//! ferrolog-bench: the load generator that drives ferrolog and Apache Kafka with the same
//! traffic, plus the machine probes and the plots of the side-by-side report.
//!
//! It speaks the Kafka protocol itself (kafka-protocol's message types, record batches
//! encoded here), over blocking TCP connections with a thread per connection side. The
//! harness (`bench/harness.py`, run by `scripts/bench.sh`) starts the brokers and calls
//! the subcommands below; each writes its figures as JSON.
//!
//! - `run`: open-loop producers and/or consumers against one topic (see producer.rs,
//!   consumer.rs).
//! - `startup-probe`: retries a one-record acks=all produce until the first success and
//!   says when it came.
//! - `hw-probe`: disk and loopback limits (hwprobe.rs).
//! - `plot`: SVG charts from a JSON spec (plot.rs).
//! - `flamegraph`: an SVG flame graph and the top functions from `perf script` output
//!   (flame.rs).

mod batch;
mod consumer;
mod flame;
mod hwprobe;
mod plot;
mod producer;
mod stats;
mod txn;
mod wire;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use serde::Serialize;

use consumer::{ConsumeLive, ConsumeOpts, ConsumerResult, StartAt};
use producer::{Partitioner, ProduceLive, ProduceOpts, ProduceResult};
use stats::Timeline;

#[derive(Parser)]
#[command(
    name = "ferrolog-bench",
    version,
    about = "Kafka load generator for ferrolog vs Apache Kafka"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Produce and/or consume against one topic; prints (or writes) JSON results.
    Run(Box<RunArgs>),
    /// Create a topic (an existing one with the same partition count is fine).
    CreateTopic {
        #[arg(long, default_value = "127.0.0.1:9092")]
        bootstrap: String,
        #[arg(long)]
        topic: String,
        #[arg(long, default_value_t = 1)]
        partitions: i32,
        #[arg(long, default_value_t = 1)]
        replication_factor: i16,
        /// Topic config KEY=VALUE (repeatable).
        #[arg(long = "config", value_name = "KEY=VALUE")]
        configs: Vec<String>,
        #[arg(long, default_value_t = 120_000)]
        timeout_ms: i32,
    },
    /// Retry a one-record acks=all produce until it succeeds; print when it did.
    StartupProbe {
        #[arg(long, default_value = "127.0.0.1:9092")]
        bootstrap: String,
        #[arg(long)]
        topic: String,
        /// Create the topic (1 partition) first if it does not exist.
        #[arg(long)]
        create: bool,
        /// Reference time (unix nanoseconds, e.g. when the broker was exec'd).
        #[arg(long)]
        since_unix_ns: Option<u128>,
        #[arg(long, default_value_t = 180.0)]
        timeout_s: f64,
    },
    /// Measure the machine: Direct I/O bandwidth, fdatasync latency, loopback TCP.
    HwProbe {
        /// A directory on the disk the brokers write to.
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 1024)]
        file_mib: u64,
        #[arg(long, default_value_t = 1024)]
        block_kib: usize,
        #[arg(long, default_value_t = 500)]
        fsync_count: u64,
        #[arg(long, default_value_t = 5.0)]
        tcp_seconds: f64,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// One transactional producer committing every N records (see txn.rs); prints JSON.
    TxnProduce {
        #[command(flatten)]
        opts: txn::TxnOpts,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Render SVG charts from a JSON spec (see plot.rs).
    Plot {
        #[arg(long)]
        spec: PathBuf,
        #[arg(long)]
        out_dir: PathBuf,
    },
    /// Fold `perf script` output into an SVG flame graph and list the functions most often
    /// on CPU themselves (see flame.rs).
    Flamegraph {
        /// `perf script` output of a `perf record --call-graph` run.
        #[arg(long)]
        perf_script: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value = "")]
        title: String,
        /// Write the total samples and the top functions here as JSON.
        #[arg(long)]
        top_json: Option<PathBuf>,
    },
}

#[derive(Args, Clone)]
struct RunArgs {
    #[arg(long, default_value = "127.0.0.1:9092")]
    bootstrap: String,
    #[arg(long)]
    topic: String,
    /// Create the topic with this many partitions first (fine if it exists with as many).
    #[arg(long)]
    create_partitions: Option<i32>,
    /// Topic config KEY=VALUE for --create-partitions (repeatable).
    #[arg(long = "topic-config", value_name = "KEY=VALUE")]
    topic_configs: Vec<String>,
    /// Label shown on the progress line.
    #[arg(long, default_value = "run")]
    label: String,
    /// Write the results here instead of stdout.
    #[arg(long)]
    json: Option<PathBuf>,

    // Producers.
    /// Producer connections (0 = consume only).
    #[arg(long, default_value_t = 2)]
    producers: usize,
    #[arg(long, default_value_t = 1024)]
    record_bytes: usize,
    /// Records per second over all producers; 0 = closed loop, as fast as acknowledged.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Length of the run, warm-up included.
    #[arg(long, default_value_t = 20.0)]
    duration_s: f64,
    /// Records intended in the first seconds are not measured.
    #[arg(long, default_value_t = 5.0)]
    warmup_s: f64,
    /// Kafka's max.in.flight.requests.per.connection.
    #[arg(long, default_value_t = 5)]
    max_in_flight: usize,
    /// Kafka's batch.size.
    #[arg(long, default_value_t = 131_072)]
    batch_bytes: usize,
    /// Kafka's linger.ms.
    #[arg(long, default_value_t = 5.0)]
    linger_ms: f64,
    /// all, 1 or 0 (0 is not supported: the bench needs responses).
    #[arg(long, default_value = "all")]
    acks: String,
    /// Kafka's buffer.memory.
    #[arg(long, default_value_t = 32 << 20)]
    buffer_bytes: usize,
    /// Kafka's max.request.size.
    #[arg(long, default_value_t = 1 << 20)]
    request_bytes_max: usize,
    #[arg(long, value_enum, default_value_t = Partitioner::Sticky)]
    partitioner: Partitioner,
    /// Distinct keys with `--partitioner keyed`.
    #[arg(long, default_value_t = 10_000)]
    keys: usize,
    #[arg(long, default_value_t = 10.0)]
    drain_timeout_s: f64,
    /// Stop producing after this many records in total (0 = no cap; --duration-s still
    /// bounds the run). Throughput is then measured up to the last acknowledgement.
    #[arg(long, default_value_t = 0)]
    records: u64,
    /// Kafka's request.timeout.ms (sent as the produce timeout).
    #[arg(long, default_value_t = 30_000)]
    request_timeout_ms: i32,

    // Consumers.
    /// Independent consumers, each reading every partition (assign, no group).
    #[arg(long, default_value_t = 0)]
    consumers: usize,
    #[arg(long, value_enum, default_value_t = StartAt::Latest)]
    consume_from: StartAt,
    /// Kafka's fetch.max.wait.ms.
    #[arg(long, default_value_t = 500)]
    fetch_max_wait_ms: i32,
    /// Kafka's fetch.min.bytes.
    #[arg(long, default_value_t = 1)]
    fetch_min_bytes: i32,
    /// Kafka's fetch.max.bytes.
    #[arg(long, default_value_t = 52_428_800)]
    fetch_max_bytes: i32,
    /// Kafka's max.partition.fetch.bytes.
    #[arg(long, default_value_t = 1_048_576)]
    partition_max_bytes: i32,
    /// Do not parse records (no end-to-end latency; counts from batch headers only).
    #[arg(long)]
    no_parse_records: bool,
    /// Check every fetched batch's CRC32C (Kafka's check.crcs).
    #[arg(long)]
    verify_crc: bool,
    /// Consumers read with isolation.level=read_committed.
    #[arg(long)]
    read_committed: bool,
    /// Catch-up consumers give up after this long.
    #[arg(long, default_value_t = 600.0)]
    consume_timeout_s: f64,
}

#[derive(Serialize)]
struct RunOutput {
    label: String,
    produce_options: Option<ProduceOpts>,
    consume_options: Option<ConsumeOpts>,
    produce: Option<ProduceResult>,
    consumers: Vec<ConsumerResult>,
    /// Sum over consumers (records, MB/s) and the worst consumer's end-to-end latency.
    consume_total: Option<ConsumeTotal>,
    /// (second, records, batch bytes) received per second over all consumers.
    consume_timeline: Vec<(u64, u64, u64)>,
}

#[derive(Serialize)]
struct ConsumeTotal {
    records: u64,
    batch_bytes: u64,
    throughput_mbps: f64,
    e2e_p50_us_max: u64,
    e2e_p99_us_max: u64,
    e2e_p999_us_max: u64,
    e2e_max_us: u64,
    crc_errors: u64,
    reached_end: bool,
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("ferrolog-bench: {e:#}");
        std::process::exit(1);
    }
}

fn real_main() -> Result<()> {
    match Cli::parse().command {
        Command::Run(a) => run(*a),
        Command::CreateTopic {
            bootstrap,
            topic,
            partitions,
            replication_factor,
            configs,
            timeout_ms,
        } => {
            let mut conn = wire::Conn::connect(&bootstrap, Duration::from_secs(10))?;
            let t = Instant::now();
            conn.create_topic(
                &topic,
                partitions,
                replication_factor,
                &parse_kv(&configs)?,
                timeout_ms,
            )?;
            // CreateTopics answers before every partition has a leader on some brokers.
            wait_for_leaders(
                &mut conn,
                &topic,
                partitions,
                Duration::from_millis(timeout_ms as u64),
            )?;
            println!(
                "{}",
                serde_json::json!({"topic": topic, "partitions": partitions, "create_s": t.elapsed().as_secs_f64()})
            );
            Ok(())
        }
        Command::StartupProbe {
            bootstrap,
            topic,
            create,
            since_unix_ns,
            timeout_s,
        } => startup_probe(&bootstrap, &topic, create, since_unix_ns, timeout_s),
        Command::HwProbe {
            dir,
            file_mib,
            block_kib,
            fsync_count,
            tcp_seconds,
            json,
        } => {
            let opts = hwprobe::HwOpts {
                dir,
                file_bytes: file_mib << 20,
                block_bytes: block_kib << 10,
                fsync_count,
                tcp_duration: Duration::from_secs_f64(tcp_seconds),
            };
            let r = hwprobe::run(&opts)?;
            write_json(&r, json.as_deref())
        }
        Command::TxnProduce { opts, json } => write_json(&txn::run(&opts)?, json.as_deref()),
        Command::Plot { spec, out_dir } => {
            for f in plot::render(&spec, &out_dir)? {
                eprintln!("wrote {f}");
            }
            Ok(())
        }
        Command::Flamegraph {
            perf_script,
            out,
            title,
            top_json,
        } => {
            let script = std::fs::read(&perf_script)
                .with_context(|| format!("reading {}", perf_script.display()))?;
            let folded = flame::fold(&String::from_utf8_lossy(&script));
            std::fs::write(&out, flame::svg(&folded, &title))
                .with_context(|| format!("writing {}", out.display()))?;
            let top = serde_json::json!({
                "samples": folded.values().sum::<u64>(),
                "top_self": flame::top_self(&folded, 15),
            });
            write_json(&top, top_json.as_deref())
        }
    }
}

fn parse_kv(items: &[String]) -> Result<Vec<(String, String)>> {
    items
        .iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .with_context(|| format!("'{kv}' is not KEY=VALUE"))
        })
        .collect()
}

fn write_json<T: Serialize>(value: &T, path: Option<&std::path::Path>) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    match path {
        Some(p) => {
            std::fs::write(p, text + "\n").with_context(|| format!("writing {}", p.display()))
        }
        None => {
            println!("{text}");
            Ok(())
        }
    }
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
}

fn wait_for_leaders(
    conn: &mut wire::Conn,
    topic: &str,
    partitions: i32,
    timeout: Duration,
) -> Result<()> {
    let t = Instant::now();
    loop {
        let resp = conn.metadata(Some(&[topic.to_string()]))?;
        let ok = resp.topics.iter().any(|t| {
            t.error_code == 0
                && t.partitions.len() as i32 == partitions
                && t.partitions
                    .iter()
                    .all(|p| p.error_code == 0 && p.leader_id.0 >= 0)
        });
        if ok {
            // Metadata may name a leader before that leader serves the partition: the first
            // answered ListOffsets, asked of each leader, says it does (list_offsets retries
            // until then).
            for (leader, partitions) in conn.partition_leaders(topic)? {
                wire::Conn::connect(&leader, Duration::from_secs(10))?.list_offsets(
                    topic,
                    &partitions,
                    -1,
                )?;
            }
            return Ok(());
        }
        if t.elapsed() > timeout {
            bail!("topic {topic}: not every partition has a leader after {timeout:?}");
        }
        thread::sleep(Duration::from_millis(50));
    }
}

fn run(a: RunArgs) -> Result<()> {
    let acks: i16 = match a.acks.as_str() {
        "all" | "-1" => -1,
        "1" => 1,
        other => bail!("--acks {other}: use all or 1"),
    };
    if let Some(n) = a.create_partitions {
        let mut conn = wire::Conn::connect(&a.bootstrap, Duration::from_secs(10))?;
        conn.create_topic(&a.topic, n, 1, &parse_kv(&a.topic_configs)?, 120_000)?;
        wait_for_leaders(&mut conn, &a.topic, n, Duration::from_secs(120))?;
    }
    let duration = Duration::from_secs_f64(a.duration_s);
    let warmup = Duration::from_secs_f64(a.warmup_s.min(a.duration_s));
    let produce_opts = (a.producers > 0).then(|| ProduceOpts {
        bootstrap: a.bootstrap.clone(),
        topic: a.topic.clone(),
        record_bytes: a.record_bytes.max(batch::PAYLOAD_HEADER_BYTES),
        rate_rps: a.rate,
        duration,
        warmup,
        producers: a.producers,
        max_in_flight: a.max_in_flight.max(1),
        batch_bytes: a.batch_bytes,
        linger: Duration::from_secs_f64(a.linger_ms / 1000.0),
        acks,
        request_timeout_ms: a.request_timeout_ms,
        buffer_bytes: a.buffer_bytes,
        request_bytes_max: a.request_bytes_max,
        partitioner: a.partitioner,
        keys: a.keys,
        records_max: a.records,
        drain_timeout: Duration::from_secs_f64(a.drain_timeout_s),
    });
    let consume_opts = (a.consumers > 0).then(|| ConsumeOpts {
        bootstrap: a.bootstrap.clone(),
        topic: a.topic.clone(),
        start_at: a.consume_from,
        max_wait_ms: a.fetch_max_wait_ms,
        min_bytes: a.fetch_min_bytes,
        max_bytes: a.fetch_max_bytes,
        partition_max_bytes: a.partition_max_bytes,
        parse_records: !a.no_parse_records,
        verify_crc: a.verify_crc,
        read_committed: a.read_committed,
        timeout: Duration::from_secs_f64(a.consume_timeout_s),
    });

    let mut prepared = Vec::new();
    if let Some(o) = &consume_opts {
        for _ in 0..a.consumers {
            prepared.push(consumer::prepare(o)?);
        }
    }
    let timeline_seconds =
        (a.duration_s + a.drain_timeout_s + a.consume_timeout_s.max(30.0) + 60.0) as usize;
    let plive = Arc::new(ProduceLive {
        acked: Timeline::new(timeline_seconds),
        sent_records: AtomicU64::new(0),
        acked_records: AtomicU64::new(0),
        error_records: AtomicU64::new(0),
    });
    let clive = Arc::new(ConsumeLive {
        received: Timeline::new(timeline_seconds),
        records: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let start_unix_us = unix_now().as_micros() as u64;

    let mut consumer_handles = Vec::new();
    for p in prepared {
        let o = consume_opts.clone().expect("consume options");
        let stop = stop.clone();
        let clive = clive.clone();
        let window = if produce_opts.is_some() {
            (warmup, duration)
        } else {
            (Duration::ZERO, Duration::from_secs(u32::MAX as u64))
        };
        consumer_handles.push(
            thread::Builder::new()
                .name("consumer".into())
                .spawn(move || consumer::run(p, &o, start, start_unix_us, window, &stop, clive))?,
        );
    }
    let progress = {
        let (plive, clive, finished, label) = (
            plive.clone(),
            clive.clone(),
            finished.clone(),
            a.label.clone(),
        );
        let record_bytes = a.record_bytes as f64;
        thread::spawn(move || progress_line(&label, start, record_bytes, &plive, &clive, &finished))
    };

    let produce = produce_opts
        .as_ref()
        .map(|o| producer::run(o, start, start_unix_us, plive.clone()));
    stop.store(true, Ordering::Relaxed);
    let mut consumers = Vec::new();
    let mut consumer_error = None;
    for h in consumer_handles {
        match h
            .join()
            .map_err(|_| anyhow::anyhow!("consumer thread panicked"))?
        {
            Ok(r) => consumers.push(r),
            Err(e) => consumer_error = Some(e),
        }
    }
    finished.store(true, Ordering::Relaxed);
    let _ = progress.join();
    let produce = produce.transpose()?;
    if let Some(e) = consumer_error {
        return Err(e.context("a consumer failed"));
    }
    let consume_total = (!consumers.is_empty()).then(|| ConsumeTotal {
        records: consumers.iter().map(|c| c.records).sum(),
        batch_bytes: consumers.iter().map(|c| c.batch_bytes).sum(),
        throughput_mbps: consumers.iter().map(|c| c.throughput_mbps).sum(),
        e2e_p50_us_max: consumers
            .iter()
            .map(|c| c.e2e_latency.p50_us)
            .max()
            .unwrap_or(0),
        e2e_p99_us_max: consumers
            .iter()
            .map(|c| c.e2e_latency.p99_us)
            .max()
            .unwrap_or(0),
        e2e_p999_us_max: consumers
            .iter()
            .map(|c| c.e2e_latency.p999_us)
            .max()
            .unwrap_or(0),
        e2e_max_us: consumers
            .iter()
            .map(|c| c.e2e_latency.max_us)
            .max()
            .unwrap_or(0),
        crc_errors: consumers.iter().map(|c| c.crc_errors).sum(),
        reached_end: consumers.iter().all(|c| c.reached_end),
    });
    let seconds = start.elapsed().as_secs_f64().ceil() as usize;
    let out = RunOutput {
        label: a.label.clone(),
        produce_options: produce_opts,
        consume_options: consume_opts,
        produce,
        consumers,
        consume_total,
        consume_timeline: if a.consumers > 0 {
            clive.received.points(seconds)
        } else {
            Vec::new()
        },
    };
    write_json(&out, a.json.as_deref())
}

/// One status line a second: carriage-return updated on a terminal, a plain line every
/// five seconds otherwise (the harness logs stderr).
fn progress_line(
    label: &str,
    start: Instant,
    record_bytes: f64,
    p: &ProduceLive,
    c: &ConsumeLive,
    finished: &AtomicBool,
) {
    let tty = std::io::stderr().is_terminal();
    let mut last_printed = 0u64;
    while !finished.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(200));
        let secs = start.elapsed().as_secs();
        if secs == last_printed || secs == 0 {
            continue;
        }
        last_printed = secs;
        if !tty && !secs.is_multiple_of(5) {
            continue;
        }
        let (pr, _) = p.acked.second(secs as usize - 1);
        let (cr, cb) = c.received.second(secs as usize - 1);
        let line = format!(
            "[{label}] {secs:>4}s  produce {:>8.1} MB/s {:>8} rec/s (acked {}, errors {})  consume {:>8.1} MB/s",
            pr as f64 * record_bytes / 1e6,
            pr,
            p.acked_records.load(Ordering::Relaxed),
            p.error_records.load(Ordering::Relaxed),
            cb as f64 / 1e6,
        );
        let _ = cr;
        let mut err = std::io::stderr().lock();
        if tty {
            let _ = write!(err, "\r{line}\x1b[K");
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }
    if tty {
        eprintln!();
    }
}

fn startup_probe(
    bootstrap: &str,
    topic: &str,
    create: bool,
    since_unix_ns: Option<u128>,
    timeout_s: f64,
) -> Result<()> {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{ProduceRequest, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let t = Instant::now();
    let mut attempts = 0u64;
    let mut last_error = String::new();
    loop {
        attempts += 1;
        let attempt = || -> Result<()> {
            let mut conn = wire::Conn::connect(bootstrap, Duration::from_secs(2))?;
            if create {
                conn.create_topic(topic, 1, 1, &[], 30_000)?;
            }
            let mut b = batch::BatchBuilder::new(1024);
            let now_us = unix_now().as_micros() as u64;
            b.append((now_us / 1000) as i64, now_us, None, &[0u8; 100]);
            let req = ProduceRequest::default()
                .with_acks(-1)
                .with_timeout_ms(5_000)
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                    .with_partition_data(vec![PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(b.finish()))])]);
            let resp = conn.call(&req)?;
            let code = resp
                .responses
                .first()
                .and_then(|t| t.partition_responses.first())
                .map(|p| p.error_code)
                .unwrap_or(-1);
            if code != 0 {
                bail!("produce error {code} ({})", wire::error_name(code));
            }
            Ok(())
        };
        match attempt() {
            Ok(()) => break,
            Err(e) => last_error = format!("{e:#}"),
        }
        if t.elapsed().as_secs_f64() > timeout_s {
            bail!("no acknowledged produce after {timeout_s} s ({attempts} attempts); last error: {last_error}");
        }
        thread::sleep(Duration::from_millis(10));
    }
    let acked = unix_now();
    let since_ms = since_unix_ns.map(|s| (acked.as_nanos().saturating_sub(s)) as f64 / 1e6);
    println!(
        "{}",
        serde_json::json!({"first_ack_unix_ns": acked.as_nanos() as u64, "since_ms": since_ms, "attempts": attempts, "last_error": last_error})
    );
    Ok(())
}
