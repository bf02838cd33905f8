//! `drip demo`: publishes a burst of payouts onto the local stack `./run demo` started, watches
//! them drain live, then prints a summary, writes a chart, and exits 0 only if nothing was lost
//! and no window got more than its limit.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use drip_core::rules::{Forward, Rule, RuleSet};
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

async fn demo(args: &Args) -> anyhow::Result<bool> {
    let rules = RuleSet::load(&args.rules).map_err(|errors| anyhow::anyhow!("{errors}"))?;
    let rule =
        rules.rule(&args.rule).with_context(|| format!("no rule '{}' in {}", args.rule, args.rules.display()))?;
    let Forward::Topic(forward_topic) = &rule.forward else { bail!("the demo rule must forward to a topic") };
    let limit = rule.limits[0];
    let dlq_topic = rule.dlq_topic.clone();
    let pubsub = EmulatorClient::new(&args.pubsub_emulator, &args.project);
    for topic in [forward_topic.as_str(), rule.overflow_topic.as_str(), dlq_topic.as_str()] {
        pubsub.topic_with_subscription(topic).await?;
    }
    let source = "payouts-source";
    pubsub.create_topic(source).await?;
    pubsub.create_subscription(source, source, Some(&format!("{}/push", args.limiter.trim_end_matches('/')))).await?;

    let merchants: Vec<String> = (1..=args.keys).map(|k| format!("m{k:03}")).collect();
    let mut merchant_of: HashMap<String, String> = HashMap::new();
    let started = wall_clock_millis();
    let mut published_at: HashMap<String, Millis> = HashMap::new();
    let mut batch = Vec::new();
    for i in 0..args.events {
        let merchant = &merchants[i % merchants.len()];
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
            let ids = pubsub.publish_batch(source, &batch).await?;
            let first = i + 1 - batch.len();
            for (offset, id) in ids.into_iter().enumerate() {
                merchant_of.insert(id.clone(), merchants[(first + offset) % merchants.len()].clone());
                published_at.insert(id, sent);
            }
            batch.clear();
        }
    }

    let live = std::io::stdout().is_terminal();
    let mut deliveries: HashMap<String, Delivery> = HashMap::new();
    let mut duplicates = 0usize;
    let mut dead: HashMap<String, String> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    let mut last_frame = Instant::now() - Duration::from_secs(1);
    let mut printed_lines = 0;
    while deliveries.len() + dead.len() < args.events && Instant::now() < deadline {
        for (topic, route) in [(forward_topic.as_str(), "forward"), (rule.overflow_topic.as_str(), "delay")] {
            for message in pubsub.pull(topic, 1_000).await? {
                let Some(delivery) = delivery_of(&message, route, &merchant_of) else { continue };
                let id = message.attributes.get("drip-message-id").cloned().unwrap_or_default();
                if deliveries.insert(id, delivery).is_some() {
                    duplicates += 1;
                }
            }
        }
        for message in pubsub.pull(&dlq_topic, 1_000).await? {
            let reason = message.attributes.get("drip-reason").cloned().unwrap_or_default();
            dead.insert(message.attributes.get("drip-message-id").cloned().unwrap_or(message.message_id), reason);
        }
        if last_frame.elapsed() >= Duration::from_millis(if live { 250 } else { 1_000 }) {
            let frame = render_frame(args, rule, &merchants, &deliveries, dead.len(), started);
            if live {
                print!("{}{frame}", clear_lines(printed_lines));
                printed_lines = frame.lines().count();
            } else {
                println!(
                    "t={:>5.1}s delivered {}/{}",
                    (wall_clock_millis() - started) as f64 / 1_000.0,
                    deliveries.len(),
                    args.events
                );
            }
            std::io::stdout().flush()?;
            last_frame = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if live {
        print!(
            "{}{}",
            clear_lines(printed_lines),
            render_frame(args, rule, &merchants, &deliveries, dead.len(), started)
        );
    }

    // What the limit promises: no window of any merchant's slots holds more than the limit.
    let mut scheduled: BTreeMap<(&str, Millis), u64> = BTreeMap::new();
    let mut observed: BTreeMap<(&str, Millis), u64> = BTreeMap::new();
    for delivery in deliveries.values() {
        *scheduled.entry((&delivery.merchant, delivery.scheduled_for.div_euclid(limit.per))).or_default() += 1;
        *observed.entry((&delivery.merchant, delivery.delivered_at.div_euclid(limit.per))).or_default() += 1;
    }
    let max_scheduled = scheduled.values().max().copied().unwrap_or(0);
    let max_observed = observed.values().max().copied().unwrap_or(0);
    let mut delays: Vec<Millis> = deliveries
        .iter()
        .map(|(id, d)| d.scheduled_for - published_at.get(id).copied().unwrap_or(started))
        .map(|d| d.max(0))
        .collect();
    let mut lateness: Vec<Millis> =
        deliveries.values().filter(|d| d.route == "delay").map(|d| d.delivered_at - d.scheduled_for).collect();
    delays.sort_unstable();
    lateness.sort_unstable();
    let lost = args.events - deliveries.len() - dead.len();
    let forwarded = deliveries.values().filter(|d| d.route == "forward").count();
    let mut summary = String::new();
    summary += &format!("\nevents in:            {}\n", args.events);
    summary += &format!(
        "events out:           {} ({} forwarded at once, {} delayed, {} dead-lettered{})\n",
        deliveries.len() + dead.len(),
        forwarded,
        deliveries.len() - forwarded,
        dead.len(),
        if dead.is_empty() { String::new() } else { format!(": {:?}", dead.values().collect::<HashSet<_>>()) }
    );
    summary += &format!("duplicates:           {duplicates} (identified by drip-message-id)\n");
    summary += &format!("lost:                 {lost}\n");
    summary += &format!(
        "delay p50 / p99:      {:.1} s / {:.1} s\n",
        pct(&delays, 0.5) as f64 / 1e3,
        pct(&delays, 0.99) as f64 / 1e3
    );
    summary += &format!(
        "dispatch lateness:    p50 {} ms / p99 {} ms (Cloud Tasks stand-in -> dispatcher -> overflow topic)\n",
        pct(&lateness, 0.5),
        pct(&lateness, 0.99)
    );
    summary += &format!(
        "max per window:       {max_scheduled} scheduled, {max_observed} observed at the topics, limit {} ({limit})\n",
        limit.limit
    );
    let chart = args.out.join("drip-demo.svg");
    std::fs::create_dir_all(&args.out)?;
    draw_chart(&chart, &merchants, &deliveries, &published_at, &merchant_of, started, limit.limit, limit.per)?;
    summary += &format!("chart:                {}\n", chart.display());
    let ok = lost == 0 && max_scheduled <= limit.limit;
    summary += if ok {
        "result:               OK: nothing lost, no window over its limit\n"
    } else {
        "result:               FAILED\n"
    };
    if max_observed > limit.limit {
        summary += "note:                 a window saw more deliveries than the limit: dispatch lateness moved slots into the next window\n";
    }
    print!("{summary}");
    std::fs::write(args.out.join("summary.txt"), &summary)?;
    Ok(ok)
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

fn pct(sorted: &[Millis], p: f64) -> Millis {
    sorted.get(((sorted.len().max(1) - 1) as f64 * p).round() as usize).copied().unwrap_or(0)
}

fn bar(filled: usize, width: usize) -> String {
    format!("{}{}", "█".repeat(filled.min(width)), "░".repeat(width - filled.min(width)))
}

fn render_frame(
    args: &Args,
    rule: &Rule,
    merchants: &[String],
    deliveries: &HashMap<String, Delivery>,
    dead: usize,
    started: Millis,
) -> String {
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
        let recent = mine.iter().filter(|d| d.delivered_at > now - limit.per).count();
        frame += &format!(
            "  merchant {merchant}  {} {:>3} in the last {}   delivered {:>4}/{per_merchant}\n",
            bar(recent * 20 / limit.limit.max(1) as usize, 20),
            recent,
            humantime::format_duration(Duration::from_millis(limit.per as u64)),
            mine.len()
        );
    }
    let done = deliveries.len() + dead;
    frame += &format!("\n  backlog  {} {done}/{} delivered\n", bar(done * 40 / args.events.max(1), 40), args.events);
    frame
}

#[allow(clippy::too_many_arguments)]
fn draw_chart(
    path: &std::path::Path,
    merchants: &[String],
    deliveries: &HashMap<String, Delivery>,
    published_at: &HashMap<String, Millis>,
    merchant_of: &HashMap<String, String>,
    started: Millis,
    limit: u64,
    per: Millis,
) -> anyhow::Result<()> {
    let seconds = |t: Millis| (t - started) as f64 / 1e3;
    let end = deliveries.values().map(|d| seconds(d.delivered_at)).fold(1.0, f64::max) * 1.05;
    let top = (merchants.iter().map(|m| merchant_of.values().filter(|v| *v == m).count()).max().unwrap_or(1) as f64
        * 1.1)
        .max(1.0);
    let root = SVGBackend::new(path, (1100, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Arrivals vs deliveries per merchant (limit {limit} per {} s)", per as f64 / 1e3),
            ("sans-serif", 20),
        )
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(52)
        .build_cartesian_2d(0f64..end, 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the burst was published")
        .y_desc("events (cumulative)")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    let colors = crate::plot::KEY_COLORS;
    for (index, merchant) in merchants.iter().enumerate().take(colors.len()) {
        let color = colors[index];
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
        chart.draw_series(LineSeries::new(steps(&arrivals), color.mix(0.35).stroke_width(2)))?;
        chart
            .draw_series(LineSeries::new(steps(&delivered), color.stroke_width(2)))?
            .label(format!("merchant {merchant}: delivered (faint: arrived)"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    let slope = limit as f64 / (per as f64 / 1e3);
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
    root.present()?;
    Ok(())
}
