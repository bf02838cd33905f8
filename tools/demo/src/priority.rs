//! The priority scenario (`./run demo --scenario priority`): one merchant's bulk burst and a
//! trickle of its live payouts under one limit, through two rules side by side in one run:
//! `payouts-fifo` (no classes: the merchant's events in one FIFO) and `payouts-classes` (live
//! payouts are a class with a reserve of each window). The demo consumes both rules' topics and
//! prints, for each, the live payouts' delay, the bulk burst's drain time and the most any window
//! held at the slots and at the topics; the chart draws each live payout's delay.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use drip_core::time::{Millis, parse_rfc3339, wall_clock_millis};
use plotters::prelude::*;
use pubsub_emulator_client::EmulatorClient;

use crate::*;

/// The bulk burst, published at once, and the live payouts, one every `LIVE_EVERY_MS` after it.
const BULK: usize = 1_800;
const LIVE: usize = 40;
const LIVE_EVERY_MS: u64 = 1_000;
const LANES: [&str; 2] = ["fifo", "classes"];

/// What one lane's topics carried: by payout number, its class, slot and publish time there.
#[derive(Default)]
struct Lane {
    seen: HashMap<String, (String, Millis, Millis)>,
    duplicates: usize,
}

/// One lane's figures.
struct Figures {
    live_p50: f64,
    live_p99: f64,
    /// Seconds from the burst to the last bulk payout's delivery.
    bulk_drain: f64,
    most_at_slots: usize,
    most_at_topics: usize,
    lost: usize,
    duplicates: usize,
}

/// The `i`th payout of a lane: bulk (no `priority`: the rule's default class) or live.
fn priority_payout(i: usize, lane: &str, live: bool) -> (Vec<u8>, BTreeMap<String, String>) {
    let (data, mut attributes) = payout(i, "m001");
    attributes.insert("variant".into(), lane.into());
    attributes.insert("payout".into(), i.to_string());
    if live {
        attributes.insert("priority".into(), "live".into());
    }
    (data, attributes)
}

/// Pulls what a lane's rule forwarded and overflowed until `until`.
async fn consume(lane: &str, pubsub: &EmulatorClient, held: &mut Lane) -> anyhow::Result<()> {
    for subscription in [format!("payouts-{lane}-ready"), format!("payouts-{lane}-overflow")] {
        for message in pubsub.pull(&subscription, 1_000).await? {
            let id = message.attributes.get("payout").cloned().unwrap_or_default();
            let class = message.attributes.get("priority").cloned().unwrap_or_else(|| "bulk".into());
            let slot = message.attributes.get("drip-scheduled-for").and_then(|s| parse_rfc3339(s).ok());
            let at = parse_rfc3339(&message.publish_time).ok();
            let (Some(slot), Some(at)) = (slot, at) else { continue };
            if held.seen.insert(id, (class, slot, at)).is_some() {
                held.duplicates += 1;
            }
        }
    }
    Ok(())
}

fn percentile(sorted: &[f64], p: usize) -> f64 {
    sorted.get((sorted.len() * p / 100).min(sorted.len().saturating_sub(1))).copied().unwrap_or(0.0)
}

/// The most any window of `per` ms holds of `times`.
fn most_per_window(times: impl Iterator<Item = Millis>, per: Millis) -> usize {
    let mut windows: HashMap<Millis, usize> = HashMap::new();
    for t in times {
        *windows.entry(t.div_euclid(per)).or_default() += 1;
    }
    windows.into_values().max().unwrap_or(0)
}

