//! `drip feedback`: report a downstream's answer to the limiter, as an overflow consumer that
//! called the downstream itself does (`POST /v1/feedback`): a 429 or 503 with `--retry-after`
//! pauses the key (or the budget), a 429, 408, 5xx or a timeout (`--status 0`) lowers an
//! adaptive limit. The operator's lever for "the partner says stop" before any consumer says so.
//! With `--cost`, it reports what one message's call really cost instead (docs/rules.md: "Costs
//! known only after the call"); with `--latency-ms`, how long calls took (docs/rules.md: "Latency
//! as the leading signal"); with `--header`, what the downstream's answer said of its limits, for a
//! rule that learns them (docs/rules.md: "Learning the partner's limits").

use std::process::ExitCode;

use anyhow::Context;
use reqwest::Method;

use crate::api::{Api, ApiArgs};
use crate::output::{Output, Printed};

/// Feedback goes through the limiter's API (or the admin service's): it is the limiter that
/// applies it, so this command takes no Redis flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    api: ApiArgs,
    #[arg(long)]
    rule: String,
    /// The key the answer was about.
    #[arg(long, required_unless_present = "budget")]
    key: Option<String>,
    /// A budget the rule draws from, instead of a key.
    #[arg(long, conflicts_with = "key")]
    budget: Option<String>,
    /// The downstream's HTTP status (0: it timed out).
    #[arg(long, required_unless_present_any = ["cost", "latency_ms", "header"])]
    status: Option<u16>,
    /// Seconds, as the downstream's `Retry-After` said (at least 1; to lift a pause, use `drip
    /// resume`).
    #[arg(long, allow_hyphen_values = true, value_parser = seconds_to_wait)]
    retry_after: Option<u64>,
    /// What the call of the message really cost, in the rule's units (instead of a status).
    #[arg(long, conflicts_with_all = ["status", "budget"], requires_all = ["message_id", "published"])]
    cost: Option<u64>,
    /// The message whose cost it was: its `drip-message-id` attribute.
    #[arg(long)]
    message_id: Option<String>,
    /// Its `drip-subscription` attribute.
    #[arg(long)]
    subscription: Option<String>,
    /// Its `drip-published` attribute (RFC 3339).
    #[arg(long)]
    published: Option<String>,
    /// How long a call to the downstream took (ms), for an adaptive limit that follows latency
    /// (instead of a status): one call, or with `--calls` a window's high percentile.
    #[arg(long, conflicts_with_all = ["status", "cost"])]
    latency_ms: Option<f64>,
    /// How many calls `--latency-ms` is the percentile of (the window is judged now).
    #[arg(long, requires = "latency_ms")]
    calls: Option<u64>,
    /// A header of the downstream's answer, `Name: value` (repeatable), for a rule with `learn:`:
    /// `RateLimit-Policy`, `RateLimit`, `X-RateLimit-Limit/-Remaining/-Reset`, `Retry-After`.
    #[arg(long, value_parser = header_line, requires = "key")]
    header: Vec<(String, String)>,
    /// `table` (lines) or `json` (the limiter's answer).
    #[arg(long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// `--retry-after`: a negative or zero wait is said to be one, not taken for another flag.
fn seconds_to_wait(text: &str) -> Result<u64, String> {
    match text.parse::<i64>() {
        Ok(seconds) if seconds >= 1 => Ok(seconds as u64),
        Ok(seconds) => Err(format!(
            "{seconds} is no wait: give the seconds the downstream said, at least 1 (to lift a pause, use drip resume)"
        )),
        Err(_) => Err(format!("'{text}' is not a whole number of seconds")),
    }
}

/// `--header 'RateLimit: "default";r=0;t=30'`.
fn header_line(text: &str) -> Result<(String, String), String> {
    match text.split_once(':') {
        Some((name, value)) if !name.trim().is_empty() && !name.contains(' ') => {
            Ok((name.trim().to_owned(), value.trim().to_owned()))
        }
        _ => Err(format!("'{text}' is not 'Name: value' (e.g. 'RateLimit: \"default\";r=0;t=30')")),
    }
}

pub fn run(args: Args) -> ExitCode {
    crate::output::run("feedback", args.output, report(&args))
}

async fn report(args: &Args) -> anyhow::Result<Printed> {
    let body = serde_json::json!({
        "rule": args.rule,
        "key": args.key,
        "budget": args.budget,
        "status": args.status,
        "retryAfter": args.retry_after,
        "cost": args.cost,
        "messageId": args.message_id,
        "subscription": args.subscription,
        "published": args.published,
        "latencyMs": args.latency_ms,
        "calls": args.calls,
        "headers": (!args.header.is_empty()).then(|| args.header.iter().cloned().collect::<std::collections::BTreeMap<_, _>>()),
    });
    let url = args.api.api.as_deref().context(
        "feedback goes through the limiter's API: give --api URL (or DRIP_API), e.g. the admin service's URL (docs/operations.md: \"Reaching production\")",
    )?;
    let answer: serde_json::Value =
        Api::connect(&args.api, url).await?.call(Method::POST, &["v1", "feedback"], &[], Some(body)).await?;
    let table = match &answer {
        answer if answer["latency"] == "recorded" => "latency recorded: judged with its window\n".to_owned(),
        answer if answer["latency"] == "judged" => match answer["verdict"].as_str() {
            Some(verdict) => format!(
                "latency judged {verdict}: adaptive level {} (was {})\n",
                answer["level"], answer["levelBefore"]
            ),
            None => "latency not judged: the target's adaptive limit does not follow latency\n".to_owned(),
        },
        answer if answer["outcome"].is_string() => format!(
            "cost {}: {} (booked {})\n",
            answer["actual"],
            answer["outcome"].as_str().unwrap_or("-"),
            answer["booked"].as_u64().map_or("-".to_owned(), |b| b.to_string())
        ),
        answer if answer["learned"].is_array() => {
            let mut lines = String::new();
            if let Some(until) = answer["pausedUntil"].as_str() {
                lines += &format!("paused until {until} (the partner's quota is spent until its reset)\n");
            }
            for limit in answer["learned"].as_array().into_iter().flatten() {
                lines += &format!(
                    "learned {} -> {} until {}\n",
                    limit["limit"].as_str().unwrap_or("-"),
                    limit["count"],
                    limit["until"].as_str().unwrap_or("-")
                );
            }
            for ignored in answer["ignored"].as_array().into_iter().flatten() {
                lines += &format!("left out: {}\n", ignored.as_str().unwrap_or("-"));
            }
            if lines.is_empty() {
                "nothing learned: the headers match what the rules already say\n".to_owned()
            } else {
                lines
            }
        }
        serde_json::Value::Null => "no change: the answer neither pauses nor lowers anything\n".to_owned(),
        answer => {
            let paused =
                answer["pausedUntil"].as_str().map_or("not paused".to_owned(), |u| format!("paused until {u}"));
            let capped = match (answer["askedUntil"].as_str(), answer["maxPause"].as_str()) {
                (Some(asked), Some(max)) => format!(" (capped by the rule's max_pause of {max}: asked until {asked})"),
                _ => String::new(),
            };
            let paused = paused + &capped;
            let level = answer["adaptiveLevel"].as_f64().map_or(String::new(), |l| format!(", adaptive level {l}"));
            format!("{}: {paused}{level}\n", answer["target"].as_str().unwrap_or("-"))
        }
    };
    Ok(Printed { table, json: answer })
}
