//! The event being scheduled: a Pub/Sub message's id, attributes and data.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde_json::Value;

#[derive(Debug)]
pub struct Event {
    pub id: String,
    pub attributes: BTreeMap<String, String>,
    pub data: Vec<u8>,
    json: OnceLock<Option<Value>>,
}

impl Event {
    pub fn new(id: impl Into<String>, attributes: BTreeMap<String, String>, data: Vec<u8>) -> Self {
        Self { id: id.into(), attributes, data, json: OnceLock::new() }
    }

    /// The data parsed as JSON, once; `None` when the body is not JSON.
    pub fn json(&self) -> Option<&Value> {
        self.json.get_or_init(|| serde_json::from_slice(&self.data).ok()).as_ref()
    }
}
