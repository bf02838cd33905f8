//! `drip demo`: publishes a burst of payouts onto the local stack `./run demo` started, watches
//! them drain live, then prints a summary, writes a chart, and exits 0 only if nothing was lost
//! and no window got more than its limit.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use axum::response::IntoResponse;
use drip_core::rules::{Forward, Rule, RuleSet, TopicName};
use drip_core::time::{Millis, parse_rfc3339, wall_clock_millis};
use plotters::prelude::*;
use pubsub_emulator_client::{EmulatorClient, Pulled};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// `host:port` of the Pub/Sub emulator.
    #[arg(long)]
    pubsub_emulator: String,
    #[arg(long, default_value = "drip-demo")]
    project: String,
    /// The limiter's base URL (the demo subscribes its `/push` to the source topic).
    #[arg(long)]
    limiter: String,
    /// The rules file the limiter and dispatcher run with.
    #[arg(long)]
    rules: PathBuf,
    /// The rule the payouts match (its `match` must hold for `event_type: payout`).
    #[arg(long, default_value = "payouts")]
    rule: String,
    /// How many events in the burst.
    #[arg(long, default_value_t = 300)]
    events: usize,
    /// Over how many merchants.
    #[arg(long, default_value_t = 5)]
    keys: usize,
    /// Where the chart and the summary go.
    #[arg(long, default_value = "target/drip-run/demo")]
    out: PathBuf,
    /// Give up waiting after this many seconds.
    #[arg(long, default_value_t = 300)]
    timeout_secs: u64,
    /// The feedback scenario: serve the rule's forward and overflow URL at this address, answering
    /// 429 with `Retry-After: 3` from 1 s to 7 s after the burst, then 204.
    #[arg(long)]
    throttle: Option<String>,
}

struct Delivery {
    merchant: String,
    route: &'static str,
    scheduled_for: Millis,
    delivered_at: Millis,
}

