//! What the limiter and the dispatcher share: their common settings, start-up (rules, Redis,
//! Pub/Sub), Cloud Logging telemetry, `/healthz` and `/readyz`, Prometheus metrics, OIDC
//! authentication of callers, and graceful shutdown on SIGTERM.

pub mod answer;
pub mod api_error;
pub mod auth;
pub mod costs;
pub mod counted_publish;
pub mod dead_letters;
pub mod feedback;
pub mod health;
pub mod latency;
pub mod learn;
pub mod live_rules;
pub mod metrics;
pub mod parking;
pub mod reschedule;
pub mod settings;
pub mod shutdown;
pub mod task_batches;
pub mod tasks;
pub mod telemetry;

/// A lease (on a message's answer, or on a task's dispatch) outlives the attempt that holds it by
/// this much, so it never lapses while that attempt may still act.
pub const LEASE_MARGIN: drip_core::time::Millis = 5_000;

/// A service's exit: on an error (bad settings or rules, an unreachable dependency), why, as one
/// log line (one JSON object in Cloud Logging, not a multi-line `Error:` on stderr), and status 1.
pub fn exit_with(service: &str, result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = %format!("{error:#}"), "{service} refused to start or stopped");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Resolves when the process is asked to stop (SIGTERM from Cloud Run, or Ctrl-C).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
    tracing::info!("shutting down: finishing requests in flight");
}

/// A service's whole router: its own routes (each class behind its own callers already),
/// `/metrics` behind `metrics_auth` (metrics name rules and keys, so they are not public),
/// `/healthz` and `/readyz` (open, for probes), and a request span carrying the Cloud Trace context.
pub fn service_router(
    api: axum::Router,
    metrics_auth: &auth::RouteAuth,
    store: std::sync::Arc<dyn drip_store::Ping>,
    rules: std::sync::Arc<live_rules::LiveRules>,
    metrics: std::sync::Arc<metrics::Metrics>,
) -> axum::Router {
    axum::Router::new()
        .merge(api)
        .merge(metrics_auth.protect(metrics::Metrics::routes(metrics.clone())))
        .merge(health::routes(store, rules))
        .fallback(api_error::no_such_route)
        .route_layer(axum::middleware::from_fn_with_state(metrics, metrics::Metrics::record_request))
        .layer(telemetry::trace_layer())
}

/// Serves `/metrics` alone, unauthenticated, on 127.0.0.1:`port` (reachable only from inside the
/// instance: the collector sidecar's), until the process ends.
pub async fn serve_metrics(port: u16, metrics: std::sync::Arc<metrics::Metrics>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port)).await?;
    tracing::info!(address = %listener.local_addr()?, "metrics listening");
    tokio::spawn(async move { axum::serve(listener, metrics::Metrics::routes(metrics)).await });
    Ok(())
}

/// Serves `router` on `listener` until [`shutdown_signal`], then finishes the requests in flight,
/// which `shutdown` bounds by the time left.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    shutdown: std::sync::Arc<shutdown::Shutdown>,
) -> std::io::Result<()> {
    let stop = async move {
        shutdown_signal().await;
        shutdown.begin();
    };
    axum::serve(listener, router).with_graceful_shutdown(stop).await
}
