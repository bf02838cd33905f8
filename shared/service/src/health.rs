//! `/healthz` (the process answers) and `/readyz` (Redis answers; the body names the rules version
//! in force), for Cloud Run's probes.

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use std::sync::Arc;

use drip_store::Ping;

use crate::live_rules::LiveRules;

#[derive(Clone)]
struct Probed {
    store: Arc<dyn Ping>,
    rules: Arc<LiveRules>,
}

pub fn routes(store: Arc<dyn Ping>, rules: Arc<LiveRules>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(Probed { store, rules })
}

async fn ready(State(probed): State<Probed>) -> (StatusCode, String) {
    let rules = probed.rules.version();
    match tokio::time::timeout(Duration::from_secs(1), probed.store.ping()).await {
        Ok(Ok(_)) => (StatusCode::OK, format!("ready; rules {rules}")),
        _ => (StatusCode::SERVICE_UNAVAILABLE, format!("the store (Redis) is unreachable; rules {rules}")),
    }
}
