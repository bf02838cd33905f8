//! Logs in Cloud Logging's JSON format (`tracing-stackdriver`), one span per request that carries
//! the caller's `X-Cloud-Trace-Context`, so every line of a request has the
//! `logging.googleapis.com/trace` Cloud Logging correlates by. `DRIP_LOG_FORMAT=text` gives plain
//! lines for local runs; `RUST_LOG` filters (default `info`).

use axum::extract::MatchedPath;
use axum::http::Request;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider};
use tower_http::trace::{HttpMakeClassifier, MakeSpan, TraceLayer};
use tracing::Span;
use tracing::Subscriber;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_stackdriver::CloudTraceConfiguration;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// Installs the process's subscriber; the project (GOOGLE_CLOUD_PROJECT) names the traces.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let result = if std::env::var("DRIP_LOG_FORMAT").as_deref() == Ok("text") {
        tracing_subscriber::registry()
            .with(filter)
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .try_init()
    } else {
        let project = std::env::var("GOOGLE_CLOUD_PROJECT").unwrap_or_default();
        cloud_logging(&project, std::io::stdout).with(filter).try_init()
    };
    if result.is_err() {
        tracing::debug!("a tracing subscriber was already installed");
    }
}

/// The target of a request span without the caller's trace context: OpenTelemetry does not see
/// it, so its lines carry no trace or span id (rather than made-up or all-zero ones).
const UNTRACED: &str = "drip_service::untraced";

/// Cloud Logging JSON on `writer`. OpenTelemetry only carries the trace context here: spans are
/// exported nowhere. The provider lives as long as the process: a tracer whose provider is gone
/// gives every span the all-zero id.
pub fn cloud_logging<W>(project: &str, writer: W) -> impl Subscriber + for<'a> LookupSpan<'a> + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    static PROVIDER: std::sync::OnceLock<opentelemetry_sdk::trace::TracerProvider> = std::sync::OnceLock::new();
    let tracer = PROVIDER.get_or_init(|| opentelemetry_sdk::trace::TracerProvider::builder().build()).tracer("drip");
    let traced = tracing_subscriber::filter::filter_fn(|metadata| metadata.target() != UNTRACED);
    tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer).with_filter(traced)).with(
        tracing_stackdriver::layer()
            .with_writer(writer)
            .with_cloud_trace(CloudTraceConfiguration { project_id: project.to_owned() }),
    )
}

/// The span of one request: method and route, parented on the caller's Cloud Trace context.
#[derive(Debug, Clone, Default)]
pub struct RequestSpan;

impl<B> MakeSpan<B> for RequestSpan {
    fn make_span(&mut self, request: &Request<B>) -> Span {
        let route = request.extensions().get::<MatchedPath>().map_or(request.uri().path(), MatchedPath::as_str);
        let caller =
            request.headers().get("x-cloud-trace-context").and_then(|v| v.to_str().ok()).and_then(parse_trace_context);
        match caller {
            Some(context) => {
                let span = tracing::info_span!("request", method = %request.method(), route);
                span.set_parent(opentelemetry::Context::new().with_remote_span_context(context));
                span
            }
            None => tracing::info_span!(target: UNTRACED, "request", method = %request.method(), route),
        }
    }
}

/// `TRACE_ID/SPAN_ID;o=OPTIONS`: a 32-hex-digit trace id, a decimal span id, `o=1` when sampled.
fn parse_trace_context(header: &str) -> Option<SpanContext> {
    let (trace, rest) = header.split_once('/')?;
    let (span, options) = rest.split_once(';').unwrap_or((rest, ""));
    if trace.len() != 32 {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok().filter(|id| *id != TraceId::INVALID)?;
    let span_id = SpanId::from(span.parse::<u64>().ok().filter(|id| *id != 0)?);
    let flags = if options.trim() == "o=1" { TraceFlags::SAMPLED } else { TraceFlags::default() };
    Some(SpanContext::new(trace_id, span_id, flags, true, TraceState::default()))
}

pub fn trace_layer() -> TraceLayer<HttpMakeClassifier, RequestSpan> {
    TraceLayer::new_for_http().make_span_with(RequestSpan)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged_line(header: Option<&str>) -> serde_json::Value {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = cloud_logging("drip-prod", move || writer.clone());
        tracing::subscriber::with_default(subscriber, || {
            let mut request = Request::builder().uri("/push").method("POST");
            if let Some(header) = header {
                request = request.header("x-cloud-trace-context", header);
            }
            let span = RequestSpan.make_span(&request.body(()).unwrap());
            span.in_scope(|| tracing::info!(message_id = "42", decision = "forward", "decision"));
        });
        let bytes = buffer.0.lock().unwrap().clone();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn request_logs_carry_the_cloud_trace_of_the_caller() {
        let line = logged_line(Some("105445aa7843bc8bf206b12000100000/1;o=1"));
        assert_eq!(line["logging.googleapis.com/trace"], "projects/drip-prod/traces/105445aa7843bc8bf206b12000100000");
        assert_eq!(line["logging.googleapis.com/trace_sampled"], true);
        let span_id = line["logging.googleapis.com/spanId"].as_str().unwrap();
        assert!(span_id.len() == 16 && span_id != "0000000000000000", "a span id of its own: {line}");
        assert_eq!(line["severity"], "INFO");
        assert_eq!(line["decision"], "forward");
        assert_eq!(line["messageId"], "42");
    }

    #[test]
    fn malformed_or_missing_trace_headers_are_ignored() {
        for header in [
            None,
            Some("not-a-trace"),
            Some("00000000000000000000000000000000/1;o=1"),
            Some("105445aa7843bc8bf206b12000100000/x"),
        ] {
            let line = logged_line(header);
            assert!(line.get("logging.googleapis.com/trace").is_none(), "{header:?}: no trace at all: {line}");
            assert!(line.get("logging.googleapis.com/spanId").is_none(), "{header:?}: no span id: {line}");
            assert_eq!(line["decision"], "forward");
        }
    }
}
