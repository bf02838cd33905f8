//! `drip rules diff OLD NEW`: per rule (matched by id), each edit and what it does to entities that
//! already have a backlog: safe, delays, or needs care (docs/rules.md: "Changing limits").
//! `drip rules topics FILE`: the topics the rules publish to, as Drip reads them (Terraform creates
//! them from this output instead of parsing the YAML a second time).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use std::collections::BTreeSet;

use drip_core::rules::{Forward, RuleSet};
use drip_core::rules_diff::{Safety, diff};

use crate::output::{Output, Printed};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: RulesCommand,
}

#[derive(Debug, clap::Subcommand)]
enum RulesCommand {
    /// Compare two rules files; exits 1 with --check when an edit needs care.
    Diff {
        old: PathBuf,
        new: PathBuf,
        /// Exit 1 when any edit needs care (for CI before a rules change is applied).
        #[arg(long)]
        check: bool,
        /// `table` (a line per edit) or `json` (each rule's edits with their safety).
        #[arg(long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// The topics the rules publish to: forward, overflow and dead-letter topics in this project
    /// (to create), and full names of other projects' (to leave alone).
    Topics {
        file: PathBuf,
        /// `table` (a line per topic) or `json` (what Terraform's `rules_topics_file` takes).
        #[arg(long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

pub fn run(args: Args) -> ExitCode {
    match args.command {
        RulesCommand::Diff { old, new, check, output } => run_diff(&old, &new, check, output),
        RulesCommand::Topics { file, output } => run_topics(&file, output),
    }
}

fn run_topics(file: &Path, output: Output) -> ExitCode {
    let rules = match RuleSet::load(file) {
        Ok(rules) => rules,
        Err(errors) => {
            eprintln!("drip rules topics: {errors}");
            return ExitCode::from(2);
        }
    };
    let topics = topics(&rules);
    let mut table = String::new();
    for (kind, names) in [("forward", &topics.forward), ("overflow", &topics.overflow), ("dlq", &topics.dlq)] {
        table += &names.iter().map(|t| format!("{kind:<9} {t}\n")).collect::<String>();
    }
    table += &topics.external.iter().map(|t| format!("external  {t}\n")).collect::<String>();
    let json = serde_json::json!({
        "forward": topics.forward, "overflow": topics.overflow, "dlq": topics.dlq, "external": topics.external,
    });
    print!("{}", Printed { table, json }.render(output));
    ExitCode::SUCCESS
}

/// Each kind's topics in this project (ids), and every full name of another project's, sorted.
struct Topics {
    forward: BTreeSet<String>,
    overflow: BTreeSet<String>,
    dlq: BTreeSet<String>,
    external: BTreeSet<String>,
}

fn topics(rules: &RuleSet) -> Topics {
    let mut topics =
        Topics { forward: BTreeSet::new(), overflow: BTreeSet::new(), dlq: BTreeSet::new(), external: BTreeSet::new() };
    let mut add = |kind: fn(&mut Topics) -> &mut BTreeSet<String>, topic: &str| {
        if topic.starts_with("projects/") {
            topics.external.insert(topic.to_owned());
        } else {
            kind(&mut topics).insert(topic.to_owned());
        }
    };
    for rule in &rules.rules {
        if let Forward::Topic(topic) = &rule.forward {
            add(|t| &mut t.forward, topic);
        }
        add(|t| &mut t.overflow, &rule.overflow_topic);
        add(|t| &mut t.dlq, &rule.dlq_topic);
    }
    if let Some(topic) = &rules.default_dlq_topic {
        add(|t| &mut t.dlq, topic);
    }
    topics
}

fn run_diff(old: &Path, new: &Path, check: bool, output: Output) -> ExitCode {
    let load = |path: &Path| RuleSet::load(path).map_err(|errors| format!("{errors}"));
    let (old, new) = match (load(old), load(new)) {
        (Ok(old), Ok(new)) => (old, new),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("drip rules diff: {e}");
            return ExitCode::from(2);
        }
    };
    let diffs = diff(&old, &new);
    let needs_care = diffs.iter().flat_map(|r| &r.edits).any(|e| e.safety == Safety::NeedsCare);
    let mut table = String::new();
    for rule in &diffs {
        table += &format!("{} (id {})\n", rule.name, rule.id);
        for edit in &rule.edits {
            table += &format!("  {:<11} {}\n", edit.safety.to_string(), edit.what);
        }
    }
    if diffs.is_empty() {
        table = "no rule changes\n".into();
    }
    let rules: Vec<_> = diffs
        .iter()
        .map(|rule| {
            let edits: Vec<_> = rule
                .edits
                .iter()
                .map(|e| serde_json::json!({"safety": e.safety.to_string(), "what": e.what}))
                .collect();
            serde_json::json!({"id": rule.id, "name": rule.name, "edits": edits})
        })
        .collect();
    let json = serde_json::json!({"needsCare": needs_care, "rules": rules});
    print!("{}", Printed { table, json }.render(output));
    if check && needs_care { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
