//! Logs in Cloud Logging's JSON format (`tracing-stackdriver`), one span per request carrying the
//! `X-Cloud-Trace-Context` trace. `DRIP_LOG_FORMAT=text` gives plain lines for local runs;
//! `RUST_LOG` filters (default `info`).

use axum::extract::MatchedPath;
use axum::http::Request;
use tower_http::trace::TraceLayer;
use tower_http::trace::{HttpMakeClassifier, MakeSpan};
use tracing::Span;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    let result = if std::env::var("DRIP_LOG_FORMAT").as_deref() == Ok("text") {
        registry.with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr)).try_init()
    } else {
        registry.with(tracing_stackdriver::layer()).try_init()
    };
    if result.is_err() {
        tracing::debug!("a tracing subscriber was already installed");
    }
}

/// The span of one request: method, route, and the Cloud Trace id as
/// `projects/<project>/traces/<id>` (Cloud Logging's form).
#[derive(Debug, Clone)]
pub struct RequestSpan {
    project: String,
}

impl<B> MakeSpan<B> for RequestSpan {
    fn make_span(&mut self, request: &Request<B>) -> Span {
        let route = request.extensions().get::<MatchedPath>().map_or(request.uri().path(), MatchedPath::as_str);
        let trace = request
            .headers()
            .get("x-cloud-trace-context")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split('/').next())
            .filter(|id| !id.is_empty())
            .map(|id| format!("projects/{}/traces/{id}", self.project))
            .unwrap_or_default();
        tracing::info_span!("request", method = %request.method(), route, trace)
    }
}

pub fn trace_layer(project: &str) -> TraceLayer<HttpMakeClassifier, RequestSpan> {
    TraceLayer::new_for_http().make_span_with(RequestSpan { project: project.to_owned() })
}
