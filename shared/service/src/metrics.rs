//! Prometheus metrics in text format at `/metrics`. Each service registers its own families on
//! top of the shared one: the latency and outcome of every call to Redis, Pub/Sub, Cloud Tasks
//! and forward URLs.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub dependency: &'static str,
    pub result: &'static str,
}

pub type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Seconds from 10 ms to about 31 days (29 buckets), for delays and lateness: `max_delay` may be
/// 30 days, and a delay past the last bucket would say nothing.
pub fn delay_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 29))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// The route's pattern (`/v1/rules/{rule}/keys/{key}`), not the path: keys are too many.
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: &'static str,
}

/// Seconds from 1 ms to about 30 min, for call latencies.
pub fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 22))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabels {
    pub version: String,
}

#[derive(Debug)]
pub struct Metrics {
    pub registry: Registry,
    /// `process_*`, unprefixed: read from `/proc/self` at each scrape.
    process: Registry,
    pub calls: HistogramFamily<CallLabels>,
    rules_info: Family<VersionLabels, Gauge>,
    rules_refused: Gauge,
    adaptive_level: Family<TargetLabels, Gauge<f64, AtomicU64>>,
    pauses_capped: Family<TargetLabels, prometheus_client::metrics::counter::Counter>,
    learned_limits: Family<TargetLabels, prometheus_client::metrics::counter::Counter>,
    budget_leases: Family<LeaseLabels, prometheus_client::metrics::counter::Counter>,
    budget_leased_units: Family<TargetLabels, prometheus_client::metrics::counter::Counter>,
    budget_returned_units: Family<TargetLabels, prometheus_client::metrics::counter::Counter>,
    fair_waiting_keys: Family<TargetLabels, Gauge>,
    fair_booked_units: Family<TargetLabels, prometheus_client::metrics::counter::Counter>,
    fair_wait: HistogramFamily<TargetLabels>,
    cost_corrections: Family<CorrectionLabels, prometheus_client::metrics::counter::Counter>,
    latency_percentile: Family<TargetLabels, Gauge<f64, AtomicU64>>,
    latency_reports: Family<LatencyLabels, prometheus_client::metrics::counter::Counter>,
    http: HistogramFamily<HttpLabels>,
    max_delay: Family<RuleLabels, Gauge<f64, AtomicU64>>,
    delivery_margin: Family<RuleLabels, Gauge<f64, AtomicU64>>,
    pubsub_requests: Family<TopicLabels, prometheus_client::metrics::counter::Counter>,
    pubsub_messages: Family<TopicLabels, prometheus_client::metrics::counter::Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabels {
    /// The topic as the rules name it.
    pub topic: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CorrectionLabels {
    pub rule: String,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    pub target: String,
    /// `slow`, `lagging`, `grew`, `held` or `repeat`.
    pub verdict: &'static str,
    /// `true` when the controller only says what it would do.
    pub shadow: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseLabels {
    pub budget: String,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetLabels {
    /// `budget:<name>`, or `rule:<name>` for a rule's keys.
    pub target: String,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("drip");
        let calls: HistogramFamily<CallLabels> = Family::new_with_constructor(seconds_histogram);
        registry.register(
            "dependency_call_seconds",
            "Calls to Redis, Pub/Sub, Cloud Tasks and forward URLs",
            calls.clone(),
        );
        let rules_info = Family::<VersionLabels, Gauge>::default();
        registry.register("rules_info", "The version (hash) of the rules this instance runs: 1", rules_info.clone());
        let rules_refused = Gauge::default();
        registry.register(
            "rules_refused",
            "1 while the rules file holds a version that did not validate (the previous one stays in force)",
            rules_refused.clone(),
        );
        let adaptive_level = Family::<TargetLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "adaptive_level",
            "The adaptive limit's level (a fraction of each count) after the latest 429, 5xx or timeout, by budget or rule (per key: drip inspect)",
            adaptive_level.clone(),
        );
        let pauses_capped = Family::<TargetLabels, prometheus_client::metrics::counter::Counter>::default();
        registry.register(
            "pauses_capped",
            "Answers that asked to wait longer than the rule's max_pause (capped, read as overload), by budget or rule",
            pauses_capped.clone(),
        );
        let learned_limits = Family::<TargetLabels, prometheus_client::metrics::counter::Counter>::default();
        registry.register(
            "learned_limit_changes",
            "Limits a key took from what the partner said on its answers (RateLimit headers), each change, by rule",
            learned_limits.clone(),
        );
        let budget_leases = Family::<LeaseLabels, prometheus_client::metrics::counter::Counter>::default();
        registry.register(
            "budget_leases",
            "Leases a leased budget's home granted a partition (outcome leased), or could not (full: no room up to the horizon), by budget",
            budget_leases.clone(),
        );
        let budget_leased_units = Family::<TargetLabels, prometheus_client::metrics::counter::Counter>::default();
        registry.register(
            "budget_leased_units",
            "Units a leased budget's home leased to partitions, by budget (against what was reserved: what was stranded)",
            budget_leased_units.clone(),
        );
        let budget_returned_units = Family::<TargetLabels, prometheus_client::metrics::counter::Counter>::default();
        registry.register(
            "budget_returned_units",
            "Units partitions gave back to a leased budget's home (events that left a window their pool leased), by budget",
            budget_returned_units.clone(),
        );
        let fair_waiting_keys = Family::<TargetLabels, Gauge>::default();
        registry.register(
            "fair_waiting_keys",
            "Keys with events waiting in a fair budget's ring when its drain last ran, by budget",
            fair_waiting_keys.clone(),
        );
        let fair_booked_units = Family::<TargetLabels, prometheus_client::metrics::counter::Counter>::default();
        registry.register(
            "fair_booked_units",
            "Units a fair budget's drains booked for its waiting keys, by budget (its use while it binds)",
            fair_booked_units.clone(),
        );
        let fair_wait: HistogramFamily<TargetLabels> = Family::new_with_constructor(delay_histogram);
        registry.register(
            "fair_wait_seconds",
            "How long each event a fair budget's drain booked waited, from its publish to its slot, by budget: the percentiles over its keys' events",
            fair_wait.clone(),
        );
        let cost_corrections = Family::<CorrectionLabels, prometheus_client::metrics::counter::Counter>::default();
        registry.register(
            "cost_corrections",
            "Costs reported after the call (X-Drip-Cost, /v1/feedback), by rule and what they did: more, less, same (booked right), already (a retried report) or unknown (no reservation)",
            cost_corrections.clone(),
        );
        let latency_percentile = Family::<TargetLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "latency_percentile_ms",
            "The downstream's latency (ms) in the last window reported to the latency controller: its p99 (p95 under 100 calls, p90 under 20), by budget or rule",
            latency_percentile.clone(),
        );
        let latency_reports = Family::<LatencyLabels, prometheus_client::metrics::counter::Counter>::default();
        registry.register(
            "latency_reports",
            "Windows of downstream latency the controller judged, by budget or rule and verdict: slow (the level cut), lagging (slow, at calls booked before the last cut: held), grew, held (healthy but under nine tenths of the count used), repeat (a report of that window had decided); shadow=true: nothing was changed",
            latency_reports.clone(),
        );
        let http: HistogramFamily<HttpLabels> = Family::new_with_constructor(seconds_histogram);
        registry.register("http_request_seconds", "Requests served, by route and status", http.clone());
        let build = Family::<BuildLabels, Gauge>::default();
        registry.register("build_info", "The version of Drip this instance runs: 1", build.clone());
        build.get_or_create(&BuildLabels { version: env!("CARGO_PKG_VERSION") }).set(1);
        let max_delay = Family::<RuleLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "max_delay_seconds",
            "Each rule's max_delay in force: an alert compares delays against it",
            max_delay.clone(),
        );
        let delivery_margin = Family::<RuleLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "delivery_margin_seconds",
            "Each rule's delivery_margin in force: an alert compares dispatch lateness against it",
            delivery_margin.clone(),
        );
        let pubsub_requests = Family::<TopicLabels, prometheus_client::metrics::counter::Counter>::default();
        registry.register("pubsub_requests", "Publish requests sent to Pub/Sub, by topic", pubsub_requests.clone());
        let pubsub_messages = Family::<TopicLabels, prometheus_client::metrics::counter::Counter>::default();
        registry.register(
            "pubsub_messages",
            "Messages those publish requests carried, by topic (over requests: the batch size)",
            pubsub_messages.clone(),
        );
        let mut process = Registry::default();
        process.register_collector(Box::new(ProcessCollector));
        Self {
            registry,
            process,
            calls,
            rules_info,
            rules_refused,
            adaptive_level,
            pauses_capped,
            learned_limits,
            budget_leases,
            budget_leased_units,
            budget_returned_units,
            fair_waiting_keys,
            fair_booked_units,
            fair_wait,
            cost_corrections,
            latency_percentile,
            latency_reports,
            http,
            max_delay,
            delivery_margin,
            pubsub_requests,
            pubsub_messages,
        }
    }
}

