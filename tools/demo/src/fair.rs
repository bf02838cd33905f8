//! The fair scenario (`./run demo --scenario fair`): a budget of 40 payouts a second over all
//! merchants; one merchant publishes 800 payouts, three others 4 each four seconds later. Two
//! lanes side by side in one run, one rule and budget each: `payouts-fcfs` (first come, first
//! served) and `payouts-fair` (`fair: true`). Drip calls the partner itself (each rule's forward and
//! overflow URL is its lane of the partner), which accepts everything and logs when.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drip_core::time::{Millis, wall_clock_millis};
use plotters::prelude::*;

use crate::partner::{pull_dead_letters, serve_partner, set_up_lanes};
use crate::publish::payout;
use crate::*;

/// The budget's count per second (examples/demo-fair.yaml).
const BUDGET: usize = 40;
const NOISY: usize = 800;
const QUIET_MERCHANTS: usize = 3;
const QUIET_EACH: usize = 4;
/// The quiet merchants publish this long after the flood.
const QUIET_AFTER: Duration = Duration::from_secs(4);
const LANES: [&str; 2] = ["fcfs", "fair"];
/// Targets: every quiet payout at the partner within this of its publish; the budget busy, and the
/// noisy merchant's share while the others wait, at least these.
const QUIET_WITHIN_MS: Millis = 2_500;
const BUSY_AT_LEAST: f64 = 0.90;
const NOISY_SHARE_AT_LEAST: f64 = 0.50;

/// One payout the partner accepted: its lane, merchant, number, and when.
#[derive(Clone)]
struct Call {
    lane: String,
    merchant: String,
    payout: String,
    at: Millis,
}

type Calls = Arc<Mutex<Vec<Call>>>;

/// Serves the partner on `address`: `/partner/<lane>`, accepting every call.
async fn serve(address: &str) -> anyhow::Result<Calls> {
    let calls: Calls = Arc::default();
    let log = calls.clone();
    serve_partner(address, move |lane, attributes| {
        let payout = attributes.get("payout").cloned().unwrap_or_default();
        let merchant = attributes.get("merchant").cloned().unwrap_or_default();
        let call = Call { lane, merchant, payout, at: wall_clock_millis() };
        log.lock().unwrap_or_else(|e| e.into_inner()).push(call);
        axum::http::StatusCode::NO_CONTENT
    })
    .await?;
    Ok(calls)
}

/// A payout of `merchant` on `lane`, numbered `i` (its attribute `payout`).
fn lane_payout(i: usize, lane: &str, merchant: &str) -> (Vec<u8>, BTreeMap<String, String>) {
    let (data, mut attributes) = payout(i, merchant);
    attributes.insert("variant".into(), lane.into());
    attributes.insert("payout".into(), i.to_string());
    attributes.insert("merchant".into(), merchant.into());
    (data, attributes)
}

/// What one lane's partner saw.
struct Figures {
    /// Each quiet payout's time from publish to the partner, sorted.
    quiet_waits: Vec<Millis>,
    /// Of the budget, delivered in the whole seconds the noisy backlog lasted.
    busy: f64,
    /// The noisy merchant's share of the windows (seconds) in which the quiet ones waited.
    noisy_share: f64,
    /// The most delivered in one second.
    most: usize,
    /// When the noisy backlog was through, from the flood's publish.
    flood_secs: f64,
    lost: usize,
    duplicates: usize,
}

