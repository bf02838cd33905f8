//! Key and cost templates: `tenant_{data.merchant_id}:payouts`, `{data.items.0.id}`, `{attributes.name}`.

use std::fmt;

use serde_json::Value;

use crate::json_path::{self, Found};
use sha2::{Digest, Sha256};

use crate::event::Event;

/// Keys longer than this many bytes are replaced by a readable prefix and a SHA-256 of the whole key,
/// so an untrusted payload cannot make Redis keys (or Cloud Task names) arbitrarily long.
pub const MAX_KEY_BYTES: usize = 200;
const HASHED_KEY_PREFIX_BYTES: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    source: String,
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Data(Vec<String>),
    Attribute(String),
}

/// Why a template could not be rendered for an event; `reason()` is the DLQ reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("field {0} is missing")]
    MissingField(String),
    #[error("field {0} is an object or array, not a value")]
    NotAScalar(String),
    #[error("the message data is not JSON")]
    NonJsonBody,
}

impl RenderError {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingField(_) | Self::NotAScalar(_) => "missing_key_field",
            Self::NonJsonBody => "non_json_body",
        }
    }
}

impl Template {
    pub fn parse(source: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = source;
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                None => {
                    parts.push(Part::Literal(rest.to_owned()));
                    break;
                }
                Some(at) if rest.as_bytes()[at] == b'}' => {
                    return Err(format!("unmatched '}}' at byte {}", source.len() - rest.len() + at));
                }
                Some(open) => {
                    if open > 0 {
                        parts.push(Part::Literal(rest[..open].to_owned()));
                    }
                    let after = &rest[open + 1..];
                    let close = after.find('}').ok_or_else(|| "unclosed '{'".to_owned())?;
                    parts.push(parse_placeholder(&after[..close])?);
                    rest = &after[close + 1..];
                }
            }
        }
        if parts.is_empty() {
            return Err("empty template".to_owned());
        }
        Ok(Self { source: source.to_owned(), parts })
    }

    /// A template with no placeholders renders to this text for every event.
    pub fn as_literal(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [Part::Literal(text)] => Some(text),
            _ => None,
        }
    }

    pub fn render(&self, event: &Event) -> Result<String, RenderError> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(text) => out.push_str(text),
                Part::Attribute(name) => out.push_str(
                    event
                        .attributes
                        .get(name)
                        .ok_or_else(|| RenderError::MissingField(format!("attributes.{name}")))?,
                ),
                Part::Data(path) => {
                    let field = || format!("data.{}", path.join("."));
                    match json_path::find(&event.data, path).map_err(|_| RenderError::NonJsonBody)? {
                        Found::Scalar(Value::String(s)) => out.push_str(&s),
                        Found::Scalar(Value::Number(n)) => out.push_str(&n.to_string()),
                        Found::Scalar(Value::Bool(b)) => out.push_str(if b { "true" } else { "false" }),
                        Found::Scalar(_) | Found::Missing => return Err(RenderError::MissingField(field())),
                        Found::Composite => return Err(RenderError::NotAScalar(field())),
                    }
                }
            }
        }
        Ok(out)
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

fn parse_placeholder(inner: &str) -> Result<Part, String> {
    let (source, path) = inner
        .split_once('.')
        .ok_or_else(|| format!("placeholder '{{{inner}}}' must be data.<path> or attributes.<name>"))?;
    match source {
        "data" => {
            let segments: Vec<String> = path.split('.').map(str::to_owned).collect();
            if segments.iter().any(|s| s.is_empty()) {
                return Err(format!("placeholder '{{{inner}}}' has an empty path segment"));
            }
            Ok(Part::Data(segments))
        }
        "attributes" if !path.is_empty() => Ok(Part::Attribute(path.to_owned())),
        "attributes" => Err(format!("placeholder '{{{inner}}}' names no attribute")),
        _ => Err(format!("placeholder '{{{inner}}}' must start with data. or attributes.")),
    }
}

/// Caps a rendered key at [`MAX_KEY_BYTES`]: a longer key keeps its first 64 bytes for readability
/// and gets `#` and the hex SHA-256 of the whole key, so distinct long keys stay distinct.
pub fn cap_key(key: String) -> String {
    if key.len() <= MAX_KEY_BYTES {
        return key;
    }
    let mut cut = HASHED_KEY_PREFIX_BYTES;
    while !key.is_char_boundary(cut) {
        cut -= 1;
    }
    let digest = Sha256::digest(key.as_bytes());
    format!("{}#{}", &key[..cut], hex::encode(digest))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn event(data: &str) -> Event {
        let attributes = BTreeMap::from([("region".to_owned(), "eu".to_owned())]);
        Event::new("m1", attributes, data.as_bytes().to_vec())
    }

    #[test]
    fn renders_data_paths_array_indexes_and_attributes() {
        let t = Template::parse("tenant_{data.merchant.id}:{data.items.1.sku}:{attributes.region}").unwrap();
        let e = event(r#"{"merchant":{"id":984},"items":[{"sku":"a"},{"sku":"b"}]}"#);
        assert_eq!(t.render(&e).unwrap(), "tenant_984:b:eu");
    }

    #[test]
    fn typed_errors_for_missing_fields_and_bodies() {
        let t = Template::parse("{data.merchant_id}").unwrap();
        assert_eq!(t.render(&event("{}")), Err(RenderError::MissingField("data.merchant_id".into())));
        assert_eq!(t.render(&event(r#"{"merchant_id":null}"#)).unwrap_err().reason(), "missing_key_field");
        assert_eq!(t.render(&event(r#"{"merchant_id":[1]}"#)), Err(RenderError::NotAScalar("data.merchant_id".into())));
        assert_eq!(t.render(&event("not json")), Err(RenderError::NonJsonBody));
        let a = Template::parse("{attributes.tenant}").unwrap();
        assert_eq!(a.render(&event("{}")), Err(RenderError::MissingField("attributes.tenant".into())));
    }

    #[test]
    fn literals_need_no_body() {
        let t = Template::parse("global").unwrap();
        assert_eq!(t.as_literal(), Some("global"));
        assert_eq!(t.render(&event("not json")).unwrap(), "global");
    }

    #[test]
    fn rejects_malformed_templates() {
        assert_eq!(Template::parse("a{data.x").unwrap_err(), "unclosed '{'");
        assert_eq!(Template::parse("a}b").unwrap_err(), "unmatched '}' at byte 1");
        assert!(Template::parse("{merchant_id}").unwrap_err().contains("must be data.<path> or attributes.<name>"));
        assert!(Template::parse("{body.x}").unwrap_err().contains("must start with data. or attributes."));
        assert!(Template::parse("{data.a..b}").unwrap_err().contains("empty path segment"));
        assert!(Template::parse("").is_err());
    }

    #[test]
    fn long_keys_are_hashed_and_stay_distinct() {
        let short = "k".repeat(MAX_KEY_BYTES);
        assert_eq!(cap_key(short.clone()), short);
        let a = cap_key("é".repeat(150));
        let b = cap_key(format!("{}x", "é".repeat(150)));
        assert!(a.len() <= HASHED_KEY_PREFIX_BYTES + 65);
        assert_ne!(a, b);
        assert!(a.contains('#'));
    }
}
