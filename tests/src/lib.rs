//! Shared by the integration tests: starting real services, and random scheduling scenarios with
//! the invariants every schedule must satisfy.

pub mod pubsub_emulator;
pub mod redis_server;
pub mod scenario;
pub mod stack;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A name no other test (or earlier run against the same Redis) uses: tests are isolated by names,
/// never by flushing shared state.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{prefix}-{}-{}-{nanos}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}
