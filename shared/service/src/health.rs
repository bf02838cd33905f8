//! `/healthz` (the process answers) and `/readyz` (Redis answers), for Cloud Run's probes.

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use std::sync::Arc;

use drip_store::Ping;

pub fn routes(store: Arc<dyn Ping>) -> Router {
    Router::new().route("/healthz", get(|| async { "ok" })).route("/readyz", get(ready)).with_state(store)
}

async fn ready(State(store): State<Arc<dyn Ping>>) -> (StatusCode, &'static str) {
    match tokio::time::timeout(Duration::from_secs(1), store.ping()).await {
        Ok(Ok(_)) => (StatusCode::OK, "ready"),
        _ => (StatusCode::SERVICE_UNAVAILABLE, "the store (Redis) is unreachable"),
    }
}
