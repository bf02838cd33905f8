//! `/healthz` (the process answers) and `/readyz` (Redis answers), for Cloud Run's probes.

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use drip_store::AnyConnection;

pub fn routes(redis: AnyConnection) -> Router {
    Router::new().route("/healthz", get(|| async { "ok" })).route("/readyz", get(ready)).with_state(redis)
}

async fn ready(State(mut redis): State<AnyConnection>) -> (StatusCode, &'static str) {
    let command = redis::cmd("PING");
    let ping = command.query_async::<String>(&mut redis);
    match tokio::time::timeout(Duration::from_secs(1), ping).await {
        Ok(Ok(_)) => (StatusCode::OK, "ready"),
        _ => (StatusCode::SERVICE_UNAVAILABLE, "redis unreachable"),
    }
}
