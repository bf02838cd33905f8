//! The headers scenario (`./run demo --scenario headers`): a partner that serves 10 calls a second,
//! says so on every answer (`RateLimit-Policy: "default";q=10;w=1`, `RateLimit: "default";r=..;t=..`)
//! and answers 429 with `Retry-After: 1` past it, behind two rules of 20 a second side by side in
//! one run: `payouts-plain` reads only the 429s, `payouts-learning` has `learn: headers`. Drip calls
//! the partner itself (each rule's forward and overflow URL is its lane of the partner).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::IntoResponse;
use drip_core::time::{Millis, wall_clock_millis};
use plotters::prelude::*;

use crate::partner::{pull_dead_letters, serve_partner, set_up_lanes, stream_lanes};
use crate::*;

/// Calls per epoch-aligned second the partner serves, on each lane.
pub(crate) const CAPACITY: usize = 10;
/// The stream: this many events a second per lane, for this long.
const RATE: usize = 16;
const STREAM_SECS: i64 = 30;
/// Throughput and refusals are compared once settled: from this many seconds after the stream
/// starts to its end.
const SETTLED_FROM_SECS: i64 = 5;
const LANES: [&str; 2] = ["plain", "learning"];

/// One call the partner answered: its lane, the payout, when, and whether it was served.
#[derive(Clone)]
struct Call {
    lane: String,
    payout: String,
    at: Millis,
    served: bool,
}

type Calls = Arc<Mutex<Vec<Call>>>;

/// Serves the partner on `address`: `/partner/<lane>`, each lane its own quota.
async fn serve(address: &str) -> anyhow::Result<Calls> {
    let calls: Calls = Arc::default();
    let log = calls.clone();
    serve_partner(address, move |lane, attributes| {
        let payout = attributes.get("payout").cloned().unwrap_or_default();
        let at = wall_clock_millis();
        let second = at.div_euclid(1_000);
        let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
        let served_now = log.iter().filter(|c| c.lane == lane && c.served && c.at.div_euclid(1_000) == second).count();
        let served = served_now < CAPACITY;
        log.push(Call { lane, payout, at, served });
        let left = CAPACITY - served_now.min(CAPACITY) - usize::from(served);
        let reset = ((second + 1) * 1_000 - at + 999) / 1_000;
        let said = [
            ("ratelimit-policy", format!("\"default\";q={CAPACITY};w=1")),
            ("ratelimit", format!("\"default\";r={left};t={reset}")),
        ];
        if served {
            (axum::http::StatusCode::NO_CONTENT, said).into_response()
        } else {
            (axum::http::StatusCode::TOO_MANY_REQUESTS, said, [("retry-after", "1")]).into_response()
        }
    })
    .await?;
    Ok(calls)
}

/// What one lane's partner saw.
struct Figures {
    refused: usize,
    refused_settled: usize,
    /// Calls served per second once settled.
    settled: f64,
    /// The most calls served in one second once settled, and in any second.
    most_settled: usize,
    lost: usize,
    duplicates: usize,
}

fn figures(calls: &[Call], lane: &str, published: &HashSet<String>, (from, to): (Millis, Millis)) -> Figures {
    let of_lane: Vec<&Call> = calls.iter().filter(|c| c.lane == lane).collect();
    let served: Vec<&String> = of_lane.iter().filter(|c| c.served).map(|c| &c.payout).collect();
    let unique: HashSet<&String> = served.iter().copied().collect();
    let settled = |c: &&&Call| (from..to).contains(&c.at);
    let mut per_second: HashMap<Millis, usize> = HashMap::new();
    for call in of_lane.iter().filter(|c| c.served).filter(settled) {
        *per_second.entry(call.at.div_euclid(1_000)).or_default() += 1;
    }
    Figures {
        refused: of_lane.iter().filter(|c| !c.served).count(),
        refused_settled: of_lane.iter().filter(|c| !c.served).filter(settled).count(),
        settled: of_lane.iter().filter(|c| c.served).filter(settled).count() as f64 / ((to - from) as f64 / 1e3),
        most_settled: per_second.values().copied().max().unwrap_or(0),
        lost: published.iter().filter(|id| !unique.contains(id)).count(),
        duplicates: served.len() - unique.len(),
    }
}

