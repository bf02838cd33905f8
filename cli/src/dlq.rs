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

use std::collections::{BTreeMap, HashSet};
use std::process::ExitCode;
use std::time::Duration;

use drip_core::attributes::{DeadLetterView, REPLAY_OF, REPLAY_PUBLISHED};
use drip_core::event::MessageRef;
use drip_core::outcome::DlqReason;
use drip_core::overflow::{TaskBody, TaskPayload};
use drip_core::time::{format_rfc3339, parse_rfc3339};
use drip_gcp::pubsub::Publishers;
use drip_gcp::pull::{Pulled, Subscription};
use drip_store::{AnyConnection, RedisStore, Store};
use serde::Serialize;

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

/// What became of one dead letter.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    /// The dead letter's own id on the dead-letter topic.
    dead_letter: String,
    /// The id of the message it held.
    message_id: Option<String>,
    rule: Option<String>,
    key: Option<String>,
    reason: Option<String>,
    action: Action,
    /// Why it was left, or the replay's id.
    detail: String,
    /// The dead letter's own `drip-detail`: why Drip dead-lettered it.
    why: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Action {
    Replayed,
    WouldReplay,
    Left,
    /// Replayed by this run and dead-lettered again: its cause is not fixed.
    DeadLetteredAgain,
    Failed,
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

/// How long a dead letter left for the end stays out of others' reach (Pub/Sub's most).
const HOLD_SECONDS: u32 = 600;

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
    let topic = publishers.topic_name(&args.topic);
    let (mut entries, mut left, mut seen) = (Vec::new(), Vec::new(), HashSet::new());
    // The `drip-replay-of` of every event this run published: one that comes back is not replayed again.
    let mut published = HashSet::new();
    let under_max = |entries: &Vec<Entry>| {
        args.max == 0
            || entries.iter().filter(|e| matches!(e.action, Action::Replayed | Action::WouldReplay)).count() < args.max
    };
    let mut idle_since = std::time::Instant::now();
    let mut progress = Progress::new();
    let work = async {
        while under_max(&entries) {
            let batch = subscription.pull(100).await?;
            if batch.is_empty() {
                if idle_since.elapsed() >= args.idle {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
            idle_since = std::time::Instant::now();
            let mut held = Vec::new();
            for message in batch {
                if !under_max(&entries) || !seen.insert(message.message_id.clone()) {
                    // Beyond --max, or ours already (a deadline passed while it was held).
                    held.push(message.ack_id);
                    continue;
                }
                let (mut entry, event) = decide(args, &message, store.as_ref(), &published).await;
                match event {
                    Some(_) if args.dry_run => {
                        (entry.action, entry.detail) = (Action::WouldReplay, format!("would publish to {topic}"));
                        held.push(message.ack_id);
                    }
                    Some((data, attributes)) => {
                        let of = attributes.get(REPLAY_OF).cloned().unwrap_or_default();
                        match publishers.publish(&topic, data, attributes).await {
                            Ok(id) => {
                                subscription.acknowledge(std::slice::from_ref(&message.ack_id)).await?;
                                published.insert(of);
                                (entry.action, entry.detail) = (Action::Replayed, format!("published as {id}"));
                            }
                            Err(error) => {
                                held.push(message.ack_id);
                                (entry.action, entry.detail) = (Action::Failed, error.to_string());
                            }
                        }
                    }
                    None => held.push(message.ack_id),
                }
                entries.push(entry);
            }
            // Out of the next pulls' way until the end, when they all go back at once.
            subscription.extend(&held, HOLD_SECONDS).await?;
            left.extend(held);
            progress.report(&entries);
        }
        anyhow::Ok(())
    };
    let (result, interrupted) = tokio::select! {
        result = work => (result, false),
        _ = tokio::signal::ctrl_c() => (Ok(()), true),
    };
    // Whatever happened, what was left goes back to the subscription now.
    subscription.release(&left).await?;
    result?;
    let ended = if interrupted {
        eprintln!(
            "drip dlq replay: interrupted; {} it held back on the subscription",
            drip_core::counted(left.len() as u64, "dead letter")
        );
        Ended::Interrupted
    } else if entries.iter().any(|e| e.action == Action::Failed) {
        Ended::Failed
    } else {
        Ended::Done
    };
    Ok((printed(args, &entries), ended))
}

/// A line on stderr every few seconds while a run lasts.
struct Progress {
    last: std::time::Instant,
}

impl Progress {
    fn new() -> Self {
        Self { last: std::time::Instant::now() }
    }

    fn report(&mut self, entries: &[Entry]) {
        if self.last.elapsed() < PROGRESS_EVERY {
            return;
        }
        self.last = std::time::Instant::now();
        let counts = Counts::of(entries);
        eprintln!(
            "drip dlq replay: {} seen, {} replayed, {} would replay, {} left, {} dead-lettered again, {} failed",
            entries.len(),
            counts.replayed,
            counts.would,
            counts.left,
            counts.again,
            counts.failed
        );
    }
}

#[derive(Debug)]
struct Counts {
    replayed: usize,
    would: usize,
    left: usize,
    again: usize,
    failed: usize,
}

impl Counts {
    fn of(entries: &[Entry]) -> Self {
        let count = |action| entries.iter().filter(|e| e.action == action).count();
        Self {
            replayed: count(Action::Replayed),
            would: count(Action::WouldReplay),
            left: count(Action::Left),
            again: count(Action::DeadLetteredAgain),
            failed: count(Action::Failed),
        }
    }
}

/// The event a dead letter holds, ready to publish, or why it is left.
async fn decide(
    args: &ReplayArgs,
    message: &Pulled,
    store: Option<&RedisStore<AnyConnection>>,
    published: &HashSet<String>,
) -> (Entry, Option<(Vec<u8>, BTreeMap<String, String>)>) {
    let view = DeadLetterView::of(&message.attributes, &message.data);
    let entry = Entry {
        dead_letter: message.message_id.clone(),
        message_id: view.message_id.clone(),
        rule: view.rule.clone(),
        key: view.key.clone(),
        reason: view.reason.clone(),
        action: Action::Left,
        detail: String::new(),
        why: view.detail.clone(),
    };
    if let Some(of) = view.replay_of.as_ref().filter(|of| published.contains(*of)) {
        let mut entry = entry;
        entry.action = Action::DeadLetteredAgain;
        entry.detail = format!(
            "this run replayed it ({of}) and it was dead-lettered again: its cause is not fixed, so it is not replayed again"
        );
        return (entry, None);
    }
    let left = |mut entry: Entry, why: String| {
        entry.detail = why;
        (entry, None)
    };
    if !args.reasons.is_empty() && !view.reason.as_ref().is_some_and(|r| args.reasons.contains(r)) {
        return left(entry, "another reason".into());
    }
    if args.rule.is_some() && view.rule != args.rule {
        return left(entry, "another rule".into());
    }
    if args.key.is_some() && view.key != args.key {
        return left(entry, "another key".into());
    }
    let unreadable = view.reason.as_deref().and_then(DlqReason::parse).filter(|r| r.is_unreadable());
    if let Some(reason) = unreadable
        && !args.reasons.iter().any(|r| r == reason.as_str())
    {
        return left(
            entry,
            format!(
                "Drip could not read it ({reason}): replayed as it is, it would be dead-lettered again; \
                 name it with --reason {reason} to replay it anyway"
            ),
        );
    }
    if view.attributes_dropped {
        return left(entry, "its attributes were dropped (too large to carry them): replay it by hand".into());
    }
    let (mut own, data) = match claim_checked(&view) {
        None => (view.attributes.clone(), view.data.clone()),
        Some((task, reference)) => match store {
            None => return left(entry, format!("its data is claim-checked ({reference}): give --redis")),
            Some(store) => match store.get_payload(&reference).await {
                Ok(Some(data)) => (task.attributes.clone(), data),
                Ok(None) => return left(entry, format!("its claim-checked data {reference} is gone")),
                Err(error) => return left(entry, format!("reading {reference}: {error}")),
            },
        },
    };
    own.retain(|name, _| !name.starts_with(drip_core::attributes::PREFIX));
    let of = match &view.message_id {
        Some(id) => MessageRef::new(id.clone(), view.subscription.clone()).identity(),
        None => format!("dlq:{}", message.message_id),
    };
    own.insert(REPLAY_OF.to_owned(), of);
    // The dead letter's publish time, the same on every replay of it.
    let published = message.publish_time.as_deref().and_then(|at| parse_rfc3339(at).ok()).unwrap_or_default();
    own.insert(REPLAY_PUBLISHED.to_owned(), format_rfc3339(published));
    (entry, Some((data, own)))
}

/// A dead letter of the dispatcher whose data could not be read holds the task's body, which
/// names the claim-checked payload.
fn claim_checked(view: &DeadLetterView) -> Option<(TaskBody, String)> {
    let task: TaskBody = serde_json::from_slice(&view.data).ok()?;
    match &task.payload {
        TaskPayload::ClaimCheck(reference) => {
            let reference = reference.clone();
            Some((task, reference))
        }
        _ => None,
    }
}

fn printed(args: &ReplayArgs, entries: &[Entry]) -> Printed {
    let mut table = String::new();
    for e in entries {
        let what = match e.action {
            Action::Replayed => "replayed",
            Action::WouldReplay => "would replay",
            Action::Left => "left",
            Action::DeadLetteredAgain => "AGAIN",
            Action::Failed => "FAILED",
        };
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
