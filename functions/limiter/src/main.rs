//! `drip-limiter`: reads its settings, builds its state and serves until SIGTERM.

use std::net::{Ipv4Addr, SocketAddr};

use drip_limiter::{Settings, app, build_state};

/// mimalloc rather than glibc's malloc, whose arena locks cost the limiter a fifth of its CPU at
/// 64 pushes in flight (docs/capacity.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    drip_service::telemetry::init();
    drip_service::exit_with("drip-limiter", run().await)
}

async fn run() -> anyhow::Result<()> {
    let settings = Settings::from_env()?;
    let state = build_state(&settings).await?;
    let listener =
        tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, settings.common.port))).await?;
    tracing::info!(address = %listener.local_addr()?, rules = state.rules.current().rules.len(), rules_version = %state.rules.version(), "drip-limiter listening");
    if let Some(port) = settings.common.metrics_port {
        drip_service::serve_metrics(port, state.metrics.shared.clone()).await?;
    }
    let shutdown = state.shutdown.clone();
    drip_service::serve(listener, app(state), shutdown).await?;
    Ok(())
}
