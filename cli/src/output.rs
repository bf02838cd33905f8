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

impl Printed {
    pub fn render(&self, output: Output) -> String {
        match output {
            Output::Table => self.table.clone(),
            Output::Json => format!("{}\n", serde_json::to_string_pretty(&self.json).unwrap_or_default()),
        }
    }
}