pub fn run(args: Args) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("drip demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(demo(&args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("drip demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The topics of the demo's rule, each with a pull subscription of the same name.
struct Topics {
    forward: TopicName,
    overflow: TopicName,
    dlq: TopicName,
}

/// The burst as published: each message's merchant and publish time, by message id.
struct Burst {
    merchants: Vec<String>,
    merchant_of: HashMap<String, String>,
    published_at: HashMap<String, Millis>,
    started: Millis,
}

/// What came out at the topics (or the throttling target).
#[derive(Default)]
struct Outcome {
    /// The feedback scenario: the target's answers, and the first merchant's adaptive level and
    /// pause as the limiter's entity endpoint showed them over time.
    feedback: Feedback,
    deliveries: HashMap<String, Delivery>,
    /// Messages seen again at the forward or overflow topic (same message id: one source
    /// subscription, so the id is the message's identity here).
    duplicates: usize,
    /// Dead-lettered message ids, with their reasons.
    dead: HashMap<String, String>,
}

async fn demo(args: &Args) -> anyhow::Result<bool> {
    let rules = RuleSet::load(&args.rules).map_err(|errors| anyhow::anyhow!("{errors}"))?;
    let rule =
        rules.rule(&args.rule).with_context(|| format!("no rule '{}' in {}", args.rule, args.rules.display()))?;
    let pubsub = EmulatorClient::new(&args.pubsub_emulator, &args.project);
    let topics = set_up(args, rule, &pubsub).await?;
    let target = match &args.throttle {
        Some(address) => Some(Throttle::serve(address).await?),
        None => None,
    };
    let burst = publish_burst(args, &pubsub).await?;
    if let Some(target) = &target {
        target.start(burst.started);
    }
    let outcome = watch(args, rule, &pubsub, &topics, &burst, target.as_ref()).await?;
    let (summary, ok) = summarize(args, rule, &burst, &outcome)?;
    print!("{summary}");
    std::fs::write(args.out.join("summary.txt"), &summary)?;
    Ok(ok)
}

/// Creates the rule's topics and the source topic, whose push subscription feeds the limiter.
async fn set_up(args: &Args, rule: &Rule, pubsub: &EmulatorClient) -> anyhow::Result<Topics> {
    let forward = match &rule.forward {
        Forward::Topic(forward) => forward.clone(),
        Forward::Url(_) if args.throttle.is_some() => rule.overflow_topic.clone(),
        Forward::Url(_) => bail!("the demo rule must forward to a topic (or run with --throttle)"),
    };
    let topics = Topics { forward, overflow: rule.overflow_topic.clone(), dlq: rule.dlq_topic.clone() };
    let distinct: std::collections::BTreeSet<&TopicName> = [&topics.forward, &topics.overflow, &topics.dlq].into();
    for topic in distinct {
        pubsub.topic_with_subscription(topic).await?;
    }
    pubsub.create_topic(SOURCE).await?;
    pubsub.create_subscription(SOURCE, SOURCE, Some(&format!("{}/push", args.limiter.trim_end_matches('/')))).await?;
    Ok(topics)
}

const SOURCE: &str = "payouts-source";

/// Publishes `args.events` payouts over `args.keys` merchants, in batches of 100, as fast as the
/// emulator takes them.
async fn publish_burst(args: &Args, pubsub: &EmulatorClient) -> anyhow::Result<Burst> {
    let merchants: Vec<String> = (1..=args.keys).map(|k| format!("m{k:03}")).collect();
    let mut burst =
        Burst { merchant_of: HashMap::new(), published_at: HashMap::new(), started: wall_clock_millis(), merchants };
    let mut batch = Vec::new();
    for i in 0..args.events {
        let merchant = &burst.merchants[i % burst.merchants.len()];
        let payout = serde_json::json!({
            "payoutId": format!("pay_{:06}", 902_184 + i),
            "merchantId": merchant,
            "amount": 100 + (i * 37) % 5_000,
            "currency": "INR",
            "beneficiary": {"ifsc": "HDFC0000123", "account": format!("XXXXXX{:04}", i % 10_000)},
        });
        let attributes = BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]);
        batch.push((serde_json::to_vec(&payout)?, attributes));
        if batch.len() == 100 || i + 1 == args.events {
            let sent = wall_clock_millis();
            let ids = pubsub.publish_batch(SOURCE, &batch).await?;
            let first = i + 1 - batch.len();
            for (offset, id) in ids.into_iter().enumerate() {
                burst.merchant_of.insert(id.clone(), burst.merchants[(first + offset) % burst.merchants.len()].clone());
                burst.published_at.insert(id, sent);
            }
            batch.clear();
        }
    }
    Ok(burst)
}

