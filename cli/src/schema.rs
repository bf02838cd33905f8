//! `drip schema rules|overflow`: the JSON Schemas of the rules file and of an enriched overflow
//! message's body, generated from the types that read and write them (`docs/schemas/` holds
//! them as of this version, for editors and consumers).

use std::process::ExitCode;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Which {
    /// The rules file (`DRIP_RULES`), YAML or JSON.
    Rules,
    /// The body of an overflow message of a rule with `overflow_format: enriched`.
    Overflow,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    which: Which,
}

pub fn schema(which: Which) -> serde_json::Value {
    match which {
        Which::Rules => drip_core::rules::schema(),
        Which::Overflow => drip_core::overflow::schema(),
    }
}

pub fn run(args: Args) -> ExitCode {
    println!("{}", serde_json::to_string_pretty(&schema(args.which)).unwrap_or_default());
    ExitCode::SUCCESS
}