/// Runs the scenario; prints each lane's 429s and settled throughput side by side and draws them.
/// True when every event reached the partner once and learning met its targets.
pub(crate) async fn headers_scenario(args: &Args, address: &str) -> anyhow::Result<bool> {
    let (rules, pubsub) = set_up_lanes(args).await?;
    let calls = serve(address).await?;
    println!(
        "a partner serving {CAPACITY} calls/s per lane that says so on every answer (RateLimit-Policy, RateLimit) \
         and answers 429 past it; two rules of 20/s, without and with learn: headers; {RATE} events/s to each for {STREAM_SECS} s"
    );
    let (started, published) = stream_lanes(&pubsub, &LANES, (RATE, STREAM_SECS)).await?;
    let deadline = started + STREAM_SECS * 1_000 + args.timeout_secs as Millis * 1_000;
    let total: usize = published.values().map(HashSet::len).sum();
    let mut dead = Vec::new();
    loop {
        let delivered: usize = {
            let calls = calls.lock().unwrap_or_else(|e| e.into_inner());
            calls.iter().filter(|c| c.served).map(|c| (&c.lane, &c.payout)).collect::<HashSet<_>>().len()
        };
        pull_dead_letters(&pubsub, &rules, &mut dead).await?;
        println!(
            "  +{:>3} s  delivered {delivered} of {total}, dead-lettered {}",
            (wall_clock_millis() - started) / 1_000,
            dead.len()
        );
        if delivered + dead.len() >= total || wall_clock_millis() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let calls = calls.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let settled = (started + SETTLED_FROM_SECS * 1_000, started + STREAM_SECS * 1_000);
    let rows: HashMap<&str, Figures> =
        LANES.iter().map(|lane| (*lane, figures(&calls, lane, &published[lane], settled))).collect();
    println!("\n{:<34}{:>14}{:>16}", "", "429s only", "learn: headers");
    let row = |name: &str, f: &dyn Fn(&Figures) -> String| {
        println!("{name:<34}{:>14}{:>16}", f(&rows["plain"]), f(&rows["learning"]));
    };
    row("429s received", &|r| r.refused.to_string());
    row("  once settled", &|r| r.refused_settled.to_string());
    row("delivered/s, settled", &|r| format!("{:.1}", r.settled));
    row("  of the capacity", &|r| format!("{:.0} %", 100.0 * r.settled / CAPACITY as f64));
    row("most in one second, settled", &|r| r.most_settled.to_string());
    row("lost / duplicated", &|r| format!("{} / {}", r.lost, r.duplicates));
    let (plain, learning) = (&rows["plain"], &rows["learning"]);
    let fewer = if plain.refused == 0 {
        0.0
    } else {
        100.0 * (plain.refused as f64 - learning.refused as f64) / plain.refused as f64
    };
    let share = 100.0 * learning.settled / CAPACITY as f64;
    println!(
        "\n429s: {fewer:.0} % fewer with learn: headers (target ≥ 95 %); settled throughput with it: {share:.0} % of the \
         capacity (target ≥ 95 %); the most in one second once learned: {} (the partner's limit: {CAPACITY})",
        learning.most_settled
    );
    std::fs::create_dir_all(&args.out)?;
    let chart = args.out.join("headers.svg");
    draw_headers_chart(&chart, &calls, started)?;
    println!("chart: {}", chart.display());
    let delivered_once = rows.values().all(|r| r.lost == 0 && r.duplicates == 0) && dead.is_empty();
    if !dead.is_empty() {
        println!("FAILED: {} events were dead-lettered", dead.len());
    }
    let ok = delivered_once && learning.most_settled <= CAPACITY;
    println!("result: {}", if ok { "OK (every event reached the partner once)" } else { "FAILED" });
    Ok(ok)
}

/// Calls served and refused per second, each lane, over the run.
fn draw_headers_chart(path: &std::path::Path, calls: &[Call], started: Millis) -> anyhow::Result<()> {
    let second = |at: Millis| ((at - started).max(0) / 1_000) as f64;
    let mut per_second: BTreeMap<(&str, bool), BTreeMap<i64, f64>> = BTreeMap::new();
    for call in calls {
        let entry = per_second.entry((call.lane.as_str(), call.served)).or_default();
        *entry.entry(second(call.at) as i64).or_default() += 1.0;
    }
    let end = calls.iter().map(|c| second(c.at)).fold(1.0, f64::max) + 1.0;
    let top = per_second.values().flat_map(|s| s.values()).copied().fold(CAPACITY as f64, f64::max) * 1.15;
    let root = SVGBackend::new(path, (1100, 380)).into_drawing_area();
    let caption =
        "A partner of 10 calls/s behind a rule of 20/s: served and refused per second, without and with learn: headers";
    let mut chart = charts::seconds_chart(&root, caption, (end, top))?;
    chart.configure_mesh().x_desc("seconds since the stream started").y_desc("calls per second").draw()?;
    chart
        .draw_series(LineSeries::new([(0.0, CAPACITY as f64), (end, CAPACITY as f64)], BLACK.mix(0.5)))?
        .label(format!("the partner's capacity ({CAPACITY}/s)"))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.mix(0.5)));
    for (lane, served, color, label) in [
        ("plain", true, RED.to_rgba(), "served, 429s only"),
        ("plain", false, RED.mix(0.4), "refused (429), 429s only"),
        ("learning", true, BLUE.to_rgba(), "served, learn: headers"),
        ("learning", false, BLUE.mix(0.4), "refused (429), learn: headers"),
    ] {
        let points: Vec<(f64, f64)> = per_second
            .get(&(lane, served))
            .map(|s| s.iter().map(|(&t, &n)| (t as f64 + 0.5, n)).collect())
            .unwrap_or_default();
        let style = if served { color.stroke_width(2) } else { color.stroke_width(1) };
        chart
            .draw_series(LineSeries::new(points, style))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], style));
    }
    charts::finish(chart, &root)
}
