//! `drip-demo` (what `./run demo` runs): publishes a burst of payouts onto the local stack `./run demo` started, watches
//! them drain live, then prints a summary, writes a chart, and exits 0 only if nothing was lost
//! and no window got more than its limit.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use drip_core::rules::{Forward, Rule, RuleSet, TopicName};
use drip_core::time::Millis;
use pubsub_emulator_client::EmulatorClient;

mod charts;
mod fair;
mod headers;
mod partner;
mod priority;
mod publish;
mod report;
mod throttle;
mod watch;

pub(crate) use charts::*;
pub(crate) use partner::*;
pub(crate) use priority::*;
pub(crate) use publish::*;
pub(crate) use report::*;
pub(crate) use throttle::*;
pub(crate) use watch::*;

#[derive(Debug, clap::Parser)]
#[command(
    name = "drip-demo",
    version,
    about = "A burst of payouts through the local stack `./run demo` starts, drained live at the limit"
)]
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
    /// The latency scenario: stream events to the rules `payouts-aimd` and `payouts-latency` side
    /// by side, and consume what they forward into a partner with a hidden capacity.
    #[arg(long, conflicts_with = "throttle")]
    latency: bool,
    /// The priority scenario: one merchant's bulk burst and a trickle of its live payouts through
    /// the rules `payouts-fifo` and `payouts-classes` side by side.
    #[arg(long, conflicts_with_all = ["throttle", "latency"])]
    priority: bool,
    /// The headers scenario: serve a partner of 10 calls a second that says so in its RateLimit
    /// headers at this address (`/partner/plain`, `/partner/learning`), behind the rules
    /// `payouts-plain` and `payouts-learning` side by side.
    #[arg(long, conflicts_with_all = ["throttle", "latency", "priority"])]
    headers: Option<String>,
    /// The fair scenario: serve a partner at this address (`/partner/fcfs`, `/partner/fair`) behind
    /// the rules `payouts-fcfs` and `payouts-fair`, each with its budget of 40/s, first come first
    /// served beside `fair: true`: a flood from one merchant, three quiet ones 4 s later.
    #[arg(long, conflicts_with_all = ["throttle", "latency", "priority", "headers"])]
    fair: Option<String>,
    /// Create the rule's topics and the source topic's push subscription, publish nothing, and
    /// exit (`./run up`: a stack to try the CLI on).
    #[arg(long, conflicts_with_all = ["throttle", "latency", "priority"])]
    set_up_only: bool,
}

pub(crate) struct Delivery {
    pub(crate) merchant: String,
    pub(crate) route: &'static str,
    pub(crate) scheduled_for: Millis,
    pub(crate) delivered_at: Millis,
}

fn main() -> ExitCode {
    let args = <Args as clap::Parser>::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("drip-demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(demo(&args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("drip-demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The topics of the demo's rule, each with a pull subscription of the same name.
pub(crate) struct Topics {
    pub(crate) forward: TopicName,
    pub(crate) overflow: TopicName,
    pub(crate) dlq: TopicName,
}

/// The burst as published: each message's merchant and publish time, by message id.
pub(crate) struct Burst {
    pub(crate) merchants: Vec<String>,
    pub(crate) merchant_of: HashMap<String, String>,
    pub(crate) published_at: HashMap<String, Millis>,
    pub(crate) started: Millis,
}

/// What came out at the topics (or the throttling target).
#[derive(Default)]
pub(crate) struct Outcome {
    /// The feedback scenario: the target's answers, and the first merchant's adaptive level and
    /// pause as the limiter's entity endpoint showed them over time.
    pub(crate) feedback: Feedback,
    pub(crate) deliveries: HashMap<String, Delivery>,
    /// Messages seen again at the forward or overflow topic (same message id: one source
    /// subscription, so the id is the message's identity here).
    pub(crate) duplicates: usize,
    /// Dead-lettered message ids, with their reasons.
    pub(crate) dead: HashMap<String, String>,
}

pub(crate) async fn demo(args: &Args) -> anyhow::Result<bool> {
    if args.latency {
        return latency_scenario(args).await;
    }
    if args.priority {
        return priority_scenario(args).await;
    }
    if let Some(address) = &args.headers {
        return headers::headers_scenario(args, address).await;
    }
    if let Some(address) = &args.fair {
        return fair::fair_scenario(args, address).await;
    }
    let rules = RuleSet::load(&args.rules).map_err(|errors| anyhow::anyhow!("{errors}"))?;
    let rule =
        rules.rule(&args.rule).with_context(|| format!("no rule '{}' in {}", args.rule, args.rules.display()))?;
    let pubsub = EmulatorClient::new(&args.pubsub_emulator, &args.project);
    let topics = set_up(args, rule, &pubsub).await?;
    if args.set_up_only {
        return Ok(true);
    }
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
pub(crate) async fn set_up(args: &Args, rule: &Rule, pubsub: &EmulatorClient) -> anyhow::Result<Topics> {
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

pub(crate) const SOURCE: &str = "payouts-source";

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

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

    /// `./run demo --rules FILE` works with every shipped example that has a payout rule: the
    /// demo's payouts match it, and its key and cost render from them.
    #[test]
    fn the_demo_s_payouts_fit_every_shipped_payout_rule() {
        let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");
        let (data, attributes) = crate::publish::payout(7, "m001");
        let event = drip_core::event::Event { id: "e7".into(), subscription: None, attributes, data };
        let mut fitted = 0;
        for entry in std::fs::read_dir(examples).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            let rules = RuleSet::load(&path).unwrap();
            let Some(rule) = rules.find(&event.attributes) else { continue };
            let key = rule.key.render(&event);
            assert!(key.as_ref().is_ok_and(|k| k.contains("m001")), "{}: {key:?}", path.display());
            fitted += 1;
        }
        assert!(fitted >= 4, "the demo's, the feedback demo's, payouts.yaml and the reference example: {fitted}");
    }

    /// A rules file whose key the demo's events do not carry dead-letters every event: that is a
    /// demo that drained nothing, not a success, though nothing was lost.
    #[test]
    fn a_demo_whose_events_were_dead_lettered_fails() {
        let out = std::env::temp_dir().join(format!("drip-demo-test-{}", std::process::id()));
        let out = out.to_str().unwrap();
        let command = Args::parse_from(["drip-demo", "--pubsub-emulator", "-", "--limiter", "-", "--rules", "-"]);
        let args = Args { events: 2, out: out.into(), ..command };
        let rules =
            RuleSet::load(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/payouts.yaml").as_ref()).unwrap();
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
        assert!(
            text.contains("FAILED: events were dead-lettered instead of delivered (missing_key_field × 2)"),
            "{text}"
        );
        assert!(
            text.contains("keys events by 'tenant_{data.merchant_id}:payouts'"),
            "it says what the rule reads: {text}"
        );
        std::fs::remove_dir_all(out).ok();
    }
}
