//! What a partner says of its own limits on its answers (docs/rules.md: "Learning the partner's
//! limits"): the IETF draft's `RateLimit-Policy` and `RateLimit` fields (draft-ietf-httpapi-
//! ratelimit-headers, Structured Field Lists: `"burst";q=100;w=60` and `"burst";r=12;t=30`), the
//! older spellings most APIs still send (`X-RateLimit-Limit`, `-Remaining`, `-Reset` as seconds
//! from now or as an epoch time, the draft's own earlier `RateLimit-Limit/-Remaining/-Reset`),
//! Shopify's `X-Shopify-Shop-Api-Call-Limit: 32/40`, and a `Retry-After` on any answer.
//!
//! Reading never fails: what cannot be read, or cannot be true (a negative count, a quota past
//! [`MAX_QUOTA`], a window past a year), is left out and named in [`PartnerSays::ignored`]; a
//! reset further than [`MAX_RESET`] away is cut to it. Pure: the caller passes `now`.

use crate::time::{DAY, Millis, SECOND, system_time_to_millis};

/// The largest quota believed: a count past it is a bug of the partner's, not a limit.
pub const MAX_QUOTA: u64 = 1_000_000_000;
/// The longest policy window believed.
pub const MAX_WINDOW: Millis = 366 * DAY;
/// The furthest reset believed: a later one is cut to this (a pause is cut further by `max_pause`).
pub const MAX_RESET: Millis = DAY;
/// A reset value at least this large is an epoch time in seconds, not seconds from now
/// (2001-09-09: no partner resets a quota 31 years from now).
const EPOCH_SECONDS_FROM: f64 = 1_000_000_000.0;
/// ... and at least this large, an epoch time in milliseconds.
const EPOCH_MILLIS_FROM: f64 = 1_000_000_000_000.0;

/// One quota policy the partner declares: `quota` units per `window` (unknown for most legacy
/// spellings, which say only the count).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The draft's policy name; `None` for a legacy spelling.
    pub name: Option<String>,
    pub quota: u64,
    pub window: Option<Millis>,
}

/// What remains of a policy's quota now, and when it is whole again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remaining {
    /// The policy it belongs to (the draft's name); `None` for a legacy spelling.
    pub name: Option<String>,
    pub remaining: u64,
    pub resets_at: Option<Millis>,
}

/// Everything one answer said of the partner's limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartnerSays {
    pub policies: Vec<Policy>,
    pub remaining: Vec<Remaining>,
    /// A `Retry-After` on the answer (on a 2xx too), as when it ends, cut to [`MAX_RESET`].
    pub retry_until: Option<Millis>,
    /// What was left out and why, to be logged (once per partner and field).
    pub ignored: Vec<String>,
}

impl PartnerSays {
    /// Whether the answer said anything of its limits.
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty() && self.remaining.is_empty() && self.retry_until.is_none()
    }

    /// The policy a remaining count belongs to: the one of its name, or the only one.
    pub fn policy_of(&self, remaining: &Remaining) -> Option<&Policy> {
        match &remaining.name {
            Some(name) => self.policies.iter().find(|p| p.name.as_deref() == Some(name.as_str())),
            None if self.policies.len() == 1 => self.policies.first(),
            None => self.policies.iter().find(|p| p.name.is_none()),
        }
    }
}

/// Reads the answer's headers (`name`, `value` pairs; names in any case) at `now`.
pub fn read<'a>(headers: impl IntoIterator<Item = (&'a str, &'a str)>, now: Millis) -> PartnerSays {
    let mut says = PartnerSays::default();
    let mut legacy = Legacy::default();
    for (name, value) in headers {
        let value = value.trim();
        match name.to_ascii_lowercase().as_str() {
            "ratelimit-policy" => read_policies(value, &mut says),
            "ratelimit" => read_ratelimit(value, now, &mut says),
            "x-ratelimit-limit" | "ratelimit-limit" => legacy.limit = Some(value.to_owned()),
            "x-ratelimit-remaining" | "ratelimit-remaining" => legacy.remaining = Some(value.to_owned()),
            "x-ratelimit-reset" | "ratelimit-reset" => legacy.reset = Some(value.to_owned()),
            "x-ratelimit-reset-after" => legacy.reset_after = Some(value.to_owned()),
            "x-shopify-shop-api-call-limit" => read_call_limit(value, &mut says),
            "retry-after" => match retry_after_until(value, now) {
                Some(until) => says.retry_until = Some(until),
                None => says.ignored.push(format!("Retry-After {value:?}: neither seconds nor an HTTP date")),
            },
            _ => {}
        }
    }
    legacy.read(now, &mut says);
    says
}