/// Runs the scenario; prints both lanes side by side and draws the live payouts' delays. True when
/// every payout reached its topic once, no window held more than the limit (at the slots and at
/// the topics) and nothing was dead-lettered.
pub(crate) async fn priority_scenario(args: &Args) -> anyhow::Result<bool> {
    let (rules, pubsub) = set_up_lanes(args).await?;
    let limit = rules.rule("payouts-classes").and_then(|r| r.limits.first().copied());
    let Some(limit) = limit else { anyhow::bail!("the priority scenario needs rule payouts-classes") };
    println!(
        "one merchant: {BULK} bulk payouts at once, then (once the limiter took them in) a live payout every {LIVE_EVERY_MS} ms ({LIVE} in all), under {} per {} ms; \
         each through payouts-fifo (no classes) and payouts-classes (live reserves a share of each window)",
        limit.limit(),
        limit.per()
    );
    let started = wall_clock_millis();
    let mut published: HashMap<(&str, String), (bool, Millis)> = HashMap::new();
    for chunk in (0..BULK).collect::<Vec<_>>().chunks(100) {
        let batch: Vec<_> = chunk.iter().flat_map(|&i| LANES.map(|lane| priority_payout(i, lane, false))).collect();
        let at = wall_clock_millis();
        pubsub.publish_batch(SOURCE, &batch).await?;
        for (_, attributes) in &batch {
            let lane = if attributes["variant"] == "fifo" { LANES[0] } else { LANES[1] };
            published.insert((lane, attributes["payout"].clone()), (false, at));
        }
    }
    // The live payouts come once the limiter has decided every bulk payout: published earlier, they
    // would wait in the push subscription behind the burst, which measures the local emulator.
    let taken_in = decided_all(&args.limiter, 2 * BULK, started + 120_000).await;
    println!(
        "the limiter decided the {} bulk payouts {:.1} s after the burst was published",
        2 * BULK,
        (taken_in - started) as f64 / 1e3
    );
    let mut lanes: HashMap<&str, Lane> = LANES.iter().map(|&lane| (lane, Lane::default())).collect();
    let mut dead = Vec::new();
    let deadline = started + args.timeout_secs as Millis * 1_000;
    let mut next_live = tokio::time::Instant::now();
    let mut live_sent = 0;
    let mut report_at = started + 5_000;
    loop {
        if live_sent < LIVE && tokio::time::Instant::now() >= next_live {
            let i = BULK + live_sent;
            let batch: Vec<_> = LANES.iter().map(|lane| priority_payout(i, lane, true)).collect();
            let at = wall_clock_millis();
            pubsub.publish_batch(SOURCE, &batch).await?;
            for lane in LANES {
                published.insert((lane, i.to_string()), (true, at));
            }
            live_sent += 1;
            next_live += Duration::from_millis(LIVE_EVERY_MS);
        }
        for lane in LANES {
            consume(lane, &pubsub, lanes.get_mut(lane).expect("every lane")).await?;
        }
        pull_dead_letters(&pubsub, &rules, &mut dead).await?;
        let delivered: usize = lanes.values().map(|l| l.seen.len()).sum();
        let total = 2 * (BULK + LIVE);
        let now = wall_clock_millis();
        if now >= report_at {
            println!(
                "  +{:>3} s  delivered {delivered} of {total}, dead-lettered {}",
                (now - started) / 1_000,
                dead.len()
            );
            report_at += 5_000;
        }
        if (live_sent == LIVE && delivered + dead.len() >= total) || now > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut rows = BTreeMap::new();
    let mut delays: HashMap<&str, Vec<(f64, f64)>> = HashMap::new();
    let mut ok = dead.is_empty();
    for lane in LANES {
        let held = &lanes[lane];
        let sent: Vec<(&String, &(bool, Millis))> =
            published.iter().filter(|((l, _), _)| *l == lane).map(|((_, id), v)| (id, v)).collect();
        let lost = sent.iter().filter(|(id, _)| !held.seen.contains_key(*id)).count();
        let mut live: Vec<f64> = Vec::new();
        for &(id, &(is_live, at)) in &sent {
            if let Some((_, _, delivered)) = held.seen.get(id).filter(|_| is_live) {
                let delay = (delivered - at) as f64 / 1e3;
                live.push(delay);
                delays.entry(lane).or_default().push(((at - started) as f64 / 1e3, delay));
            }
        }
        live.sort_by(f64::total_cmp);
        let bulk_drain = held.seen.values().filter(|(class, ..)| class == "bulk").map(|&(_, _, at)| at).max();
        let figures = Figures {
            live_p50: percentile(&live, 50),
            live_p99: percentile(&live, 99),
            bulk_drain: bulk_drain.map_or(0.0, |at| (at - started) as f64 / 1e3),
            most_at_slots: most_per_window(held.seen.values().map(|&(_, slot, _)| slot), limit.per()),
            most_at_topics: most_per_window(held.seen.values().map(|&(_, _, at)| at), limit.per()),
            lost,
            duplicates: held.duplicates,
        };
        ok &= figures.lost == 0 && figures.duplicates == 0;
        ok &= figures.most_at_slots as u64 <= limit.limit() && figures.most_at_topics as u64 <= limit.limit();
        rows.insert(lane, figures);
    }
    println!("\n{:<34}{:>14}{:>14}", "", "no classes", "classes");
    let row = |name: &str, f: &dyn Fn(&Figures) -> String| {
        println!("{name:<34}{:>14}{:>14}", f(&rows["fifo"]), f(&rows["classes"]));
    };
    row("live payouts' delay p50", &|r| format!("{:.2} s", r.live_p50));
    row("live payouts' delay p99", &|r| format!("{:.2} s", r.live_p99));
    row("bulk burst drained after", &|r| format!("{:.1} s", r.bulk_drain));
    row("most in a window, at the slots", &|r| r.most_at_slots.to_string());
    row("most in a window, at the topics", &|r| r.most_at_topics.to_string());
    row("lost / duplicated", &|r| format!("{} / {}", r.lost, r.duplicates));
    let window = limit.per() as f64 / 1e3;
    let ratio = rows["classes"].bulk_drain / rows["fifo"].bulk_drain.max(f64::EPSILON);
    println!(
        "\nwith classes: live p99 {:.2} s (target ≤ one window, {window} s); bulk drain {ratio:.3}× without (target ≤ 1.05×); \
         most per window {} at the slots, {} at the topics (limit {})",
        rows["classes"].live_p99,
        rows["classes"].most_at_slots,
        rows["classes"].most_at_topics,
        limit.limit()
    );
    std::fs::create_dir_all(&args.out)?;
    let chart = args.out.join("drip-priority.svg");
    draw_priority_chart(&chart, &delays, window)?;
    println!("chart:                {}", chart.display());
    if !dead.is_empty() {
        println!("FAILED: {} events were dead-lettered", dead.len());
    }
    println!("result: {}", if ok { "OK (every payout delivered once, no window over the limit)" } else { "FAILED" });
    Ok(ok)
}

/// When the limiter's decisions (`drip_decisions_total`, every rule and outcome) reach `count`,
/// or `deadline` passes.
async fn decided_all(limiter: &str, count: usize, deadline: Millis) -> Millis {
    let url = format!("{}/metrics", limiter.trim_end_matches('/'));
    let http = reqwest::Client::new();
    loop {
        let text = match http.get(&url).send().await {
            Ok(answer) => answer.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let decided: f64 = text
            .lines()
            .filter(|line| line.starts_with("drip_decisions_total{"))
            .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        let now = wall_clock_millis();
        if decided >= count as f64 || now > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each live payout's delay (publish to its topic) against when it was published, both lanes.
fn draw_priority_chart(
    path: &std::path::Path,
    delays: &HashMap<&str, Vec<(f64, f64)>>,
    window: f64,
) -> anyhow::Result<()> {
    let all = delays.values().flatten();
    let end = all.clone().map(|&(t, _)| t).fold(1.0, f64::max) * 1.1;
    let top = all.map(|&(_, d)| d).fold(window, f64::max) * 1.15;
    let root = SVGBackend::new(path, (1100, 380)).into_drawing_area();
    let caption = "A merchant's live payouts behind its own bulk burst: delay without and with classes";
    let mut chart = seconds_chart(&root, caption, (end, top))?;
    chart
        .configure_mesh()
        .x_desc("seconds since the bulk burst was published")
        .y_desc("live payout's delay (s)")
        .draw()?;
    chart
        .draw_series(LineSeries::new([(0.0, window), (end, window)], BLACK.mix(0.5).stroke_width(1)))?
        .label(format!("one window ({window} s)"))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.mix(0.5)));
    for (lane, color, label) in
        [("fifo", RED, "no classes: behind the bulk"), ("classes", BLUE, "classes: live reserves 1 a window")]
    {
        let mut points = delays.get(lane).cloned().unwrap_or_default();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
        chart.draw_series(points.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
    }
    finish(chart, &root)
}
