//! `--output table|json` of the operator commands: a table (lines for people) or JSON (one
//! document, for scripts).

/// How a command prints what it found or did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    #[default]
    Table,
    Json,
}

/// What a command has to say, both ways.
pub struct Printed {
    pub table: String,
    pub json: serde_json::Value,
}

/// Runs a command's work on a one-thread runtime and prints what it found as `output` says; on an
/// error, says `drip <command>: <error>` and exits 1.
pub fn run(
    command: &str,
    output: Output,
    work: impl std::future::Future<Output = anyhow::Result<Printed>>,
) -> std::process::ExitCode {
    let printed = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(work));
    match printed {
        Ok(printed) => {
            print!("{}", printed.render(output));
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("drip {command}: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

impl Printed {
    pub fn render(&self, output: Output) -> String {
        match output {
            Output::Table => self.table.clone(),
            Output::Json => format!("{}\n", serde_json::to_string_pretty(&self.json).unwrap_or_default()),
        }
    }
}