impl Metrics {
    /// Runs a call to `dependency`, recording its latency and whether it failed.
    pub async fn time<T, E>(&self, dependency: &'static str, call: impl Future<Output = Result<T, E>>) -> Result<T, E> {
        let started = Instant::now();
        let result = call.await;
        self.call(dependency, started.elapsed(), result.is_ok());
        result
    }

    /// A call to `dependency` that took `took`.
    pub fn call(&self, dependency: &'static str, took: std::time::Duration, ok: bool) {
        let labels = CallLabels { dependency, result: if ok { "ok" } else { "error" } };
        self.calls.get_or_create(&labels).observe(took.as_secs_f64());
    }

    /// The rules in force changed from `from` (none at start-up) to `to`.
    pub fn rules_version(&self, from: Option<&str>, to: &str) {
        if let Some(from) = from {
            self.rules_info.remove(&VersionLabels { version: from.to_owned() });
        }
        self.rules_info.get_or_create(&VersionLabels { version: to.to_owned() }).set(1);
    }

    /// The rules now in force, for the alerts that compare delays and lateness against them.
    pub fn rules_in_force(&self, rules: &drip_core::rules::ServiceRules) {
        self.max_delay.clear();
        self.delivery_margin.clear();
        for rule in &rules.rules {
            let labels = RuleLabels { rule: rule.name.clone() };
            self.max_delay.get_or_create(&labels).set(rule.max_delay as f64 / 1_000.0);
            self.delivery_margin.get_or_create(&labels).set(rule.delivery_margin as f64 / 1_000.0);
        }
    }