/// Pulls the forward, overflow and dead-letter topics until every event came out (or the
/// timeout), drawing the live view meanwhile.
async fn watch(
    args: &Args,
    rule: &Rule,
    pubsub: &EmulatorClient,
    topics: &Topics,
    burst: &Burst,
    target: Option<&Throttle>,
) -> anyhow::Result<Outcome> {
    let http = reqwest::Client::new();
    let live = std::io::stdout().is_terminal();
    let mut outcome = Outcome::default();
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    let mut last_frame = Instant::now() - Duration::from_secs(1);
    let mut printed_lines = 0;
    let frame = |outcome: &Outcome| render_frame(args, rule, &burst.merchants, outcome, burst.started);
    while outcome.deliveries.len() + outcome.dead.len() < args.events && Instant::now() < deadline {
        for (topic, route) in [(&topics.forward, "forward"), (&topics.overflow, "delay")] {
            for message in pubsub.pull(topic, 1_000).await? {
                let Some(delivery) = delivery_of(&message, route, &burst.merchant_of) else { continue };
                let id = message.attributes.get("drip-message-id").cloned().unwrap_or_default();
                if outcome.deliveries.insert(id, delivery).is_some() {
                    outcome.duplicates += 1;
                }
            }
        }
        if let Some(target) = target {
            outcome.feedback.refusals = target.take_deliveries(&burst.merchant_of, &mut outcome.deliveries);
            outcome.duplicates = target.duplicates();
            let first = format!("merchant_{}", burst.merchants[0]);
            let url = format!("{}/v1/rules/{}/keys/{first}", args.limiter.trim_end_matches('/'), rule.name);
            if let Ok(response) = http.get(&url).send().await
                && let Ok(report) = response.json::<serde_json::Value>().await
            {
                let at = wall_clock_millis() - burst.started;
                let level = report["adaptiveLevel"].as_f64().unwrap_or(1.0);
                outcome.feedback.levels.push((at, level, report["pausedUntil"].as_str().is_some()));
            }
        }
        for message in pubsub.pull(&topics.dlq, 1_000).await? {
            let reason = message.attributes.get("drip-reason").cloned().unwrap_or_default();
            outcome
                .dead
                .insert(message.attributes.get("drip-message-id").cloned().unwrap_or(message.message_id), reason);
        }
        if last_frame.elapsed() >= Duration::from_millis(if live { 250 } else { 1_000 }) {
            if live {
                let frame = frame(&outcome);
                print!("{}{frame}", clear_lines(printed_lines));
                printed_lines = frame.lines().count();
            } else {
                println!(
                    "t={:>5.1}s delivered {}/{}",
                    (wall_clock_millis() - burst.started) as f64 / 1_000.0,
                    outcome.deliveries.len(),
                    args.events
                );
            }
            std::io::stdout().flush()?;
            last_frame = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if live {
        print!("{}{}", clear_lines(printed_lines), frame(&outcome));
    }
    Ok(outcome)
}

/// The summary's text, and whether the demo kept the promise: nothing lost and no window of any
/// merchant's slots over the limit. Writes the chart.
fn summarize(args: &Args, rule: &Rule, burst: &Burst, outcome: &Outcome) -> anyhow::Result<(String, bool)> {
    let limit = rule.limits[0];
    let Outcome { deliveries, duplicates, dead, feedback } = outcome;
    let mut scheduled: BTreeMap<(&str, Millis), u64> = BTreeMap::new();
    let mut observed: BTreeMap<(&str, Millis), u64> = BTreeMap::new();
    for delivery in deliveries.values() {
        *scheduled.entry((&delivery.merchant, delivery.scheduled_for.div_euclid(limit.per()))).or_default() += 1;
        *observed.entry((&delivery.merchant, delivery.delivered_at.div_euclid(limit.per()))).or_default() += 1;
    }
    let max_scheduled = scheduled.values().max().copied().unwrap_or(0);
    let max_observed = observed.values().max().copied().unwrap_or(0);
    let mut delays: Vec<Millis> = deliveries
        .iter()
        .map(|(id, d)| d.scheduled_for - burst.published_at.get(id).copied().unwrap_or(burst.started))
        .map(|d| d.max(0))
        .collect();
    let mut lateness: Vec<Millis> =
        deliveries.values().filter(|d| d.route != "forward").map(|d| d.delivered_at - d.scheduled_for).collect();
    delays.sort_unstable();
    lateness.sort_unstable();
    let lost = args.events.saturating_sub(deliveries.len() + dead.len());
    let forwarded = deliveries.values().filter(|d| d.route == "forward").count();
    let mut summary = String::new();
    summary += &format!("\nevents in:            {}\n", args.events);
    let routes = if args.throttle.is_some() {
        format!("{} delivered to the partner", deliveries.len())
    } else {
        format!("{forwarded} forwarded at once, {} delayed", deliveries.len() - forwarded)
    };
    summary += &format!(
        "events out:           {} ({routes}, {} dead-lettered{})\n",
        deliveries.len() + dead.len(),
        dead.len(),
        if dead.is_empty() { String::new() } else { format!(": {:?}", dead.values().collect::<HashSet<_>>()) }
    );
    summary += &format!("duplicates:           {duplicates} (a message id delivered twice)\n");
    summary += &format!("lost:                 {lost}\n");
    summary += &format!(
        "delay p50 / p99:      {:.1} s / {:.1} s\n",
        percentile(&delays, 0.5) as f64 / 1e3,
        percentile(&delays, 0.99) as f64 / 1e3
    );
    summary += &format!(
        "dispatch lateness:    p50 {} ms / p99 {} ms (Cloud Tasks stand-in -> dispatcher -> overflow)\n",
        percentile(&lateness, 0.5),
        percentile(&lateness, 0.99)
    );
    summary += &format!(
        "max per window:       {max_scheduled} scheduled, {max_observed} observed downstream, limit {} ({limit}; delivery_margin {} ms)\n",
        limit.limit(),
        rule.delivery_margin
    );
    if args.throttle.is_some() {
        let lowest = feedback.levels.iter().map(|l| l.1).fold(f64::INFINITY, f64::min);
        let last = feedback.levels.last().map_or(1.0, |l| l.1);
        let paused = feedback.levels.iter().filter(|l| l.2).map(|l| l.0).collect::<Vec<_>>();
        summary += &format!(
            "downstream:           answered 429 (Retry-After: 3) {} times, from 1 s to 7 s\n",
            feedback.refusals
        );
        summary += &format!(
            "merchant {}:        paused {}; adaptive level lowest {lowest:.2}, at the end {last:.2}\n",
            burst.merchants[0],
            match (paused.first(), paused.last()) {
                (Some(a), Some(b)) => format!("from {:.1} s to {:.1} s", *a as f64 / 1e3, *b as f64 / 1e3),
                _ => "never".into(),
            }
        );
        let samples: Vec<String> = feedback
            .levels
            .iter()
            .step_by((feedback.levels.len() / 12).max(1))
            .map(|(at, level, _)| format!("{:.0}s {level:.2}", *at as f64 / 1e3))
            .collect();
        summary += &format!("adaptive level:       {}\n", samples.join(", "));
    }
    let chart = args.out.join("drip-demo.svg");
    std::fs::create_dir_all(&args.out)?;
    draw_chart(&chart, burst, deliveries, limit)?;
    summary += &format!("chart:                {}\n", chart.display());
    if args.throttle.is_some() {
        let levels = args.out.join("drip-feedback.svg");
        draw_feedback_chart(&levels, feedback, limit)?;
        summary += &format!("adaptive chart:       {}\n", levels.display());
    }
    // With a delivery margin the promise is made where the downstream observes it.
    let observed_ok = rule.delivery_margin == 0 || max_observed <= limit.limit();
    // The demo's burst always fits its rule: an event dead-lettered is a demo that drained nothing
    // (a rules file whose key the demo's events do not carry, say), not a success.
    let ok = lost == 0 && dead.is_empty() && *duplicates == 0 && max_scheduled <= limit.limit() && observed_ok;
    summary += if ok {
        "result:               OK: every event delivered, nothing lost, nothing doubled, no window over its limit\n"
    } else if !dead.is_empty() {
        "result:               FAILED: events were dead-lettered instead of delivered\n"
    } else {
        "result:               FAILED\n"
    };
    if max_observed > limit.limit() {
        summary += &format!(
            "note:                 a window saw more deliveries than the limit: a delivery was later than the rule's delivery_margin ({} ms)\n",
            rule.delivery_margin
        );
    }
    Ok((summary, ok))
}

fn delivery_of(message: &Pulled, route: &'static str, merchant_of: &HashMap<String, String>) -> Option<Delivery> {
    let id = message.attributes.get("drip-message-id")?;
    Some(Delivery {
        merchant: merchant_of.get(id).cloned().unwrap_or_default(),
        route,
        scheduled_for: parse_rfc3339(message.attributes.get("drip-scheduled-for")?).ok()?,
        delivered_at: parse_rfc3339(&message.publish_time).ok()?,
    })
}

/// Moves the cursor up over the previous frame and clears it.
fn clear_lines(lines: usize) -> String {
    if lines == 0 { String::new() } else { format!("\x1b[{lines}A\x1b[J") }
}

/// The `p` quantile of sorted values (nearest rank).
fn percentile(sorted: &[Millis], p: f64) -> Millis {
    sorted.get(((sorted.len().max(1) - 1) as f64 * p).round() as usize).copied().unwrap_or(0)
}

fn bar(filled: usize, width: usize) -> String {
    format!("{}{}", "█".repeat(filled.min(width)), "░".repeat(width - filled.min(width)))
}

fn render_frame(args: &Args, rule: &Rule, merchants: &[String], outcome: &Outcome, started: Millis) -> String {
    let deliveries = &outcome.deliveries;
    let limit = rule.limits[0];
    let now = wall_clock_millis();
    let per_merchant = args.events.div_ceil(merchants.len());
    let mut frame = format!(
        "Drip demo: {} payouts over {} merchants, limit {limit}   t = {:.1} s\n\n",
        args.events,
        merchants.len(),
        (now - started) as f64 / 1e3
    );
    for merchant in merchants {
        let mine: Vec<&Delivery> = deliveries.values().filter(|d| &d.merchant == merchant).collect();
        let recent = mine.iter().filter(|d| d.delivered_at > now - limit.per()).count();
        frame += &format!(
            "  merchant {merchant}  {} {:>3} in the last {}   delivered {:>4}/{per_merchant}\n",
            bar(recent * 20 / limit.limit().max(1) as usize, 20),
            recent,
            humantime::format_duration(Duration::from_millis(limit.per() as u64)),
            mine.len()
        );
    }
    let done = deliveries.len() + outcome.dead.len();
    frame += &format!("\n  backlog  {} {done}/{} delivered\n", bar(done * 40 / args.events.max(1), 40), args.events);
    if let Some(&(_, level, paused)) = outcome.feedback.levels.last() {
        let refusing = now - started >= THROTTLE_FROM && now - started < THROTTLE_UNTIL;
        frame += &format!(
            "\n  downstream  {}   merchant {}: {}, adaptive level {level:.2} ({:.0} a second)\n",
            if refusing { "429 Retry-After: 3" } else { "204 OK            " },
            merchants[0],
            if paused { "PAUSED" } else { "going " },
            level * limit.limit() as f64
        );
    }
    frame
}

/// The feedback scenario's target refuses from 1 s to 7 s after the burst.
const THROTTLE_FROM: Millis = 1_000;
const THROTTLE_UNTIL: Millis = 7_000;

#[derive(Default)]
struct Feedback {
    /// How many requests the target answered 429.
    refusals: usize,
    /// (ms since the burst, the first merchant's adaptive level, whether it was paused).
    levels: Vec<(Millis, f64, bool)>,
}

/// One request the throttling target answered.
struct Hit {
    id: String,
    scheduled_for: Millis,
    at: Millis,
    accepted: bool,
}

/// The feedback scenario's downstream: the rule's forward and overflow URL.
struct Throttle {
    hits: std::sync::Arc<std::sync::Mutex<Vec<Hit>>>,
    started: std::sync::Arc<std::sync::atomic::AtomicI64>,
}

impl Throttle {
    async fn serve(address: &str) -> anyhow::Result<Self> {
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

    fn start(&self, at: Millis) {
        self.started.store(at, std::sync::atomic::Ordering::Relaxed);
    }

    /// Files each accepted request as a delivery; returns how many were refused so far.
    fn take_deliveries(&self, merchant_of: &HashMap<String, String>, into: &mut HashMap<String, Delivery>) -> usize {
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
    fn duplicates(&self) -> usize {
        let hits = self.hits.lock().unwrap_or_else(|e| e.into_inner());
        let accepted: Vec<&String> = hits.iter().filter(|h| h.accepted).map(|h| &h.id).collect();
        accepted.len() - accepted.iter().collect::<HashSet<_>>().len()
    }
}

type SecondsChart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// The demo's charts: seconds since the burst (0..end) across, 0..top up, on white.
fn seconds_chart<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    caption: &str,
    (end, top): (f64, f64),
) -> anyhow::Result<SecondsChart<'a, 'b>> {
    root.fill(&WHITE)?;
    Ok(ChartBuilder::on(root)
        .caption(caption, ("sans-serif", 20))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(52)
        .build_cartesian_2d(0f64..end, 0f64..top)?)
}

/// The legend at the lower right, and the file written.
fn finish<'a, 'b: 'a>(
    mut chart: SecondsChart<'a, 'b>,
    root: &DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.85))
        .draw()?;
    root.present()?;
    Ok(())
}