/// When a `Retry-After` (delta-seconds or an HTTP date) ends, cut to [`MAX_RESET`] from `now`;
/// a date in the past is now.
pub fn retry_after_until(value: &str, now: Millis) -> Option<Millis> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(now + (seconds.min((MAX_RESET / SECOND) as u64) as Millis) * SECOND);
    }
    let until = system_time_to_millis(httpdate::parse_http_date(value).ok()?)?;
    Some(until.clamp(now, now + MAX_RESET))
}

/// `RateLimit-Policy: "burst";q=100;w=60, "day";q=1000;w=86400`. A policy of a unit other than
/// requests (`qu="content-bytes"`) counts something Drip does not, and is left out.
fn read_policies(value: &str, says: &mut PartnerSays) {
    let Some(items) = list_items(value, "RateLimit-Policy", says) else { return };
    for (name, params) in items {
        let unit = params.iter().find(|(k, _)| k == "qu").map(|(_, v)| v.clone());
        if let Some(unit) = unit.filter(|u| u.as_text() != Some("requests")) {
            says.ignored.push(format!("RateLimit-Policy {name:?}: quota unit {unit} is not requests"));
            continue;
        }
        let quota = match param_count(&params, "q", &name, says) {
            Some(Some(quota)) => quota,
            Some(None) => continue,
            None => {
                says.ignored.push(format!("RateLimit-Policy {name:?}: no quota (q)"));
                continue;
            }
        };
        let window = match params.iter().find(|(k, _)| k == "w") {
            None => None,
            Some((_, v)) => match v.as_integer().filter(|w| *w > 0 && *w * SECOND <= MAX_WINDOW) {
                Some(w) => Some(w * SECOND),
                None => {
                    says.ignored.push(format!("RateLimit-Policy {name:?}: window {v} is not 1 s to a year"));
                    continue;
                }
            },
        };
        says.policies.push(Policy { name: Some(name), quota, window });
    }
}

/// `RateLimit: "burst";r=12;t=30`; also the draft's earlier dictionary `limit=100, remaining=12,
/// reset=30`.
fn read_ratelimit(value: &str, now: Millis, says: &mut PartnerSays) {
    if value.contains("remaining=") {
        let mut legacy = Legacy::default();
        for member in value.split(',') {
            if let Some((key, v)) = member.trim().split_once('=') {
                let v = Some(v.trim().to_owned());
                match key.trim() {
                    "limit" => legacy.limit = v,
                    "remaining" => legacy.remaining = v,
                    "reset" => legacy.reset_after = v,
                    _ => {}
                }
            }
        }
        legacy.read(now, says);
        return;
    }
    let Some(items) = list_items(value, "RateLimit", says) else { return };
    for (name, params) in items {
        let remaining = match param_count(&params, "r", &name, says) {
            Some(Some(remaining)) => remaining,
            Some(None) => continue,
            None => {
                says.ignored.push(format!("RateLimit {name:?}: no remaining count (r)"));
                continue;
            }
        };
        let resets_at = match params.iter().find(|(k, _)| k == "t") {
            None => None,
            Some((_, v)) => match v.as_integer().filter(|t| *t >= 0) {
                Some(t) => Some(now + t.min(MAX_RESET / SECOND) * SECOND),
                None => {
                    says.ignored.push(format!("RateLimit {name:?}: reset {v} is not seconds from now"));
                    None
                }
            },
        };
        says.remaining.push(Remaining { name: Some(name), remaining, resets_at });
    }
}

/// `X-Shopify-Shop-Api-Call-Limit: 32/40`: 32 of a bucket of 40 used.
fn read_call_limit(value: &str, says: &mut PartnerSays) {
    let parsed = value
        .split_once('/')
        .and_then(|(used, size)| Some((used.trim().parse::<u64>().ok()?, size.trim().parse::<u64>().ok()?)));
    match parsed.filter(|(used, size)| *size > 0 && *size <= MAX_QUOTA && used <= size) {
        Some((used, size)) => {
            says.policies.push(Policy { name: None, quota: size, window: None });
            says.remaining.push(Remaining { name: None, remaining: size - used, resets_at: None });
        }
        None => says.ignored.push(format!("X-Shopify-Shop-Api-Call-Limit {value:?}: not used/size")),
    }
}

