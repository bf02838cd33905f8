//! The peers of the limiter in `./run bench`'s HTTP comparison, on loopback:
//!
//!   bench_peers sink PORT                 answers every POST with 204 (the forward target)
//!   bench_peers bare PORT REDIS_URL SINK  the least a push handler can do: parse the envelope, the
//!                                         same reserve.lua call, the same POST, then 204
//!
//! Not part of Drip: the yardstick the limiter's own overhead is measured against. Built with the
//! limiter's allocator, so that the comparison is of the handlers, not of the allocators.

use std::net::Ipv4Addr;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use base64::Engine;
use drip_core::rules::{Limit, Placement, Window};
use drip_core::schedule::ReserveRequest;
use drip_core::time::{DAY, SECOND};
use drip_store::{AnyConnection, RedisSettings, RedisStore, SlotRequest, Store};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Clone)]
struct Bare {
    store: RedisStore<AnyConnection>,
    http: reqwest::Client,
    sink: String,
}

static LIMITS: std::sync::LazyLock<[Limit; 1]> =
    std::sync::LazyLock::new(|| [Limit::new(1_000_000, SECOND, Window::Fixed(Placement::Start)).unwrap()]);

async fn bare(State(bare): State<Bare>, body: Bytes) -> StatusCode {
    let Ok(envelope) = serde_json::from_slice::<serde_json::Value>(&body) else { return StatusCode::BAD_REQUEST };
    let message = &envelope["message"];
    let id = message["messageId"].as_str().unwrap_or_default();
    let data = base64::engine::general_purpose::STANDARD.decode(message["data"].as_str().unwrap_or_default());
    let key = message["attributes"]["key"].as_str().unwrap_or("k");
    let request =
        SlotRequest::new("bare", key, ReserveRequest { max_delay: DAY, ..ReserveRequest::new(id, &*LIMITS, 0) });
    if bare.store.reserve(&request).await.is_err() {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    match bare.http.post(&bare.sink).header("x-drip-message-id", id).body(data.unwrap_or_default()).send().await {
        Ok(response) if response.status().is_success() => StatusCode::NO_CONTENT,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let port: u16 = args.get(2).and_then(|p| p.parse().ok()).expect("usage: bench_peers sink|bare PORT ...");
    let router = match args[1].as_str() {
        "sink" => Router::new().fallback(|| async { StatusCode::NO_CONTENT }),
        "bare" => {
            // The connection the limiter uses, with its settings.
            let settings = RedisSettings {
                url: args[3].clone(),
                ca_cert_pem: None,
                cluster: false,
                response_timeout: std::time::Duration::from_secs(2),
                tokens: None,
            };
            let connection = AnyConnection::connect(&settings).await.expect("connecting to Redis");
            let state = Bare {
                store: RedisStore::new(connection, format!("bare-{}", std::process::id())),
                http: reqwest::Client::new(),
                sink: args[4].clone(),
            };
            Router::new().route("/push", post(bare)).with_state(state)
        }
        other => panic!("unknown peer {other}"),
    };
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await.expect("bind");
    axum::serve(listener, router).await.expect("serve");
}
