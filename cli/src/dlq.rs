//! `drip dlq replay`: publish dead letters' events again, as they came. It reads a dead-letter
//! topic's subscription, keeps the dead letters a filter picks (`--reason`, `--rule`, `--key`),
//! gives back each one's event (Drip's `drip-*` attributes stripped, a `drip-wrapped: json` body
//! unwrapped, a claim-checked payload read from Redis) and publishes it to `--topic`, acking the
//! dead letter only once the publish is confirmed. Every dead letter it leaves (filtered out, or
//! one it cannot give back) is nacked at the end and stays on the subscription.
//!
//! Idempotent by message: each replay carries `drip-replay-of` (the identity of the message the
//! dead letter held) and `drip-replay-published` (its dead letter's publish time), under which the
//! limiter files it, so a dead letter replayed twice (a run that died between publish and ack, or
//! a second run over a copy) is acted on once while the limiter remembers the answer.
//!
//! Never a loop: a dead letter whose event this run replayed (its `drip-replay-of` is one this run
//! published) has come back because its cause is not fixed; it is left and reported, not
//! replayed again. A run stops after `--max` replays (1,000 unless told), prints its progress on
//! stderr, and on Ctrl-C gives back what it held and prints what it did.

use std::process::ExitCode;
use std::time::Duration;

use drip_gcp::pubsub::Publishers;
use drip_gcp::pull::Subscription;
use drip_service::dead_letters::{self, Action, Counts, Entry, ReplayPlan};
use drip_store::{RedisStore, Store};

use crate::connect::RedisArgs;
use crate::output::{Output, Printed};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: DlqCommand,
}

#[derive(Debug, clap::Subcommand)]
enum DlqCommand {
    /// Publish the events of dead letters again (to the topic the limiter reads, usually).
    Replay(ReplayArgs),
}