/// The feedback scenario: the first merchant's count in force per window (level × limit) over
/// time, its pauses shaded, and when the partner refused.
fn draw_feedback_chart(
    path: &std::path::Path,
    feedback: &Feedback,
    limit: drip_core::rules::Limit,
) -> anyhow::Result<()> {
    let seconds = |t: Millis| t as f64 / 1e3;
    let end = feedback.levels.last().map_or(1.0, |l| seconds(l.0)).max(1.0);
    let top = limit.limit() as f64 * 1.1;
    let root = SVGBackend::new(path, (1100, 360)).into_drawing_area();
    let caption = "The partner's 429s, the pause and the adaptive limit (merchant m001)";
    let mut chart = seconds_chart(&root, caption, (end, top))?;
    chart
        .configure_mesh()
        .x_desc("seconds since the burst was published")
        .y_desc(format!("count in force per {} ms", limit.per()))
        .draw()?;
    chart
        .draw_series([Rectangle::new(
            [(seconds(THROTTLE_FROM), 0.0), (seconds(THROTTLE_UNTIL), top)],
            RED.mix(0.08).filled(),
        )])?
        .label("the partner answers 429, Retry-After: 3")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], RED.mix(0.2).filled()));
    let paused: Vec<f64> = feedback.levels.iter().filter(|l| l.2).map(|l| seconds(l.0)).collect();
    chart
        .draw_series(paused.iter().map(|&t| Rectangle::new([(t - 0.05, 0.0), (t + 0.05, top * 0.05)], BLACK.filled())))?
        .label("the key is paused")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], BLACK.filled()));
    let steps: Vec<(f64, f64)> =
        feedback.levels.iter().map(|&(at, level, _)| (seconds(at), level * limit.limit() as f64)).collect();
    chart
        .draw_series(LineSeries::new(steps, BLUE.stroke_width(2)))?
        .label("the adaptive count in force (level × limit)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLUE.stroke_width(2)));
    finish(chart, &root)
}

