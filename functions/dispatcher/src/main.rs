//! `drip-dispatcher`: reads its settings, builds its state and serves until SIGTERM.

use std::net::{Ipv4Addr, SocketAddr};

use drip_dispatcher::{Settings, app, build_state};
use drip_service::shutdown::Shutdown;

/// mimalloc rather than glibc's malloc, whose arena locks cost the limiter a fifth of its CPU at
/// 64 pushes in flight (docs/capacity.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    drip_service::telemetry::init();
    drip_service::exit_with("drip-dispatcher", run().await)
}

async fn run() -> anyhow::Result<()> {
    let settings = Settings::from_env()?;
    let state = build_state(&settings).await?;
    let listener =
        tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, settings.common.port))).await?;
    tracing::info!(address = %listener.local_addr()?, "drip-dispatcher listening");
    if let Some(port) = settings.common.metrics_port {
        drip_service::serve_metrics(port, state.metrics.shared.clone()).await?;
    }
    let grace = std::time::Duration::from_millis(settings.common.shutdown_grace_ms);
    // Its requests are not cut short: Cloud Tasks retries one that SIGKILL ends, and its once-only
    // claim keeps that from publishing twice.
    drip_service::serve(listener, app(state), Shutdown::new(grace, grace)).await?;
    Ok(())
}
