//! A local stand-in for the Cloud Tasks REST API, faithful where Drip depends on it: queues and
//! tasks created, read and deleted through the paths and JSON the official `google-cloud-tasks-v2`
//! client uses; dispatch at `scheduleTime` with the body, the task's headers, the
//! `X-CloudTasks-*` headers and an OIDC token signed with a test key; name dedup with tombstones
//! (409 ALREADY_EXISTS); 400 for bad names, oversized tasks and schedules beyond 30 days; retries
//! with the queue's backoff. Tests read what happened under `/_emulator/` and can inject faults.

mod api;
pub mod client;
mod dispatch;
mod model;
mod signer;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use model::{AttemptRecord, Billing, Fault, Faults, TaskSnapshot};
pub use signer::{TEST_JWKS, TEST_KEY_ID, TEST_OTHER_KEY_PEM, TEST_SIGNING_KEY_PEM, TokenSigner};

/// The stand-in's configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long a finished or deleted task's name stays taken (Cloud Tasks: about an hour).
    pub tombstone: Duration,
    /// How long one dispatch may take before it counts as failed.
    pub dispatch_deadline: Duration,
    /// How long each CreateTask takes to answer (0 here; a round trip to the real service takes
    /// milliseconds): for measuring what waits on creates.
    pub create_latency: Duration,
    /// A queue's `rateLimits`, over all queues here: dispatches in flight at once, and dispatches
    /// started per second (`None`: unbounded, so that tests wait for nothing).
    pub max_concurrent_dispatches: Option<usize>,
    pub max_dispatches_per_second: Option<u32>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            tombstone: Duration::from_secs(3_600),
            dispatch_deadline: Duration::from_secs(600),
            create_latency: Duration::ZERO,
            max_concurrent_dispatches: None,
            max_dispatches_per_second: None,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) state: Mutex<model::State>,
    pub(crate) wake: tokio::sync::Notify,
    pub(crate) http: reqwest::Client,
    pub(crate) signer: TokenSigner,
    pub(crate) settings: Settings,
    /// Permits for dispatches in flight (`Settings::max_concurrent_dispatches`).
    pub(crate) in_flight: Arc<tokio::sync::Semaphore>,
}

/// A running stand-in: its HTTP API and its dispatcher.
#[derive(Debug, Clone)]
pub struct Emulator {
    shared: Arc<Shared>,
}

impl Emulator {
    pub fn new(settings: Settings) -> Self {
        let http = reqwest::Client::builder().timeout(settings.dispatch_deadline).build().expect("an HTTP client");
        let shared = Arc::new(Shared {
            state: Mutex::new(model::State::default()),
            wake: tokio::sync::Notify::new(),
            http,
            signer: TokenSigner::test_key(),
            in_flight: Arc::new(tokio::sync::Semaphore::new(
                settings.max_concurrent_dispatches.unwrap_or(tokio::sync::Semaphore::MAX_PERMITS),
            )),
            settings,
        });
        Self { shared }
    }

    pub fn router(&self) -> axum::Router {
        api::router(self.shared.clone())
    }

    /// Creates a queue with the given retry settings (as `CreateQueue` would).
    pub fn create_queue(&self, name: &str, retry: model::RetryConfig) -> Result<(), model::ApiError> {
        self.shared.lock().create_queue(name, retry)
    }

    /// Serves on `addr` (port 0 picks one) and dispatches due tasks until the process ends.
    pub async fn serve(self, addr: SocketAddr) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let router = self.router();
        let dispatcher = tokio::spawn(dispatch::run(self.shared.clone()));
        let handle = tokio::spawn(async move {
            let server = axum::serve(listener, router);
            let _ = server.await;
            dispatcher.abort();
        });
        Ok((local, handle))
    }
}

impl Shared {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, model::State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub use model::RetryConfig;