/// One panel per merchant, one above the other on a shared time axis (their curves coincide when
/// drawn together): each merchant's arrivals (faint), deliveries and the limit's line.
fn draw_chart(
    path: &std::path::Path,
    burst: &Burst,
    deliveries: &HashMap<String, Delivery>,
    limit: drip_core::rules::Limit,
) -> anyhow::Result<()> {
    let Burst { merchants, merchant_of, published_at, started } = burst;
    let (started, limit, per) = (*started, limit.limit(), limit.per());
    let seconds = |t: Millis| (t - started) as f64 / 1e3;
    let end = deliveries.values().map(|d| seconds(d.delivered_at)).fold(1.0, f64::max) * 1.05;
    let top = (merchants.iter().map(|m| merchant_of.values().filter(|v| *v == m).count()).max().unwrap_or(1) as f64
        * 1.1)
        .max(1.0);
    let colors = crate::plot::KEY_COLORS;
    let drawn = merchants.len().clamp(1, colors.len());
    let root = SVGBackend::new(path, (1100, 60 + 190 * drawn as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut caption =
        format!("Arrivals vs deliveries, one merchant a panel (limit {limit} per {} s)", per as f64 / 1e3);
    if merchants.len() > drawn {
        caption.push_str(&format!("; {} more merchants not drawn", merchants.len() - drawn));
    }
    let (title, body) = root.split_vertically(44);
    title.titled(&caption, ("sans-serif", 20))?;
    let slope = limit as f64 / (per as f64 / 1e3);
    for (index, (area, merchant)) in body.split_evenly((drawn, 1)).iter().zip(merchants).enumerate() {
        let color = colors[index];
        let mut chart = ChartBuilder::on(area)
            .caption(format!("merchant {merchant}"), ("sans-serif", 15))
            .margin(8)
            .x_label_area_size(if index + 1 == drawn { 36 } else { 18 })
            .y_label_area_size(52)
            .build_cartesian_2d(0f64..end, 0f64..top)?;
        let mut mesh = chart.configure_mesh();
        mesh.y_desc("events").y_labels(4).y_label_formatter(&|v| format!("{v:.0}"));
        if index + 1 == drawn {
            mesh.x_desc("seconds since the burst was published");
        }
        mesh.draw()?;
        let mut arrivals: Vec<f64> = merchant_of
            .iter()
            .filter(|(_, m)| *m == merchant)
            .filter_map(|(id, _)| published_at.get(id))
            .map(|&t| seconds(t))
            .collect();
        arrivals.sort_by(f64::total_cmp);
        let mut delivered: Vec<f64> =
            deliveries.values().filter(|d| &d.merchant == merchant).map(|d| seconds(d.delivered_at)).collect();
        delivered.sort_by(f64::total_cmp);
        let steps = |times: &[f64]| {
            let mut points = vec![(0.0, 0.0)];
            for (n, &t) in times.iter().enumerate() {
                points.push((t, n as f64));
                points.push((t, n as f64 + 1.0));
            }
            points.push((end, times.len() as f64));
            points
        };
        chart
            .draw_series(LineSeries::new(steps(&arrivals), color.mix(0.35).stroke_width(2)))?
            .label("arrived")
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.mix(0.35).stroke_width(2)));
        chart
            .draw_series(LineSeries::new(steps(&delivered), color.stroke_width(2)))?
            .label("delivered")
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(
                [(0.0, limit as f64), (end, limit as f64 + slope * end)],
                BLACK.mix(0.6).stroke_width(1),
            ))?
            .label(format!("the limit: {limit} at once, then {slope:.0} per second"))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.mix(0.6)));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.85))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        demo: Args,
    }

    /// The chart draws each merchant in a panel of its own (drawn together their curves, all at
    /// the same limit, fall on one line): a caption, both curves and the limit in each.
    #[test]
    fn the_chart_gives_each_merchant_a_panel_of_its_own() {
        let merchants: Vec<String> = ["m001", "m002", "m003"].map(String::from).into();
        let (mut merchant_of, mut published_at, mut deliveries) = (HashMap::new(), HashMap::new(), HashMap::new());
        for i in 0..30 {
            let (id, merchant) = (format!("e{i}"), merchants[i % 3].clone());
            merchant_of.insert(id.clone(), merchant.clone());
            published_at.insert(id.clone(), 10);
            let delivered_at = 1_000 * (i as Millis / 6);
            deliveries.insert(id, Delivery { merchant, route: "ready", scheduled_for: delivered_at, delivered_at });
        }
        let burst = Burst { merchants, merchant_of, published_at, started: 0 };
        let path = std::env::temp_dir().join(format!("drip-demo-chart-{}.svg", std::process::id()));
        let limit =
            drip_core::rules::Limit::new(2, 1_000, drip_core::rules::Window::Fixed(drip_core::rules::Placement::Start))
                .unwrap();
        draw_chart(&path, &burst, &deliveries, limit).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).ok();
        for merchant in ["m001", "m002", "m003"] {
            assert_eq!(svg.matches(&format!("merchant {merchant}")).count(), 1, "a panel of its own: {merchant}");
        }
        assert_eq!(svg.matches("\ndelivered\n").count(), 3, "each panel says which curve is which");
        assert_eq!(svg.matches("\narrived\n").count(), 3);
        assert_eq!(svg.matches("the limit: 2 at once").count(), 3);
    }

    /// A rules file whose key the demo's events do not carry dead-letters every event: that is a
    /// demo that drained nothing, not a success, though nothing was lost.
    #[test]
    fn a_demo_whose_events_were_dead_lettered_fails() {
        let out = std::env::temp_dir().join(format!("drip-demo-test-{}", std::process::id()));
        let out = out.to_str().unwrap();
        let command = Command::parse_from(["drip", "--pubsub-emulator", "-", "--limiter", "-", "--rules", "-"]);
        let args = Args { events: 2, out: out.into(), ..command.demo };
        let rules = RuleSet::load(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/payouts.yaml").as_ref()).unwrap();
        let rule = rules.rules.first().unwrap();
        let burst = Burst {
            merchants: vec!["m1".into()],
            merchant_of: HashMap::new(),
            published_at: HashMap::new(),
            started: 0,
        };
        let dead = HashMap::from([("a".into(), "missing_key_field".into()), ("b".into(), "missing_key_field".into())]);
        let outcome = Outcome { dead, ..Outcome::default() };
        let (text, ok) = summarize(&args, rule, &burst, &outcome).unwrap();
        assert!(!ok, "{text}");
        assert!(text.contains("lost:                 0"), "nothing lost: {text}");
        assert!(text.contains("FAILED: events were dead-lettered instead of delivered"), "{text}");
        std::fs::remove_dir_all(out).ok();
    }
}