    pub fn adaptive_level(&self, target: String, level: f64) {
        self.adaptive_level.get_or_create(&TargetLabels { target }).set(level);
    }

    pub fn pause_capped(&self, target: String) {
        self.pauses_capped.get_or_create(&TargetLabels { target }).inc();
    }

    /// A key's limit changed to what the partner said (`rule:<name>`).
    pub fn learned_limit_changed(&self, target: String) {
        self.learned_limits.get_or_create(&TargetLabels { target }).inc();
    }

    /// A leased budget's home granted `units` to a partition (0: it had no room up to the horizon).
    pub fn budget_leased(&self, budget: &str, units: u64) {
        let outcome = if units > 0 { "leased" } else { "full" };
        self.budget_leases.get_or_create(&LeaseLabels { budget: budget.to_owned(), outcome }).inc();
        let target = format!("budget:{budget}");
        self.budget_leased_units.get_or_create(&TargetLabels { target }).inc_by(units);
    }

    /// A partition gave `units` back to a leased budget's home.
    pub fn budget_returned(&self, budget: &str, units: u64) {
        let target = format!("budget:{budget}");
        self.budget_returned_units.get_or_create(&TargetLabels { target }).inc_by(units);
    }

    /// A fair budget's drain ran with `waiting` keys in its ring and booked `waits` (each event's
    /// publish to slot, ms) of `units` in all.
    pub fn fair_drained(&self, budget: &str, waiting: usize, units: u64, waits: &[drip_core::time::Millis]) {
        let target = TargetLabels { target: format!("budget:{budget}") };
        self.fair_waiting_keys.get_or_create(&target).set(waiting as i64);
        self.fair_booked_units.get_or_create(&target).inc_by(units);
        let histogram = self.fair_wait.get_or_create(&target);
        for &wait in waits {
            histogram.observe(wait.max(0) as f64 / 1e3);
        }
    }

