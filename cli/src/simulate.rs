//! `drip simulate`: events in file order, each with `now` = its publishTime, through the reference
//! model or through `reserve.lua` on Redis; one JSON decision per event on stdout.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use base64::Engine;
use drip_core::event::Event;
use drip_core::routing::{Decision, Plan, plan};
use drip_core::rules::RuleSet;
use drip_core::time::{Millis, format_rfc3339, parse_rfc3339};
use drip_store::{Batching, MemoryStore, RedisStore, SlotRequest, Store};
use serde::Deserialize;

use crate::decisions::{Outcome, Scheduled};
use crate::output::Output;
use crate::{plot, summary};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The rules file.
    #[arg(long)]
    rules: PathBuf,
    /// JSON lines: {"id", "publishTime", "attributes", "data" | "dataBase64"}.
    #[arg(long)]
    events: PathBuf,
    /// `memory` (the reference model) or `redis://HOST:PORT/DB` (reserve.lua on that Redis).
    #[arg(long, default_value = "memory")]
    store: String,
    /// Key namespace in Redis. Answers are kept per message id, so a rerun replays them.
    #[arg(long, default_value = "drip-simulate")]
    namespace: String,
    /// Write an SVG chart of cost per window against each limit.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// On Redis, reserve up to this many consecutive events of the same publishTime together, in
    /// shared script calls, as the limiter's group commit does (the decisions are the same: a batch
    /// is its events one after another).
    #[arg(long, default_value_t = 1)]
    batch: usize,
    #[command(flatten)]
    connection: crate::connect::RedisArgs,
    /// `json` (a JSON line per decision) or `table` (a line per decision).
    #[arg(long, value_enum, default_value_t = Output::Json)]
    output: Output,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct InputEvent {
    id: String,
    publish_time: String,
    #[serde(default)]
    attributes: BTreeMap<String, String>,
    data: Option<serde_json::Value>,
    data_base64: Option<String>,
}

pub fn run(args: Args) -> ExitCode {
    match simulate(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("drip simulate: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn simulate(args: &Args) -> anyhow::Result<()> {
    let rules = RuleSet::load(&args.rules).map_err(|errors| anyhow::anyhow!("{errors}"))?;
    let events = read_events(&args.events)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let outcomes = runtime.block_on(async {
        if args.store == "memory" {
            decide_all(&rules, &events, &MemoryStore::new(), 1).await
        } else if args.store.starts_with("redis://") || args.store.starts_with("rediss://") {
            let connection = args.connection.connect(&args.store).await?;
            let batching = Batching::new(args.batch, args.connection.redis_cluster);
            let store = RedisStore::new(connection, args.namespace.clone()).with_batching(batching);
            decide_all(&rules, &events, &store, args.batch).await
        } else {
            bail!("--store must be memory or redis://HOST:PORT/DB, not {}", args.store)
        }
    })?;
    let mut stdout = std::io::stdout().lock();
    for outcome in &outcomes {
        match args.output {
            Output::Json => serde_json::to_writer(&mut stdout, outcome)?,
            Output::Table => {
                let show = |v: Option<&str>| v.unwrap_or("-").to_owned();
                let at = outcome.scheduled_for.as_deref().or(outcome.reason);
                write!(
                    stdout,
                    "{:<12} {:<20} {:<28} {:<9} {}",
                    outcome.id,
                    show(outcome.rule.as_deref()),
                    show(outcome.key.as_deref()),
                    outcome.decision,
                    show(at)
                )?;
            }
        }
        writeln!(stdout)?;
    }
    eprint!("{}", summary::render(&rules, &outcomes));
    if let Some(path) = &args.plot {
        plot::draw(path, &rules, &outcomes).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("chart written to {}", path.display());
    }
    Ok(())
}

fn read_events(path: &PathBuf) -> anyhow::Result<Vec<(Event, Millis)>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut events = Vec::new();
    for (index, line) in BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{}:{}", path.display(), index + 1);
        let input: InputEvent = serde_json::from_str(&line).with_context(at)?;
        let now = parse_rfc3339(&input.publish_time).map_err(anyhow::Error::msg).with_context(at)?;
        let data = match (input.data, input.data_base64) {
            (Some(json), None) => serde_json::to_vec(&json)?,
            (None, Some(encoded)) => base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .context("dataBase64 is not base64")
                .with_context(at)?,
            (None, None) => Vec::new(),
            (Some(_), Some(_)) => bail!("{}: give data or dataBase64, not both", at()),
        };
        events.push((Event::new(input.id, input.attributes, data), now));
    }
    Ok(events)
}

pub async fn decide_all(
    rules: &RuleSet,
    events: &[(Event, Millis)],
    store: &dyn Store,
    batch: usize,
) -> anyhow::Result<Vec<Outcome>> {
    let mut outcomes = Vec::with_capacity(events.len());
    let mut rest = events;
    while let Some((_, now)) = rest.first() {
        // Consecutive events of one time, reserved together: in order, so a batch's calls carry
        // them as they come.
        let together = rest.iter().take(batch.max(1)).take_while(|(_, at)| at == now).count();
        let (group, after) = rest.split_at(together);
        let decided =
            futures_util::future::join_all(group.iter().map(|(event, now)| decide(rules, event, *now, store)));
        for outcome in decided.await {
            outcomes.push(outcome?);
        }
        rest = after;
    }
    Ok(outcomes)
}

async fn decide(rules: &RuleSet, event: &Event, now: Millis, store: &dyn Store) -> anyhow::Result<Outcome> {
    let outcome = match plan(rules, event) {
        Plan::DeadLetter { rule, key, reason, .. } => Outcome {
            id: event.id.clone(),
            rule: rule.map(|r| r.name.clone()),
            key,
            decision: "dlq",
            scheduled_for: None,
            reason: Some(reason.as_str()),
            shadow: false,
            scheduled: None,
        },
        Plan::Reserve { rule, key, cost, .. } => {
            let request = SlotRequest::for_rule(rule, &key, &event.id, cost).at(now).published(Some(now));
            let reserved = store.reserve(&request).await.with_context(|| format!("reserving {}", event.id))?;
            let reservation = reserved.reservation;
            let decision = Decision::of(&reservation, 0);
            let reserved_now = !reservation.replayed() && !matches!(decision, Decision::DeadLetter(_));
            Outcome {
                id: event.id.clone(),
                rule: Some(rule.name.clone()),
                key: Some(key),
                decision: decision.as_str(),
                scheduled_for: match decision {
                    Decision::DeadLetter(_) => None,
                    _ => Some(format_rfc3339(reservation.slot)),
                },
                reason: match decision {
                    Decision::DeadLetter(reason) => Some(reason.as_str()),
                    _ => None,
                },
                shadow: rule.mode == drip_core::rules::Mode::Shadow,
                scheduled: reserved_now.then_some(Scheduled { slot: reservation.slot, cost }),
            }
        }
    };
    Ok(outcome)
}