fn figures(calls: &[Call], lane: &str, published: &HashMap<String, (String, Millis)>, flood_at: Millis) -> Figures {
    let of_lane: Vec<&Call> = calls.iter().filter(|c| c.lane == lane).collect();
    let mut first: HashMap<&str, Millis> = HashMap::new();
    for call in &of_lane {
        first.entry(call.payout.as_str()).or_insert(call.at);
    }
    let quiet: Vec<(&String, &Millis)> =
        published.iter().filter(|(_, (m, _))| m != "noisy").map(|(p, (_, at))| (p, at)).collect();
    let mut quiet_waits: Vec<Millis> =
        quiet.iter().filter_map(|(p, at)| first.get(p.as_str()).map(|&got| got - **at)).collect();
    quiet_waits.sort_unstable();
    let mut per_second: BTreeMap<Millis, usize> = BTreeMap::new();
    for call in &of_lane {
        *per_second.entry(call.at.div_euclid(1_000)).or_default() += 1;
    }
    let noisy_calls: Vec<Millis> = of_lane.iter().filter(|c| c.merchant == "noisy").map(|c| c.at).collect();
    let (noisy_from, noisy_to) = (
        noisy_calls.iter().min().copied().unwrap_or(0).div_euclid(1_000),
        noisy_calls.iter().max().copied().unwrap_or(0).div_euclid(1_000),
    );
    // The whole seconds strictly inside the backlog (its first and last are partial).
    let inside: Vec<usize> = per_second.range(noisy_from + 1..noisy_to).map(|(_, &n)| n).collect();
    let busy =
        if inside.is_empty() { 0.0 } else { inside.iter().sum::<usize>() as f64 / (inside.len() * BUDGET) as f64 };
    // The seconds (the budget's windows) from the quiet payouts' publish to the last's delivery.
    let quiet_from = quiet.iter().map(|(_, at)| **at).min().unwrap_or(0).div_euclid(1_000);
    let quiet_to =
        quiet.iter().filter_map(|(p, _)| first.get(p.as_str())).copied().max().unwrap_or(0).div_euclid(1_000);
    let meanwhile: Vec<&&Call> =
        of_lane.iter().filter(|c| (quiet_from..=quiet_to).contains(&c.at.div_euclid(1_000))).collect();
    let noisy_share = meanwhile.iter().filter(|c| c.merchant == "noisy").count() as f64 / meanwhile.len().max(1) as f64;
    let delivered: HashSet<&str> = of_lane.iter().map(|c| c.payout.as_str()).collect();
    Figures {
        quiet_waits,
        busy,
        noisy_share,
        most: per_second.values().copied().max().unwrap_or(0),
        flood_secs: (noisy_calls.iter().max().copied().unwrap_or(flood_at) - flood_at) as f64 / 1e3,
        lost: published.keys().filter(|p| !delivered.contains(p.as_str())).count(),
        duplicates: of_lane.len() - delivered.len(),
    }
}

/// Publishes `payouts` (number, merchant) on every lane at once, in batches of 100: by lane, each
/// payout's merchant and publish time.
async fn publish(
    pubsub: &pubsub_emulator_client::EmulatorClient,
    payouts: &[(usize, String)],
    published: &mut HashMap<&'static str, HashMap<String, (String, Millis)>>,
) -> anyhow::Result<()> {
    for chunk in payouts.chunks(50) {
        let mut batch = Vec::new();
        for lane in LANES {
            batch.extend(chunk.iter().map(|(i, merchant)| lane_payout(*i, lane, merchant)));
        }
        let at = wall_clock_millis();
        pubsub.publish_batch(SOURCE, &batch).await?;
        for lane in LANES {
            let of_lane = published.entry(lane).or_default();
            of_lane.extend(chunk.iter().map(|(i, merchant)| (i.to_string(), (merchant.clone(), at))));
        }
    }
    Ok(())
}