    /// A cost reported after the call, and what it did (`more`, `less`, `same`, `already`, `unknown`).
    pub fn cost_corrected(&self, rule: &str, outcome: &'static str) {
        self.cost_corrections.get_or_create(&CorrectionLabels { rule: rule.to_owned(), outcome }).inc();
    }

    /// A window's latency percentile (ms) judged by the controller, and its verdict.
    pub fn latency_judged(&self, target: String, percentile_ms: f64, verdict: &'static str, shadow: bool) {
        self.latency_percentile.get_or_create(&TargetLabels { target: target.clone() }).set(percentile_ms);
        let shadow = if shadow { "true" } else { "false" };
        self.latency_reports.get_or_create(&LatencyLabels { target, verdict, shadow }).inc();
    }

    /// A publish request to `topic` carrying `messages`.
    pub fn publish_request(&self, topic: &str, messages: usize) {
        let labels = TopicLabels { topic: topic.to_owned() };
        self.pubsub_requests.get_or_create(&labels).inc();
        self.pubsub_messages.get_or_create(&labels).inc_by(messages as u64);
    }

    pub fn rules_refused(&self, refused: bool) {
        self.rules_refused.set(i64::from(refused));
    }

    /// Counts and times every request by route and status (a layer around the whole router).
    pub async fn record_request(
        State(metrics): State<Arc<Metrics>>,
        request: axum::extract::Request,
        next: axum::middleware::Next,
    ) -> axum::response::Response {
        let route = request
            .extensions()
            .get::<axum::extract::MatchedPath>()
            .map_or_else(|| "unmatched".to_owned(), |path| path.as_str().to_owned());
        let started = Instant::now();
        let response = next.run(request).await;
        let labels = HttpLabels { route, status: response.status().as_u16() };
        metrics.http.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
        response
    }

    /// Drip's families (`drip_*`), then the process's (`process_*`, the names every Prometheus
    /// client exports).
    pub fn render(&self) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut out = String::new();
        let _ = encode_registry(&mut out, &self.registry).and_then(|()| encode_registry(&mut out, &self.process));
        let _ = encode_eof(&mut out);
        out
    }

    pub fn routes(metrics: Arc<Metrics>) -> Router {
        Router::new().route("/metrics", get(render)).with_state(metrics)
    }
}

