//! Replaying dead letters: pull a dead-letter topic's subscription, keep what a filter picks
//! (reasons, a rule, a key), give back each one's event (Drip's `drip-*` attributes stripped, a
//! claim-checked payload read from the store) and publish it to a topic, acking the dead letter
//! only once the publish is confirmed; every dead letter left goes back to the subscription at the
//! end. `drip dlq replay` and the console's dead-letters page both replay through here.
//!
//! Idempotent by message: each replay carries `drip-replay-of` (the identity of the message the
//! dead letter held) and `drip-replay-published` (its dead letter's publish time), under which the
//! limiter files it, so a dead letter replayed twice is acted on once while the limiter remembers
//! the answer. Never a loop: a dead letter whose event this run replayed has come back because its
//! cause is not fixed; it is left and reported.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use drip_core::attributes::{DeadLetterView, REPLAY_OF, REPLAY_PUBLISHED};
use drip_core::event::MessageRef;
use drip_core::outcome::DlqReason;
use drip_core::overflow::{TaskBody, TaskPayload};
use drip_core::time::{format_rfc3339, parse_rfc3339};
use drip_gcp::Publish;
use drip_gcp::pull::{Pulled, Subscription};
use drip_store::Store;
use serde::Serialize;

/// What to replay, and where to.
#[derive(Debug, Clone)]
pub struct ReplayPlan {
    /// The dead-letter topic's subscription (its full name).
    pub subscription: String,
    /// Where each event goes again: `projects/P/topics/T`.
    pub topic: String,
    /// Only dead letters with one of these `drip-reason`s (none: any).
    pub reasons: Vec<String>,
    pub rule: Option<String>,
    pub key: Option<String>,
    /// Stop after this many replays (0: no limit).
    pub max: usize,
    /// Stop once no dead letter has come for this long.
    pub idle: Duration,
    /// Publish nothing, ack nothing: say what would be replayed.
    pub dry_run: bool,
}

/// What became of one dead letter.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// The dead letter's own id on the dead-letter topic.
    pub dead_letter: String,
    /// The id of the message it held.
    pub message_id: Option<String>,
    pub rule: Option<String>,
    pub key: Option<String>,
    pub reason: Option<String>,
    pub action: Action,
    /// Why it was left, or the replay's id.
    pub detail: String,
    /// The dead letter's own `drip-detail`: why Drip dead-lettered it.
    pub why: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Replayed,
    WouldReplay,
    Left,
    /// Replayed by this run and dead-lettered again: its cause is not fixed.
    DeadLetteredAgain,
    Failed,
}

impl Action {
    /// As a person reads it.
    pub fn label(self) -> &'static str {
        match self {
            Action::Replayed => "replayed",
            Action::WouldReplay => "would replay",
            Action::Left => "left",
            Action::DeadLetteredAgain => "AGAIN",
            Action::Failed => "FAILED",
        }
    }
}

/// How long a dead letter left for the end stays out of others' reach (Pub/Sub's most).
const HOLD_SECONDS: u32 = 600;

/// What a run did to each dead letter it met, and whether it was cut short.
#[derive(Debug)]
pub struct Replayed {
    pub entries: Vec<Entry>,
    pub interrupted: bool,
}

/// Replays what `plan` picks from `subscription` to `plan.topic`, until `stop` (Ctrl-C) or the
/// plan's end; `progress` sees the entries after each pull.
pub async fn replay(
    plan: &ReplayPlan,
    (subscription, publishers): (&Subscription, &dyn Publish),
    store: Option<&dyn Store>,
    stop: impl Future<Output = ()>,
    mut progress: impl FnMut(&[Entry]),
) -> anyhow::Result<Replayed> {
    let args = plan;
    let topic = &args.topic;
    let (mut entries, mut left, mut seen) = (Vec::new(), Vec::new(), HashSet::new());
    // The `drip-replay-of` of every event this run published: one that comes back is not replayed again.
    let mut published = HashSet::new();
    let under_max = |entries: &Vec<Entry>| {
        args.max == 0
            || entries.iter().filter(|e| matches!(e.action, Action::Replayed | Action::WouldReplay)).count() < args.max
    };
    let mut idle_since = std::time::Instant::now();
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
                let (mut entry, event) = decide(args, &message, store, &published).await;
                match event {
                    Some(_) if args.dry_run => {
                        (entry.action, entry.detail) = (Action::WouldReplay, format!("would publish to {topic}"));
                        held.push(message.ack_id);
                    }
                    Some((data, attributes)) => {
                        let of = attributes.get(REPLAY_OF).cloned().unwrap_or_default();
                        match publishers.publish(topic, data, attributes).await {
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
            progress(&entries);
        }
        anyhow::Ok(())
    };
    let (result, interrupted) = tokio::select! {
        result = work => (result, false),
        () = stop => (Ok(()), true),
    };
    // Whatever happened, what was left goes back to the subscription now.
    subscription.release(&left).await?;
    result?;
    Ok(Replayed { entries, interrupted })
}

/// How many dead letters each action took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub replayed: usize,
    pub would: usize,
    pub left: usize,
    pub again: usize,
    pub failed: usize,
}

impl Counts {
    pub fn of(entries: &[Entry]) -> Self {
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
    args: &ReplayPlan,
    message: &Pulled,
    store: Option<&dyn Store>,
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
                 name it with --reason {reason} (the reason filter) to replay it anyway"
            ),
        );
    }
    if view.attributes_dropped {
        return left(entry, "its attributes were dropped (too large to carry them): replay it by hand".into());
    }
    let (mut own, data) = match claim_checked(&view) {
        None => (view.attributes.clone(), view.data.clone()),
        Some((task, reference)) => match store {
            None => {
                return left(
                    entry,
                    format!("its data is claim-checked ({reference}): give --redis (the store that holds it)"),
                );
            }
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