/// The legacy three fields, read together once all are seen.
#[derive(Default)]
struct Legacy {
    limit: Option<String>,
    remaining: Option<String>,
    /// Seconds from now, or an epoch time in seconds or milliseconds.
    reset: Option<String>,
    /// Seconds from now, always (Discord's `X-RateLimit-Reset-After`, the draft's `reset=`).
    reset_after: Option<String>,
}

impl Legacy {
    fn read(self, now: Millis, says: &mut PartnerSays) {
        if let Some(limit) = &self.limit {
            match legacy_limit(limit) {
                Some((quota, window)) => says.policies.push(Policy { name: None, quota, window }),
                None => says.ignored.push(format!("X-RateLimit-Limit {limit:?}: not a count")),
            }
        }
        let Some(remaining) = &self.remaining else { return };
        let Some(count) = count(remaining) else {
            says.ignored.push(format!("X-RateLimit-Remaining {remaining:?}: not a count"));
            return;
        };
        let resets_at = match (&self.reset_after, &self.reset) {
            (Some(after), _) => seconds(after).map(|s| now + (s.min(MAX_RESET as f64 / 1e3) * 1e3) as Millis),
            (None, Some(reset)) => seconds(reset).map(|v| reset_time(v, now)),
            (None, None) => None,
        };
        if resets_at.is_none() && (self.reset.is_some() || self.reset_after.is_some()) {
            let given = self.reset_after.or(self.reset).unwrap_or_default();
            says.ignored.push(format!("X-RateLimit-Reset {given:?}: not a time"));
        }
        says.remaining.push(Remaining { name: None, remaining: count, resets_at });
    }
}

/// A reset value: an epoch time in milliseconds or seconds when large enough, else seconds from
/// now; never before now, never past [`MAX_RESET`].
fn reset_time(value: f64, now: Millis) -> Millis {
    let at = if value >= EPOCH_MILLIS_FROM {
        value as Millis
    } else if value >= EPOCH_SECONDS_FROM {
        (value * 1e3) as Millis
    } else {
        now + (value * 1e3) as Millis
    };
    at.clamp(now, now + MAX_RESET)
}

/// `100`, or the draft's earlier `100, 100;w=60, 1000;w=3600` (the count in effect first, then
/// the policies: its window is that of the policy of the same count).
fn legacy_limit(value: &str) -> Option<(u64, Option<Millis>)> {
    let mut elements = value.split(',').map(|element| {
        let mut parts = element.split(';');
        let quota = parts.next().and_then(count);
        let window = parts
            .filter_map(|p| p.trim().strip_prefix("w="))
            .find_map(|w| w.trim().parse::<i64>().ok())
            .filter(|w| *w > 0 && *w * SECOND <= MAX_WINDOW)
            .map(|w| w * SECOND);
        (quota, window)
    });
    let (quota, window) = elements.next()?;
    let quota = quota?;
    let window = window.or_else(|| elements.find(|(q, w)| *q == Some(quota) && w.is_some()).and_then(|(_, w)| w));
    Some((quota, window))
}

/// A count: a whole number from 0 to [`MAX_QUOTA`] (a decimal point is tolerated when nothing
/// follows it but zeros).
fn count(value: &str) -> Option<u64> {
    let value = value.trim();
    let whole = value.split_once('.').filter(|(_, f)| f.chars().all(|c| c == '0')).map_or(value, |(w, _)| w);
    whole.parse::<u64>().ok().filter(|n| *n <= MAX_QUOTA)
}

/// Seconds, whole or decimal, not negative.
fn seconds(value: &str) -> Option<f64> {
    value.trim().parse::<f64>().ok().filter(|s| s.is_finite() && *s >= 0.0)
}

/// A parameter's value as the few kinds the fields use.
#[derive(Debug, Clone)]
enum Param {
    Integer(i64),
    Text(String),
    Other(String),
}

impl std::fmt::Display for Param {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Param::Integer(n) => write!(f, "{n}"),
            Param::Text(s) => write!(f, "{s:?}"),
            Param::Other(s) => f.write_str(s),
        }
    }
}

impl Param {
    fn as_integer(&self) -> Option<i64> {
        match self {
            Param::Integer(n) => Some(*n),
            _ => None,
        }
    }

    fn as_text(&self) -> Option<&str> {
        match self {
            Param::Text(s) => Some(s),
            _ => None,
        }
    }
}

/// A policy's name (a String or a Token) and its parameters, as a Structured Field List has it.
type NamedItem = (String, Vec<(String, Param)>);

