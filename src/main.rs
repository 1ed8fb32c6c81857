//! ferrolog: a Kafka-compatible streaming broker. Thread-per-core (one glommio executor per
//! core, each owning a shard of partitions), Direct I/O appends, fsync before acks=all.
//!
//! `ferrolog start` with no arguments serves 127.0.0.1:9092 with data in `./ferrolog-data`.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

use ferrolog::{config, shard};

#[derive(Parser)]
#[command(
    name = "ferrolog",
    version,
    about = "A Kafka-compatible streaming broker"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a broker.
    Start {
        /// A Kafka-style server.properties file.
        #[arg(long)]
        config: Option<PathBuf>,
        /// KEY=VALUE, Kafka's broker config names; applied after --config, in order.
        #[arg(long = "override", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Shards (glommio executors); default: one per available core.
        #[arg(long)]
        cores: Option<usize>,
    },
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FERROLOG_LOG")
                // openraft narrates elections at info and every failed heartbeat at warn; ferrolog logs
                // what operators act on (fencing, registration) itself.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=error")),
        )
        .with_target(false)
        // Colours for a terminal only, not for a log file or a journal.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    if let Err(e) = run() {
        eprintln!("ferrolog: {e:#}");
        std::process::exit(2);
    }
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Start {
            config,
            overrides,
            cores,
        } => {
            let mut settings = Vec::new();
            if let Some(path) = &config {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                settings.extend(
                    config::parse_properties(&text)
                        .with_context(|| format!("parsing {}", path.display()))?,
                );
            }
            for o in &overrides {
                let (k, v) = o
                    .split_once('=')
                    .with_context(|| format!("--override {o:?}: expected KEY=VALUE"))?;
                settings.push((k.trim().to_string(), v.trim().to_string()));
            }
            let mut broker = config::BrokerConfig::default();
            broker.apply(&settings)?;
            let available = std::thread::available_parallelism().map_or(1, |n| n.get());
            let cores = cores.unwrap_or(available);
            if cores == 0 || cores > 256 {
                anyhow::bail!("--cores must be between 1 and 256");
            }
            shard::run(broker, cores)
        }
    }
}
