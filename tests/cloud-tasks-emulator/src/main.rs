//! `cloud-tasks-emulator --port P [--queue projects/p/locations/l/queues/q]...`: serves the Cloud
//! Tasks stand-in on 127.0.0.1 and prints `listening on ADDR` once ready.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use clap::Parser;
use cloud_tasks_emulator::{Emulator, RetryConfig, Settings};

#[derive(Debug, Parser)]
#[command(about = "A local stand-in for the Cloud Tasks REST API (loopback only)")]
struct Args {
    /// Port on 127.0.0.1; 0 picks a free one.
    #[arg(long, default_value_t = 8123)]
    port: u16,
    /// Queues to create at start, as full names. More can be created through the API.
    #[arg(long = "queue")]
    queues: Vec<String>,
    /// Seconds a finished task's name stays taken.
    #[arg(long, default_value_t = 3_600)]
    tombstone_secs: u64,
    /// Minimum backoff of the queues created at start, in milliseconds.
    #[arg(long, default_value_t = 100)]
    min_backoff_ms: i64,
    /// How long each CreateTask takes to answer, in milliseconds (a remote service's round trip).
    #[arg(long, default_value_t = 0)]
    create_latency_ms: u64,
    /// A queue's `maxConcurrentDispatches` (unbounded when absent).
    #[arg(long)]
    max_concurrent_dispatches: Option<usize>,
    /// A queue's `maxDispatchesPerSecond` (unbounded when absent).
    #[arg(long)]
    max_dispatches_per_second: Option<u32>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_writer(std::io::stderr).init();
    let args = Args::parse();
    let emulator = Emulator::new(Settings {
        tombstone: Duration::from_secs(args.tombstone_secs),
        create_latency: Duration::from_millis(args.create_latency_ms),
        max_concurrent_dispatches: args.max_concurrent_dispatches,
        max_dispatches_per_second: args.max_dispatches_per_second,
        ..Settings::default()
    });
    for queue in &args.queues {
        let retry = RetryConfig { min_backoff_ms: args.min_backoff_ms, ..RetryConfig::default() };
        emulator.create_queue(queue, retry).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    }
    let (addr, server) = emulator.serve(SocketAddr::from((Ipv4Addr::LOCALHOST, args.port))).await?;
    println!("listening on {addr}");
    tokio::select! {
        _ = server => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