/// A Structured Field List's items.
fn list_items(value: &str, field: &str, says: &mut PartnerSays) -> Option<Vec<NamedItem>> {
    let list = match sfv::Parser::new(value).parse::<sfv::List>() {
        Ok(list) => list,
        Err(error) => {
            says.ignored.push(format!("{field} {value:?}: not a structured list ({error})"));
            return None;
        }
    };
    let mut items = Vec::new();
    for entry in list {
        let sfv::ListEntry::Item(item) = entry else {
            says.ignored.push(format!("{field}: an inner list where a policy was expected"));
            continue;
        };
        let name = match &item.bare_item {
            sfv::BareItem::String(s) => s.as_str().to_owned(),
            sfv::BareItem::Token(t) => t.as_str().to_owned(),
            other => {
                says.ignored.push(format!("{field}: {other:?} is not a policy name"));
                continue;
            }
        };
        let params = item
            .params
            .iter()
            .map(|(key, value)| {
                let param = match value {
                    sfv::BareItem::Integer(n) => Param::Integer(i64::from(*n)),
                    sfv::BareItem::String(s) => Param::Text(s.as_str().to_owned()),
                    sfv::BareItem::Token(t) => Param::Text(t.as_str().to_owned()),
                    other => Param::Other(format!("{other:?}")),
                };
                (key.as_str().to_owned(), param)
            })
            .collect();
        items.push((name, params));
    }
    Some(items)
}

