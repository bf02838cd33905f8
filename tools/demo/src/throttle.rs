//! The feedback scenario's partner: a target that answers 429 with `Retry-After` for a while.

use std::collections::{HashMap, HashSet};

use anyhow::Context;
use axum::response::IntoResponse;
use drip_core::time::{Millis, parse_rfc3339, wall_clock_millis};

use crate::*;

/// The feedback scenario's target refuses from 1 s to 7 s after the burst.
pub(crate) const THROTTLE_FROM: Millis = 1_000;
pub(crate) const THROTTLE_UNTIL: Millis = 7_000;

#[derive(Default)]
pub(crate) struct Feedback {
    /// How many requests the target answered 429.
    pub(crate) refusals: usize,
    /// (ms since the burst, the first merchant's adaptive level, whether it was paused).
    pub(crate) levels: Vec<(Millis, f64, bool)>,
}

/// One request the throttling target answered.
pub(crate) struct Hit {
    pub(crate) id: String,
    pub(crate) scheduled_for: Millis,
    pub(crate) at: Millis,
    pub(crate) accepted: bool,
}

/// The feedback scenario's downstream: the rule's forward and overflow URL.
pub(crate) struct Throttle {
    pub(crate) hits: std::sync::Arc<std::sync::Mutex<Vec<Hit>>>,
    pub(crate) started: std::sync::Arc<std::sync::atomic::AtomicI64>,
}

impl Throttle {
    pub(crate) async fn serve(address: &str) -> anyhow::Result<Self> {
        let hits: std::sync::Arc<std::sync::Mutex<Vec<Hit>>> = Default::default();
        let started = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(Millis::MAX));
        let (log, since) = (hits.clone(), started.clone());
        let app = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
            let (log, since) = (log.clone(), since.clone());
            async move {
                let header =
                    |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
                let at = wall_clock_millis();
                let elapsed = at - since.load(std::sync::atomic::Ordering::Relaxed);
                let accepted = !(THROTTLE_FROM..THROTTLE_UNTIL).contains(&elapsed);
                let scheduled_for = parse_rfc3339(&header("x-drip-scheduled-for")).unwrap_or(at);
                log.lock().unwrap_or_else(|e| e.into_inner()).push(Hit {
                    id: header("x-drip-message-id"),
                    scheduled_for,
                    at,
                    accepted,
                });
                if accepted {
                    axum::http::StatusCode::NO_CONTENT.into_response()
                } else {
                    (axum::http::StatusCode::TOO_MANY_REQUESTS, [("retry-after", "3")]).into_response()
                }
            }
        });
        let listener = tokio::net::TcpListener::bind(address).await.with_context(|| format!("binding {address}"))?;
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Self { hits, started })
    }

    pub(crate) fn start(&self, at: Millis) {
        self.started.store(at, std::sync::atomic::Ordering::Relaxed);
    }

    /// Files each accepted request as a delivery; returns how many were refused so far.
    pub(crate) fn take_deliveries(
        &self,
        merchant_of: &HashMap<String, String>,
        into: &mut HashMap<String, Delivery>,
    ) -> usize {
        let hits = self.hits.lock().unwrap_or_else(|e| e.into_inner());
        for hit in hits.iter().filter(|h| h.accepted) {
            into.entry(hit.id.clone()).or_insert_with(|| Delivery {
                merchant: merchant_of.get(&hit.id).cloned().unwrap_or_default(),
                route: "target",
                scheduled_for: hit.scheduled_for,
                delivered_at: hit.at,
            });
        }
        hits.iter().filter(|h| !h.accepted).count()
    }

    /// Messages the target accepted more than once.
    pub(crate) fn duplicates(&self) -> usize {
        let hits = self.hits.lock().unwrap_or_else(|e| e.into_inner());
        let accepted: Vec<&String> = hits.iter().filter(|h| h.accepted).map(|h| &h.id).collect();
        accepted.len() - accepted.iter().collect::<HashSet<_>>().len()
    }
}
