//! `drip inspect`: what Redis holds for one entity, for an operator asking "why is this merchant
//! waiting, and until when?".

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use drip_core::rules::RuleSet;
use drip_store::RedisStore;
use drip_store::inspect::EntityReport;

use crate::connect::RedisArgs;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// `redis://HOST:PORT/DB` (or `rediss://` with TLS).
    #[arg(long)]
    redis: String,
    /// The rules file the limiter runs with.
    #[arg(long)]
    rules: PathBuf,
    /// The limiter's DRIP_REDIS_NAMESPACE.
    #[arg(long, default_value = "drip")]
    namespace: String,
    /// Print JSON (as the limiter's GET /v1/rules/{rule}/keys/{key}).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    connection: RedisArgs,
    rule: String,
    key: String,
}

pub fn run(args: Args) -> ExitCode {
    match report(&args) {
        Ok(report) => {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
            } else {
                print!("{}", render(&report));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("drip inspect: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn report(args: &Args) -> anyhow::Result<EntityReport> {
    let rules = RuleSet::load(&args.rules).map_err(|errors| anyhow::anyhow!("{errors}"))?;
    let rule =
        rules.rule(&args.rule).with_context(|| format!("no rule named '{}' in {}", args.rule, args.rules.display()))?;
    let key = drip_core::template::cap_key(args.key.clone());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let store = RedisStore::new(args.connection.connect(&args.redis).await?, args.namespace.clone());
        Ok(store.inspect(rule, &key).await?)
    })
}

fn render(report: &EntityReport) -> String {
    let mut out = format!("rule       {}\nkey        {}\nnow        {}\n", report.rule, report.key, report.now);
    out += &format!("last slot  {}\n", report.last_slot.as_deref().unwrap_or("none remembered (idle)"));
    match &report.drains_at {
        Some(at) => out += &format!("backlog    ~{} ahead, drains at {at}\n", report.backlog),
        None => out += "backlog    none\n",
    }
    out += "limits\n";
    for limit in &report.limits {
        out += &format!(
            "  {:<28} {:>6} of {:<6} used now, ~{} ahead\n",
            limit.limit, limit.used_now, limit.capacity, limit.ahead
        );
    }
    out
}