async fn render(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], metrics.render())
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub rule: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabels {
    pub rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabels {
    pub rule: String,
    pub class: String,
}

/// A service's metrics: the shared call metrics, a counter of outcomes by rule, and a histogram
/// of seconds by rule (the limiter's delays, the dispatcher's lateness).
#[derive(Debug)]
pub struct ServiceMetrics {
    pub shared: Arc<Metrics>,
    outcomes: Family<OutcomeLabels, prometheus_client::metrics::counter::Counter>,
    seconds: HistogramFamily<RuleLabels>,
    /// The same seconds by class, for rules with classes (`<seconds>_by_class`).
    by_class: HistogramFamily<ClassLabels>,
    longest: Arc<LongestRecent>,
}

/// The longest of the seconds observed by rule in this minute and the one before (`<seconds>_max`):
/// a histogram's p99 hides one key in a thousand, and this is the one key whose delay nears
/// `max_delay` (it pages before that key starts dead-lettering). A rule with nothing observed for
/// two minutes is left out, so an alert on it clears.
#[derive(Debug)]
struct LongestRecent {
    name: String,
    help: String,
    /// By rule: the minute of the latest observation, that minute's longest, the minute before's.
    by_rule: std::sync::Mutex<std::collections::HashMap<String, (i64, f64, f64)>>,
}

impl LongestRecent {
    fn observe(&self, rule: &str, seconds: f64, minute: i64) {
        let mut by_rule = self.by_rule.lock().unwrap_or_else(|e| e.into_inner());
        let entry = by_rule.entry(rule.to_owned()).or_insert((minute, seconds, 0.0));
        *entry = match minute - entry.0 {
            0 => (minute, entry.1.max(seconds), entry.2),
            1 => (minute, seconds, entry.1),
            _ => (minute, seconds, 0.0),
        };
    }

    /// The longest of this minute and the last, by rule, as of `minute`.
    fn recent(&self, minute: i64) -> Vec<(String, f64)> {
        let by_rule = self.by_rule.lock().unwrap_or_else(|e| e.into_inner());
        let mut recent: Vec<(String, f64)> = by_rule
            .iter()
            .filter_map(|(rule, &(at, this, before))| match minute - at {
                0 => Some((rule.clone(), this.max(before))),
                1 => Some((rule.clone(), this)),
                _ => None,
            })
            .collect();
        recent.sort_by(|a, b| a.0.cmp(&b.0));
        recent
    }
}

fn this_minute() -> i64 {
    drip_core::time::wall_clock_millis().div_euclid(drip_core::time::MINUTE)
}

impl prometheus_client::collector::Collector for LongestRecent {
    fn encode(&self, mut encoder: prometheus_client::encoding::DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::gauge::ConstGauge;
        let recent = self.recent(this_minute());
        if recent.is_empty() {
            return Ok(());
        }
        let mut family =
            encoder.encode_descriptor(&self.name, &self.help, None, prometheus_client::metrics::MetricType::Gauge)?;
        for (rule, seconds) in recent {
            let labels = RuleLabels { rule };
            ConstGauge::new(seconds).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

impl ServiceMetrics {
    /// `outcomes` and `seconds` are (name, help) of the two families.
    pub fn new(outcomes: (&str, &str), seconds: (&str, &str)) -> Self {
        let mut metrics = Metrics::default();
        let outcome_family = Family::<OutcomeLabels, prometheus_client::metrics::counter::Counter>::default();
        let seconds_family: HistogramFamily<RuleLabels> = Family::new_with_constructor(delay_histogram);
        metrics.registry.register(outcomes.0, outcomes.1, outcome_family.clone());
        metrics.registry.register(seconds.0, seconds.1, seconds_family.clone());
        let by_class: HistogramFamily<ClassLabels> = Family::new_with_constructor(delay_histogram);
        let by_class_help = format!("{} By class, for rules with classes", seconds.1);
        metrics.registry.register(format!("{}_by_class", seconds.0), by_class_help, by_class.clone());
        let longest = Arc::new(LongestRecent {
            name: format!("{}_max", seconds.0),
            help: format!("The longest of this minute and the last: {}", seconds.1),
            by_rule: Default::default(),
        });
        metrics.registry.register_collector(Box::new(longest.clone()));
        Self { shared: Arc::new(metrics), outcomes: outcome_family, seconds: seconds_family, by_class, longest }
    }

    pub fn count(&self, rule: &str, outcome: &str) {
        self.outcomes.get_or_create(&OutcomeLabels { rule: rule.to_owned(), outcome: outcome.to_owned() }).inc();
    }

    pub fn observe(&self, rule: &str, seconds: f64) {
        self.seconds.get_or_create(&RuleLabels { rule: rule.to_owned() }).observe(seconds);
        self.longest.observe(rule, seconds, this_minute());
    }

    /// The seconds of an event of `class` of a rule with classes (also counted by [`Self::observe`]).
    pub fn observe_class(&self, rule: &str, class: &str, seconds: f64) {
        let labels = ClassLabels { rule: rule.to_owned(), class: class.to_owned() };
        self.by_class.get_or_create(&labels).observe(seconds);
    }

    /// Times a call to a dependency (see [`Metrics::time`]).
    pub async fn time<T, E>(&self, dependency: &'static str, call: impl Future<Output = Result<T, E>>) -> Result<T, E> {
        self.shared.time(dependency, call).await
    }
}

/// The process's own figures at each scrape, from `/proc/self` (Cloud Run runs Linux): CPU,
/// memory, threads, file descriptors and start time. Elsewhere it exports nothing.
#[derive(Debug)]
struct ProcessCollector;

impl prometheus_client::collector::Collector for ProcessCollector {
    fn encode(&self, mut encoder: prometheus_client::encoding::DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let Ok(me) = procfs::process::Process::myself() else { return Ok(()) };
        let Ok(stat) = me.stat() else { return Ok(()) };
        let ticks = procfs::ticks_per_second() as f64;
        let cpu = ConstCounter::new((stat.utime + stat.stime) as f64 / ticks);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "User and system CPU time spent",
            None,
            cpu.metric_type(),
        )?)?;
        let mut gauge = |name: &str, help: &str, value: f64| -> Result<(), std::fmt::Error> {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)
        };
        gauge("process_resident_memory_bytes", "Resident memory size", (stat.rss * procfs::page_size()) as f64)?;
        gauge("process_virtual_memory_bytes", "Virtual memory size", stat.vsize as f64)?;
        gauge("process_threads", "OS threads", stat.num_threads as f64)?;
        if let Ok(boot) = procfs::boot_time_secs() {
            gauge(
                "process_start_time_seconds",
                "Start time since the Unix epoch",
                boot as f64 + stat.starttime as f64 / ticks,
            )?;
        }
        if let Ok(open) = me.fd_count() {
            gauge("process_open_fds", "Open file descriptors", open as f64)?;
        }
        if let Ok(limits) = me.limits()
            && let procfs::process::LimitValue::Value(max) = limits.max_open_files.soft_limit
        {
            gauge("process_max_fds", "The most file descriptors it may open", max as f64)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_recent_covers_this_minute_and_the_last_and_then_clears() {
        let longest = LongestRecent { name: "x".into(), help: "x".into(), by_rule: Default::default() };
        longest.observe("r", 5.0, 10);
        longest.observe("r", 2.0, 10);
        assert_eq!(longest.recent(10), [("r".to_owned(), 5.0)]);
        longest.observe("r", 1.0, 11);
        assert_eq!(longest.recent(11), [("r".to_owned(), 5.0)], "the minute before still counts");
        assert_eq!(longest.recent(12), [("r".to_owned(), 1.0)], "then only the latest minute's");
        assert!(longest.recent(13).is_empty(), "nothing for two minutes: left out");
        longest.observe("r", 3.0, 20);
        assert_eq!(longest.recent(20), [("r".to_owned(), 3.0)], "a gap forgets what came before it");
    }
}

/// Each Redis request the services' connection sends, timed under `redis`.
#[derive(Debug)]
pub struct RedisCalls(pub Arc<Metrics>);

impl drip_store::LeaseObserver for RedisCalls {
    fn leased(&self, budget: &str, units: u64) {
        self.0.budget_leased(budget, units);
    }

    fn returned(&self, budget: &str, units: u64) {
        self.0.budget_returned(budget, units);
    }
}

impl drip_store::CallObserver for RedisCalls {
    fn observe(&self, took: std::time::Duration, ok: bool) {
        self.0.call("redis", took, ok);
    }
}
