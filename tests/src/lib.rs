//! Shared by the integration tests: starting real services, and random scheduling scenarios with
//! the invariants every schedule must satisfy.

pub mod pubsub_emulator;
pub mod redis_server;
pub mod redis_tls;
pub mod scenario;
#[cfg(feature = "stack")]
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

/// The body Pub/Sub pushes for one message (the wrapped push format).
/// A publish time for the pushes a test makes itself: this process's start, the same for every
/// push (so a redelivery is filed with its first delivery) and recent, as Pub/Sub's are.
pub fn publish_time() -> &'static str {
    static AT: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| drip_core::time::format_rfc3339(drip_core::time::wall_clock_millis()));
    &AT
}

pub fn push_envelope(
    id: &str,
    subscription: &str,
    publish_time: &str,
    attributes: &[(&str, &str)],
    data: &[u8],
) -> Vec<u8> {
    use base64::Engine;
    let attributes: std::collections::BTreeMap<&str, &str> = attributes.iter().copied().collect();
    serde_json::to_vec(&serde_json::json!({
        "message": {
            "data": base64::engine::general_purpose::STANDARD.encode(data),
            "attributes": attributes,
            "messageId": id,
            "publishTime": publish_time,
        },
        "subscription": subscription,
    }))
    .expect("a JSON value serializes")
}

/// `GET path` on a loopback port, blocking, without an HTTP client: the body when it answered 200.
/// For readiness checks outside any runtime.
pub fn get_ok(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(1))).ok()?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).ok()?;
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    let (head, body) = reply.split_once("\r\n\r\n")?;
    (head.starts_with("HTTP/1.") && head.lines().next()?.contains(" 200 ")).then(|| body.to_owned())
}