#[derive(Debug, clap::Args)]
struct ReplayArgs {
    /// The dead-letter topic's subscription: a name, or `projects/P/subscriptions/S`.
    #[arg(long)]
    subscription: String,
    /// Where each event goes again: a name, or `projects/P/topics/T`.
    #[arg(long)]
    topic: String,
    #[arg(long, env = "GOOGLE_CLOUD_PROJECT")]
    project: String,
    /// Only dead letters with this `drip-reason` (repeat for several), e.g. `max_delay_exceeded`.
    #[arg(long = "reason")]
    reasons: Vec<String>,
    /// Only dead letters of this rule (`drip-rule`).
    #[arg(long)]
    rule: Option<String>,
    /// Only dead letters of this key (`drip-key`).
    #[arg(long)]
    key: Option<String>,
    /// Stop after this many replays (0: no limit; a replay whose cause is not fixed is never
    /// replayed twice by one run either way).
    #[arg(long, default_value_t = 1000)]
    max: usize,
    /// Stop once no dead letter has come for this long.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    idle: Duration,
    /// Say what would be replayed: publish nothing, ack nothing.
    #[arg(long)]
    dry_run: bool,
    /// The Redis that holds claim-checked payloads (a dead letter of an event too large for a
    /// task holds a reference to it); without it such dead letters are left.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    redis: Option<String>,
    #[command(flatten)]
    connection: RedisArgs,
    /// `table` (a line each) or `json` (one document).
    #[arg(long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

pub fn run(args: Args) -> ExitCode {
    let DlqCommand::Replay(args) = args.command;
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(replay(&args)));
    match result {
        Ok((printed, ended)) => {
            print!("{}", printed.render(args.output));
            match ended {
                Ended::Done => ExitCode::SUCCESS,
                Ended::Failed => ExitCode::FAILURE,
                Ended::Interrupted => ExitCode::from(130),
            }
        }
        Err(e) => {
            eprintln!("drip dlq replay: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn full_name(project: &str, kind: &str, name: &str) -> String {
    if name.starts_with("projects/") { name.to_owned() } else { format!("projects/{project}/{kind}/{name}") }
}

/// How a run ended, beside what it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Done,
    /// A publish failed: those dead letters stay on the subscription.
    Failed,
    /// Ctrl-C: what it held went back, and what it did is printed.
    Interrupted,
}

/// How often a run says how far it got (on stderr).
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Replays what the filters pick; returns what it did and how the run ended.
async fn replay(args: &ReplayArgs) -> anyhow::Result<(Printed, Ended)> {
    let emulator = std::env::var("PUBSUB_EMULATOR_HOST").ok().filter(|h| !h.is_empty());
    let subscription =
        Subscription::new(&full_name(&args.project, "subscriptions", &args.subscription), emulator.as_deref())?;
    let publishers = Publishers::connect(&args.project, emulator.as_deref(), Duration::from_secs(30)).await?;
    let store = match &args.redis {
        Some(url) => Some(RedisStore::new(args.connection.connect(url).await?, "drip".to_owned())),
        None => None,
    };
    let plan = ReplayPlan {
        subscription: args.subscription.clone(),
        topic: publishers.topic_name(&args.topic),
        reasons: args.reasons.clone(),
        rule: args.rule.clone(),
        key: args.key.clone(),
        max: args.max,
        idle: args.idle,
        dry_run: args.dry_run,
    };
    let mut last = std::time::Instant::now();
    let progress = |entries: &[Entry]| {
        if last.elapsed() >= PROGRESS_EVERY {
            last = std::time::Instant::now();
            let c = Counts::of(entries);
            eprintln!(
                "drip dlq replay: {} seen, {} replayed, {} would replay, {} left, {} dead-lettered again, {} failed",
                entries.len(),
                c.replayed,
                c.would,
                c.left,
                c.again,
                c.failed
            );
        }
    };
    let stop = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let store = store.as_ref().map(|s| s as &dyn Store);
    let done = dead_letters::replay(&plan, (&subscription, &publishers), store, stop, progress).await?;
    let ended = if done.interrupted {
        let held = done.entries.iter().filter(|e| e.action != Action::Replayed).count();
        eprintln!(
            "drip dlq replay: interrupted; {} it held back on the subscription",
            drip_core::counted(held as u64, "dead letter")
        );
        Ended::Interrupted
    } else if done.entries.iter().any(|e| e.action == Action::Failed) {
        Ended::Failed
    } else {
        Ended::Done
    };
    Ok((printed(args, &done.entries), ended))
}

fn printed(args: &ReplayArgs, entries: &[Entry]) -> Printed {
    let mut table = String::new();
    for e in entries {
        let what = e.action.label();
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        let why = e.why.as_deref().map(|why| format!(" [{why}]")).unwrap_or_default();
        table += &format!(
            "{what:<12} {} (message {}, rule {}, key {}, {}{why}): {}\n",
            e.dead_letter,
            show(&e.message_id),
            show(&e.rule),
            show(&e.key),
            show(&e.reason),
            e.detail
        );
    }
    // Counted once, the same in both outputs: everything not replayed stays on the subscription.
    let Counts { replayed, would, left, again, failed } = Counts::of(entries);
    let still_there = would + left + again + failed;
    table += &if args.dry_run {
        format!(
            "dry run: {would} would be replayed to {}; all {still_there} stay on {}\n",
            args.topic, args.subscription
        )
    } else {
        format!(
            "{replayed} replayed to {}; {still_there} stay on {} ({left} left by the filters or unreadable, {again} dead-lettered again after this run replayed them, {failed} failed)\n",
            args.topic, args.subscription
        )
    };
    if args.max != 0 && replayed + would >= args.max {
        table += &format!("stopped at --max {}: run again for the rest\n", args.max);
    }
    let json = serde_json::json!({
        "dryRun": args.dry_run,
        "replayed": replayed,
        "wouldReplay": would,
        "left": left,
        "deadLetteredAgain": again,
        "failed": failed,
        "stayOnSubscription": still_there,
        "deadLetters": entries,
    });
    Printed { table, json }
}