/// Runs the scenario; prints both lanes' figures side by side and draws them. True when every
/// payout reached the partner once, no second held more than the budget, and the fair lane met
/// its targets.
pub(crate) async fn fair_scenario(args: &Args, address: &str) -> anyhow::Result<bool> {
    let (rules, pubsub) = set_up_lanes(args).await?;
    let calls = serve(address).await?;
    println!(
        "a budget of {BUDGET} payouts/s over all merchants; one merchant publishes {NOISY} payouts, {QUIET_MERCHANTS} others \
         {QUIET_EACH} each {} s later; first come, first served beside fair: true",
        QUIET_AFTER.as_secs()
    );
    let mut published = HashMap::new();
    let flood_at = wall_clock_millis();
    let noisy: Vec<(usize, String)> = (0..NOISY).map(|i| (i, "noisy".to_owned())).collect();
    publish(&pubsub, &noisy, &mut published).await?;
    let elapsed = Duration::from_millis((wall_clock_millis() - flood_at) as u64);
    tokio::time::sleep(QUIET_AFTER.saturating_sub(elapsed)).await;
    let quiet: Vec<(usize, String)> =
        (0..QUIET_MERCHANTS * QUIET_EACH).map(|i| (NOISY + i, format!("quiet{}", i % QUIET_MERCHANTS))).collect();
    publish(&pubsub, &quiet, &mut published).await?;
    let total: usize = published.values().map(HashMap::len).sum();
    let deadline = flood_at + args.timeout_secs as Millis * 1_000;
    let mut dead = Vec::new();
    loop {
        let delivered = {
            let calls = calls.lock().unwrap_or_else(|e| e.into_inner());
            calls.iter().map(|c| (&c.lane, &c.payout)).collect::<HashSet<_>>().len()
        };
        pull_dead_letters(&pubsub, &rules, &mut dead).await?;
        println!(
            "  +{:>3} s  delivered {delivered} of {total}, dead-lettered {}",
            (wall_clock_millis() - flood_at) / 1_000,
            dead.len()
        );
        if delivered + dead.len() >= total || wall_clock_millis() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let calls = calls.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let rows: HashMap<&str, Figures> =
        LANES.iter().map(|lane| (*lane, figures(&calls, lane, &published[lane], flood_at))).collect();
    println!("\n{:<46}{:>14}{:>14}", "", "first come", "fair: true");
    let row = |name: &str, f: &dyn Fn(&Figures) -> String| {
        println!("{name:<46}{:>14}{:>14}", f(&rows["fcfs"]), f(&rows["fair"]));
    };
    let pick =
        |waits: &[Millis], q: f64| waits.get(((waits.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0);
    row("quiet payouts at the partner, median", &|r| format!("{:.1} s", pick(&r.quiet_waits, 0.5) as f64 / 1e3));
    row("  slowest", &|r| format!("{:.1} s", pick(&r.quiet_waits, 1.0) as f64 / 1e3));
    row("budget busy while the flood lasts", &|r| format!("{:.0} %", 100.0 * r.busy));
    row("noisy merchant's share while others wait", &|r| format!("{:.0} %", 100.0 * r.noisy_share));
    row("flood through after", &|r| format!("{:.1} s", r.flood_secs));
    row("most in one second (budget 40)", &|r| r.most.to_string());
    row("lost / duplicated", &|r| format!("{} / {}", r.lost, r.duplicates));
    let fair = &rows["fair"];
    let slowest = pick(&fair.quiet_waits, 1.0);
    println!(
        "\nwith fair: true, the slowest quiet payout reached the partner {:.1} s after its publish (target ≤ {:.1} s); the budget \
         was {:.0} % busy (target ≥ {:.0} %); the noisy merchant kept {:.0} % while others waited (target ≥ {:.0} %)",
        slowest as f64 / 1e3,
        QUIET_WITHIN_MS as f64 / 1e3,
        100.0 * fair.busy,
        100.0 * BUSY_AT_LEAST,
        100.0 * fair.noisy_share,
        100.0 * NOISY_SHARE_AT_LEAST
    );
    std::fs::create_dir_all(&args.out)?;
    let chart = args.out.join("fair.svg");
    draw_fair_chart(&chart, &calls, flood_at)?;
    println!("chart: {}", chart.display());
    if !dead.is_empty() {
        println!("FAILED: {} payouts were dead-lettered", dead.len());
    }
    let exact = rows.values().all(|r| r.lost == 0 && r.duplicates == 0 && r.most <= BUDGET) && dead.is_empty();
    let met = fair.quiet_waits.len() == QUIET_MERCHANTS * QUIET_EACH
        && slowest <= QUIET_WITHIN_MS
        && fair.busy >= BUSY_AT_LEAST
        && fair.noisy_share >= NOISY_SHARE_AT_LEAST;
    if exact && !met {
        println!("FAILED: the fair lane missed a target");
    }
    let ok = exact && met;
    println!(
        "result: {}",
        if ok { "OK (every payout reached the partner once, no second over the budget)" } else { "FAILED" }
    );
    Ok(ok)
}

/// Payouts delivered per second, noisy and quiet, each lane, over the run.
fn draw_fair_chart(path: &std::path::Path, calls: &[Call], started: Millis) -> anyhow::Result<()> {
    let second = |at: Millis| (at - started).max(0) / 1_000;
    let mut per_second: BTreeMap<(&str, bool), BTreeMap<i64, f64>> = BTreeMap::new();
    for call in calls {
        let entry = per_second.entry((call.lane.as_str(), call.merchant == "noisy")).or_default();
        *entry.entry(second(call.at)).or_default() += 1.0;
    }
    let end = calls.iter().map(|c| second(c.at) as f64).fold(1.0, f64::max) + 1.0;
    let top = BUDGET as f64 * 1.2;
    let root = SVGBackend::new(path, (1100, 380)).into_drawing_area();
    let caption = "A budget of 40/s: a flood of 800 and three quiet merchants 4 s later, delivered per second";
    let mut chart = charts::seconds_chart(&root, caption, (end, top))?;
    chart.configure_mesh().x_desc("seconds since the flood was published").y_desc("payouts per second").draw()?;
    chart
        .draw_series(LineSeries::new([(0.0, BUDGET as f64), (end, BUDGET as f64)], BLACK.mix(0.5)))?
        .label(format!("the budget ({BUDGET}/s)"))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.mix(0.5)));
    for (lane, noisy, color, label) in [
        ("fcfs", true, RED.mix(0.5), "noisy, first come first served"),
        ("fcfs", false, RED.to_rgba(), "quiet, first come first served"),
        ("fair", true, BLUE.mix(0.5), "noisy, fair: true"),
        ("fair", false, BLUE.to_rgba(), "quiet, fair: true"),
    ] {
        let points: Vec<(f64, f64)> = per_second
            .get(&(lane, noisy))
            .map(|s| s.iter().map(|(&t, &n)| (t as f64 + 0.5, n)).collect())
            .unwrap_or_default();
        let style = if noisy { color.stroke_width(1) } else { color.stroke_width(3) };
        chart
            .draw_series(LineSeries::new(points, style))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], style));
    }
    charts::finish(chart, &root)
}