/// An integer parameter that is a count: `None` when absent, `Some(None)` when it is not a count
/// (named in `ignored`).
fn param_count(params: &[(String, Param)], key: &str, name: &str, says: &mut PartnerSays) -> Option<Option<u64>> {
    let (_, value) = params.iter().find(|(k, _)| k == key)?;
    let n = value.as_integer().and_then(|n| u64::try_from(n).ok()).filter(|n| *n <= MAX_QUOTA);
    if n.is_none() {
        says.ignored.push(format!("{name:?}: {key}={value} is not a count from 0 to {MAX_QUOTA}"));
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Millis = 1_780_000_000_000;

    fn says(headers: &[(&str, &str)]) -> PartnerSays {
        read(headers.iter().copied(), NOW)
    }

    fn policy(name: Option<&str>, quota: u64, window: Option<Millis>) -> Policy {
        Policy { name: name.map(str::to_owned), quota, window }
    }

    fn remaining(name: Option<&str>, remaining: u64, resets_at: Option<Millis>) -> Remaining {
        Remaining { name: name.map(str::to_owned), remaining, resets_at }
    }

    /// Real answers' headers, each with what Drip reads from them.
    #[test]
    fn real_header_samples_read_as_the_partner_meant() {
        // The draft's examples: one policy, then two policies with their remaining counts.
        let draft = says(&[("RateLimit-Policy", "\"default\";q=100;w=10"), ("RateLimit", "\"default\";r=50;t=30")]);
        assert_eq!(draft.policies, [policy(Some("default"), 100, Some(10 * SECOND))]);
        assert_eq!(draft.remaining, [remaining(Some("default"), 50, Some(NOW + 30 * SECOND))]);
        assert!(draft.ignored.is_empty(), "{:?}", draft.ignored);
        let two = says(&[
            ("ratelimit-policy", "\"burst\";q=100;w=60,\"daily\";q=1000;w=86400"),
            ("ratelimit", "\"daily\";r=0;t=600, \"burst\";r=12;t=5"),
        ]);
        assert_eq!(
            two.policies,
            [policy(Some("burst"), 100, Some(60 * SECOND)), policy(Some("daily"), 1000, Some(DAY))]
        );
        let daily = &two.remaining[0];
        assert_eq!((daily.remaining, daily.resets_at), (0, Some(NOW + 600 * SECOND)));
        assert_eq!(two.policy_of(daily).map(|p| p.quota), Some(1000));
        // A token for a name, a partition key and a unit of requests are all fine.
        let token = says(&[("RateLimit-Policy", "peruser;q=10;w=1;qu=\"requests\";pk=:cHJvamVjdDEyMw==:")]);
        assert_eq!(token.policies, [policy(Some("peruser"), 10, Some(SECOND))]);

        // GitHub: an epoch reset in seconds.
        let github = says(&[
            ("x-ratelimit-limit", "5000"),
            ("x-ratelimit-remaining", "4999"),
            ("x-ratelimit-used", "1"),
            ("x-ratelimit-reset", &((NOW / 1_000 + 3_600).to_string())),
            ("x-ratelimit-resource", "core"),
        ]);
        assert_eq!(github.policies, [policy(None, 5000, None)]);
        assert_eq!(github.remaining, [remaining(None, 4999, Some(NOW + 3_600 * SECOND))]);
        // A delta reset, and the draft's earlier fields with a window.
        let delta = says(&[("X-RateLimit-Limit", "60"), ("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", "12")]);
        assert_eq!(delta.remaining, [remaining(None, 0, Some(NOW + 12 * SECOND))]);
        let early = says(&[
            ("RateLimit-Limit", "10, 10;w=1, 1000;w=3600"),
            ("RateLimit-Remaining", "3"),
            ("RateLimit-Reset", "1"),
        ]);
        assert_eq!(early.policies, [policy(None, 10, Some(SECOND))]);
        // An epoch in milliseconds, a decimal delta (Discord's Reset-After).
        let millis = says(&[("X-RateLimit-Remaining", "1"), ("X-RateLimit-Reset", &(NOW + 2_500).to_string())]);
        assert_eq!(millis.remaining[0].resets_at, Some(NOW + 2_500));
        let discord = says(&[
            ("X-RateLimit-Remaining", "0"),
            ("X-RateLimit-Reset-After", "1.25"),
            ("X-RateLimit-Reset", "1470173023.123"),
        ]);
        assert_eq!(discord.remaining[0].resets_at, Some(NOW + 1_250));
        // The draft's dictionary spelling of one version.
        let dict = says(&[("RateLimit", "limit=100, remaining=7, reset=9")]);
        assert_eq!((dict.policies[0].quota, dict.remaining[0].remaining), (100, 7));
        assert_eq!(dict.remaining[0].resets_at, Some(NOW + 9 * SECOND));
        // Shopify's leaky bucket.
        let shopify = says(&[("X-Shopify-Shop-Api-Call-Limit", "32/40")]);
        assert_eq!(shopify.policies, [policy(None, 40, None)]);
        assert_eq!(shopify.remaining, [remaining(None, 8, None)]);
        // A Retry-After on a 200, in seconds and as an HTTP date.
        assert_eq!(says(&[("Retry-After", "3")]).retry_until, Some(NOW + 3 * SECOND));
        let date =
            httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_millis((NOW + 20_000) as u64));
        assert_eq!(says(&[("Retry-After", &date)]).retry_until, Some(NOW + 20 * SECOND));
        // Nothing said, nothing read.
        assert!(says(&[("content-type", "application/json")]).is_empty());
    }

    /// Bogus values are left out, each named; a far reset is cut; nothing panics.
    #[test]
    fn bogus_values_are_ignored_or_capped_and_named() {
        let bogus = says(&[
            (
                "RateLimit-Policy",
                "\"a\";q=-5;w=1, \"b\";q=10;w=0, \"c\";q=99999999999999;w=1, \"d\";w=1, \"e\";q=5;w=1;qu=\"content-bytes\", \"ok\";q=5;w=2",
            ),
            ("RateLimit", "\"ok\";r=-1, \"x\";r=2;t=-4"),
        ]);
        assert_eq!(bogus.policies, [policy(Some("ok"), 5, Some(2 * SECOND))]);
        assert_eq!(bogus.remaining, [remaining(Some("x"), 2, None)]);
        assert_eq!(bogus.ignored.len(), 7, "{:#?}", bogus.ignored);
        let broken = says(&[("RateLimit-Policy", "\"unterminated;q=1"), ("RateLimit", "((")]);
        assert!(broken.is_empty() && broken.ignored.len() == 2, "{broken:?}");
        let legacy =
            says(&[("X-RateLimit-Limit", "lots"), ("X-RateLimit-Remaining", "-3"), ("X-RateLimit-Reset", "soon")]);
        assert!(legacy.is_empty() && legacy.ignored.len() == 2, "{legacy:?}");
        let far = says(&[("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", "999999999")]);
        assert_eq!(far.remaining[0].resets_at, Some(NOW + MAX_RESET), "a reset years away is cut");
        let past = says(&[("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", "1000000001")]);
        assert_eq!(past.remaining[0].resets_at, Some(NOW), "an epoch in the past is now");
        assert_eq!(says(&[("Retry-After", "99999999")]).retry_until, Some(NOW + MAX_RESET));
        assert!(says(&[("Retry-After", "tomorrow")]).retry_until.is_none());
        assert!(says(&[("X-Shopify-Shop-Api-Call-Limit", "41/40")]).policies.is_empty());
    }
}
