//! The body of the Cloud Task that carries a delayed event to the dispatcher (the seed's format,
//! plus what the dispatcher needs to republish it faithfully and consumers need to deduplicate).

use std::collections::BTreeMap;

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

/// What the limiter hands the dispatcher through a Cloud Task. On the wire (the seed's format) the
/// payload is one of three fields; here it is one [`TaskPayload`], so a body with two of them never
/// gets past deserialization.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "OwnedWireTaskBody")]
pub struct TaskBody {
    pub is_ratelimited: bool,
    pub rate_limit_meta: RateLimitMeta,
    pub payload: TaskPayload,
    pub attributes: BTreeMap<String, String>,
    /// The id Pub/Sub gave the message (unique within its topic only).
    pub message_id: String,
    /// The subscription it came through: with `message_id`, the message's identity.
    pub subscription: Option<String>,
    pub publish_time: Option<String>,
}

/// Where a task's data is.
#[derive(Debug, Clone)]
pub enum TaskPayload {
    /// The data as it came, when it is JSON: `originalPayload`, verbatim.
    Json(Box<RawValue>),
    /// Any other data: `originalPayloadBase64`.
    Bytes(Vec<u8>),
    /// The data waits in Redis under this reference (too large for a task): `claimCheck`.
    ClaimCheck(String),
}

impl TaskBody {
    /// The claim-check reference of an encoded task body's payload, if it has one.
    pub fn claim_check_of(body: &[u8]) -> Option<String> {
        match serde_json::from_slice::<TaskBody>(body).ok()?.payload {
            TaskPayload::ClaimCheck(reference) => Some(reference),
            _ => None,
        }
    }
}

impl TaskPayload {
    /// `data` inline: verbatim when it is JSON, else as bytes (base64 on the wire).
    pub fn inline(data: &[u8]) -> Self {
        let verbatim_json = std::str::from_utf8(data)
            .ok()
            .filter(|text| text.trim() == *text)
            .and_then(|text| RawValue::from_string(text.to_owned()).ok());
        verbatim_json.map_or_else(|| Self::Bytes(data.to_vec()), Self::Json)
    }

    /// The data, unless it waits behind a claim-check.
    pub fn data(&self) -> Option<Vec<u8>> {
        match self {
            Self::Json(json) => Some(json.get().as_bytes().to_vec()),
            Self::Bytes(bytes) => Some(bytes.clone()),
            Self::ClaimCheck(_) => None,
        }
    }
}

/// The task body as JSON has it: the payload is whichever of the three fields is present. It is
/// also the body of an overflow message of a rule with `overflow_format: enriched` (the payload
/// then inline), whose JSON Schema `drip schema overflow` prints.
#[derive(Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(bound = "", title = "Drip overflow message (overflow_format: enriched)")]
struct WireTaskBody<J, S, M, A> {
    /// Always true: the event was delayed by Drip.
    is_ratelimited: bool,
    /// Which rule and key delayed it, and until when.
    #[schemars(with = "RateLimitMeta")]
    rate_limit_meta: M,
    /// The event's data, when it is JSON, verbatim (at most one of the three payload fields).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Value>")]
    original_payload: Option<J>,
    /// The event's data, when it is not JSON, base64-encoded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    original_payload_base64: Option<S>,
    /// In a task only: the data waits in Redis under this reference (too large for a task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    claim_check: Option<S>,
    /// The event's own attributes, as it was published.
    #[schemars(with = "BTreeMap<String, String>")]
    attributes: A,
    /// The id Pub/Sub gave the event (unique within its topic).
    #[schemars(with = "String")]
    message_id: S,
    /// The subscription it came through: with `messageId`, the event's identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    subscription: Option<S>,
    /// When the event was published (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    publish_time: Option<S>,
}

/// The JSON Schema of an enriched overflow message's body (`drip schema overflow`).
pub fn schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(OwnedWireTaskBody)).unwrap_or_default()
}

type OwnedWireTaskBody = WireTaskBody<Box<RawValue>, String, RateLimitMeta, BTreeMap<String, String>>;

impl TryFrom<OwnedWireTaskBody> for TaskBody {
    type Error = String;

    fn try_from(wire: OwnedWireTaskBody) -> Result<Self, String> {
        use base64::Engine;
        let payload = match (wire.original_payload, wire.original_payload_base64, wire.claim_check) {
            (Some(json), None, None) => TaskPayload::Json(json),
            (None, Some(encoded), None) => TaskPayload::Bytes(
                base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .map_err(|e| format!("originalPayloadBase64: {e}"))?,
            ),
            (None, None, Some(reference)) => TaskPayload::ClaimCheck(reference),
            (None, None, None) => TaskPayload::Bytes(Vec::new()),
            _ => return Err("more than one of originalPayload, originalPayloadBase64 and claimCheck".into()),
        };
        Ok(Self {
            is_ratelimited: wire.is_ratelimited,
            rate_limit_meta: wire.rate_limit_meta,
            payload,
            attributes: wire.attributes,
            message_id: wire.message_id,
            subscription: wire.subscription,
            publish_time: wire.publish_time,
        })
    }
}

impl Serialize for TaskBody {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use base64::Engine;
        let base64;
        let (json, encoded, claim_check) = match &self.payload {
            TaskPayload::Json(json) => (Some(json.as_ref()), None, None),
            TaskPayload::Bytes(bytes) => {
                base64 = base64::engine::general_purpose::STANDARD.encode(bytes);
                (None, Some(base64.as_str()), None)
            }
            TaskPayload::ClaimCheck(reference) => (None, None, Some(reference.as_str())),
        };
        WireTaskBody {
            is_ratelimited: self.is_ratelimited,
            rate_limit_meta: &self.rate_limit_meta,
            original_payload: json,
            original_payload_base64: encoded,
            claim_check,
            attributes: &self.attributes,
            message_id: self.message_id.as_str(),
            subscription: self.subscription.as_deref(),
            publish_time: self.publish_time.as_deref(),
        }
        .serialize(serializer)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RateLimitMeta {
    /// The key the rule gave the event.
    pub key: String,
    /// The rule's name.
    pub rule: String,
    /// The rule's `id`, when it is not its name: what the task's Redis keys hang on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule_id: Option<String>,
    /// `RPS`, `RPM`, `RPD`... of the rule's first limit.
    pub window_type: String,
    /// The count of the rule's first limit.
    pub limit: u64,
    /// The slot the event was given (RFC 3339 on the wire).
    #[serde(with = "crate::time::rfc3339")]
    #[schemars(with = "String")]
    pub scheduled_for: crate::time::Millis,
    /// The topic it is published on.
    pub overflow_topic: String,
    /// The event's cost, for a new slot the dispatcher reserves (an `overflow: { url }` that
    /// answered 429); absent in tasks made before it existed (cost 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
}

/// The task's name within its queue, derived from (rule, message identity) so a retried create for
/// a redelivered message is refused as ALREADY_EXISTS instead of scheduling the event twice, while
/// one id from two subscriptions makes two tasks. A task the dispatcher makes for a new slot adds
/// the slot, so that each new slot has its own task and a retried creation its own name again.
pub fn task_id(rule: &str, identity: &str, reslotted_for: Option<i64>) -> String {
    let digest = Sha256::digest(format!("{rule}\0{identity}").as_bytes());
    match reslotted_for {
        None => format!("{}-{rule}", hex::encode(&digest[..16])),
        Some(slot) => format!("{}-{rule}-at-{slot}", hex::encode(&digest[..16])),
    }
}

/// The task that wakes the drain of a key's parked messages (docs/design.md: "Parking a
/// throttled key's backlog"): `{"wake": {"rule_id": ..., "key": ...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WakeTask {
    pub wake: WakeOf,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WakeOf {
    pub rule_id: String,
    pub key: String,
}

impl WakeTask {
    /// `body` as a wake, or `None` when it is an event's task body or a batch.
    pub fn parse(body: &[u8]) -> Option<Self> {
        serde_json::from_slice(body).ok()
    }

    pub fn body(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("two strings encode")
    }

    /// Its name for a wake at `at`: a wake armed twice for one time is ALREADY_EXISTS.
    pub fn name(&self, at: crate::time::Millis) -> String {
        let digest = Sha256::digest(format!("{}\0{}", self.wake.rule_id, self.wake.key).as_bytes());
        format!("wake-{}-{}-at-{at}", hex::encode(&digest[..16]), self.wake.rule_id)
    }
}

/// The task that wakes the drain of a fair budget's ring of waiting keys (docs/rules.md: "Fair
/// budgets"): `{"fair_wake": {"budget": ..., "tag": ...}}`, `tag` only where the budget's hash
/// tag is not its name (it shares a shard with a budget a rule draws from beside it): a wake for
/// a budget the rules no longer have still finds its ring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FairWakeTask {
    pub fair_wake: FairWakeOf,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FairWakeOf {
    pub budget: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// On a leased budget, the partition whose ring it drains, of how many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<u32>,
}

impl FairWakeTask {
    pub fn of(ring: crate::budgets::FairRing<'_>) -> Self {
        let budget = ring.budget;
        let tag = (budget.tag != budget.name).then(|| budget.tag.clone());
        let partitions = ring.partition.and(budget.leases.map(|l| l.partitions));
        Self { fair_wake: FairWakeOf { budget: budget.name.clone(), tag, partition: ring.partition, partitions } }
    }

    /// The budget's hash tag: its name unless the wake says otherwise.
    pub fn tag(&self) -> &str {
        self.fair_wake.tag.as_deref().unwrap_or(&self.fair_wake.budget)
    }

    /// The ring it wakes, of `budget` as the rules have it now; `None` when the budget's
    /// partitions changed since it was armed (the ring it named is not one of the budget's now).
    pub fn ring_of<'a>(&self, budget: &'a crate::budgets::Budget) -> Option<crate::budgets::FairRing<'a>> {
        let now = budget.leases.map(|l| l.partitions);
        let fits = match self.fair_wake.partition {
            Some(partition) => now == self.fair_wake.partitions && now.is_some_and(|n| partition < n),
            None => now.is_none(),
        };
        fits.then_some(crate::budgets::FairRing { budget, partition: self.fair_wake.partition })
    }

    /// Enough of the budget it was armed for to name its ring in the store, whatever the rules
    /// say now: its name, hash tag and partitions.
    pub fn budget_named(&self) -> crate::budgets::Budget {
        let mut budget = crate::budgets::Budget::fair_named(&self.fair_wake.budget, self.tag());
        budget.leases = self.fair_wake.partitions.map(|partitions| crate::budgets::Leases {
            partitions,
            chunk: crate::budgets::Leases::default_chunk(partitions),
        });
        budget
    }

    /// `body` as a fair budget's wake, or `None`.
    pub fn parse(body: &[u8]) -> Option<Self> {
        serde_json::from_slice(body).ok()
    }

    pub fn body(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a string encodes")
    }

    /// Its name for a wake at `at` (budget names are task-name characters): a wake armed twice
    /// for one time is ALREADY_EXISTS.
    pub fn name(&self, at: crate::time::Millis) -> String {
        match self.fair_wake.partition {
            Some(partition) => format!("fairwake-{}-p{partition}-at-{at}", self.fair_wake.budget),
            None => format!("fairwake-{}-at-{at}", self.fair_wake.budget),
        }
    }
}

/// Several delayed events of one queue whose slots fall in one short bucket, carried by one task:
/// `{"batch": [<task body>, ...]}`, each element exactly what the event's own task would carry.
#[derive(Debug, Deserialize)]
pub struct TaskBatch<'a> {
    #[serde(borrow)]
    pub batch: Vec<&'a RawValue>,
}

impl<'a> TaskBatch<'a> {
    /// `body` as a batch, or `None` when it is one event's task body (or not JSON at all).
    pub fn parse(body: &'a [u8]) -> Option<Self> {
        serde_json::from_slice(body).ok()
    }

    /// The batch body of the events' own task bodies (each valid JSON: a serialized [`TaskBody`]).
    pub fn encode(bodies: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::with_capacity(bodies.iter().map(|b| b.len() + 1).sum::<usize>() + BATCH_ENVELOPE);
        out.extend_from_slice(b"{\"batch\":[");
        for (i, body) in bodies.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(body);
        }
        out.extend_from_slice(b"]}");
        out
    }
}

/// What a batch adds to its events' bodies, besides a comma each.
pub const BATCH_ENVELOPE: usize = r#"{"batch":[]}"#.len();

/// A batch task's name: a hash of its events' own task names in order, so that a retried create of
/// the same batch is ALREADY_EXISTS (and another grouping of the same events is another task,
/// which the dispatcher's once-only claim per event makes harmless).
pub fn batch_task_id(names: &[&str]) -> String {
    let mut digest = Sha256::new();
    for name in names {
        digest.update(name.as_bytes());
        digest.update([0]);
    }
    format!("batch-{}-{}", hex::encode(&digest.finalize()[..16]), names.len())
}

/// A key's tasks always go to the same queue.
pub fn queue_index(rule: &str, key: &str, queues: usize) -> usize {
    let digest = Sha256::digest(format!("{rule}|{key}").as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) % queues.max(1) as u64) as usize
}

/// The header that carries a task's signature: `v2;slot=<ms>;exp=<ms>;sig=<hex HMAC-SHA256>` over
/// the task's name, its slot, its expiry and its body ([`TaskSigner::sign`]).
pub const SIGNATURE_HEADER: &str = "x-drip-signature";

/// Cloud Tasks takes an HTTP task of up to 1 MB (its body, URL and headers): the dispatcher accepts
/// task bodies up to this, the limiter keeps its own under it with room to spare.
pub const MAX_TASK_BYTES: usize = 1_000_000;

/// A task body above this is claim-checked (its data waits in Redis): room under
/// [`MAX_TASK_BYTES`] for the task's URL, headers and own fields.
pub const MAX_INLINE_TASK_BODY: usize = MAX_TASK_BYTES - 32 * 1024;

/// How long a claim-checked payload outlives its task's slot: past every retry of the task (the
/// queues' retry span is hours), whether the limiter made the task or the dispatcher rescheduled it.
pub const CLAIM_CHECK_MARGIN: crate::time::Millis = crate::time::DAY;

/// What a signature binds a body to: a captured body cannot be run under another task name, at
/// another time, or after the queue's retries for it are over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskSeal<'a> {
    /// The task's short name (`X-CloudTasks-TaskName`), which names the message it carries.
    pub name: &'a str,
    /// When it may run: its message's slot.
    pub slot: i64,
    /// After this it is refused: the slot plus the queue's whole retry span.
    pub expires: i64,
}

/// What the dispatcher may believe about a task from its signature header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signature {
    /// Signed by a key the services hold for this name: its slot and expiry can be trusted.
    Sealed { slot: i64, expires: i64 },
    /// The body alone signed with a key the services hold (`sha256=<hex>`, before tasks were
    /// sealed): trusted only while unsigned tasks are (`DRIP_ACCEPT_UNSIGNED_TASKS_UNTIL`).
    BodyOnly,
    /// No signature header.
    Unsigned,
    /// A signature no key of ours made for this name and body.
    Forged,
}

/// Signs and checks tasks with the keys only the limiter and the dispatcher hold, so the
/// dispatcher publishes only what the limiter scheduled, under the task's own name, not before its
/// slot and not after its expiry. It signs with the current key and verifies with it or the
/// previous one, so a key rotation is two ordinary rollouts.
#[derive(Clone)]
pub struct TaskSigner {
    current: Vec<u8>,
    previous: Option<Vec<u8>>,
}

impl fmt::Debug for TaskSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TaskSigner(..)")
    }
}

impl RateLimitMeta {
    /// The rule's id (its name unless the rule sets one).
    pub fn rule_id(&self) -> &str {
        self.rule_id.as_deref().unwrap_or(&self.rule)
    }
}

fn mac(key: &[u8]) -> Hmac<Sha256> {
    <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes keys of any length")
}

fn sealed_mac(key: &[u8], seal: &TaskSeal<'_>, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = mac(key);
    mac.update(format!("drip-task-v2\n{}\n{}\n{}\n", seal.name, seal.slot, seal.expires).as_bytes());
    mac.update(body);
    mac
}

impl TaskSigner {
    pub fn new(key: impl AsRef<[u8]>) -> Self {
        Self { current: key.as_ref().to_vec(), previous: None }
    }

    /// Also accepts what `previous` signed (the key before a rotation).
    pub fn with_previous(self, previous: impl AsRef<[u8]>) -> Self {
        Self { previous: Some(previous.as_ref().to_vec()), ..self }
    }

    fn keys(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(self.current.as_slice()).chain(self.previous.as_deref())
    }

    /// The value of [`SIGNATURE_HEADER`] for the task `seal` names, with `body`.
    pub fn sign(&self, seal: &TaskSeal<'_>, body: &[u8]) -> String {
        let tag = sealed_mac(&self.current, seal, body).finalize().into_bytes();
        format!("v2;slot={};exp={};sig={}", seal.slot, seal.expires, hex::encode(tag))
    }

    /// What `header` (the signature header, if any) says of the task named `name` with `body`;
    /// tags are compared in constant time.
    pub fn verify(&self, header: Option<&str>, name: &str, body: &[u8]) -> Signature {
        let Some(header) = header else { return Signature::Unsigned };
        if let Some(tag) = header.strip_prefix("sha256=") {
            let Ok(tag) = hex::decode(tag) else { return Signature::Forged };
            let mut macs = self.keys().map(|key| {
                let mut mac = mac(key);
                mac.update(body);
                mac
            });
            return match macs.any(|mac| mac.verify_slice(&tag).is_ok()) {
                true => Signature::BodyOnly,
                false => Signature::Forged,
            };
        }
        let Some((slot, expires, tag)) = parse_sealed(header) else { return Signature::Forged };
        let seal = TaskSeal { name, slot, expires };
        match self.keys().any(|key| sealed_mac(key, &seal, body).verify_slice(&tag).is_ok()) {
            true => Signature::Sealed { slot, expires },
            false => Signature::Forged,
        }
    }
}

/// `v2;slot=<ms>;exp=<ms>;sig=<hex>` → (slot, expiry, tag).
fn parse_sealed(header: &str) -> Option<(i64, i64, Vec<u8>)> {
    let mut parts = header.strip_prefix("v2;")?.split(';');
    let slot = parts.next()?.strip_prefix("slot=")?.parse().ok()?;
    let expires = parts.next()?.strip_prefix("exp=")?.parse().ok()?;
    let tag = hex::decode(parts.next()?.strip_prefix("sig=")?).ok()?;
    parts.next().is_none().then_some((slot, expires, tag))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fair_wake_names_its_budget_s_hash_tag_only_where_it_is_not_the_name() {
        let budget = crate::budgets::Budget::fair_named("rail", "rail");
        let own = FairWakeTask::of(crate::budgets::FairRing { budget: &budget, partition: None });
        assert_eq!(own.body(), br#"{"fair_wake":{"budget":"rail"}}"#, "as before");
        assert_eq!(FairWakeTask::parse(&own.body()).unwrap().tag(), "rail");
        let api = crate::budgets::Budget::fair_named("rail", "api");
        let shared = FairWakeTask::of(crate::budgets::FairRing { budget: &api, partition: None });
        let parsed = FairWakeTask::parse(&shared.body()).unwrap();
        assert_eq!((parsed.fair_wake.budget.as_str(), parsed.tag()), ("rail", "api"));
    }

    #[test]
    fn a_leased_fair_budget_s_wake_names_its_partition_and_finds_its_ring_only_while_it_fits() {
        let leased = |partitions| {
            let mut budget = crate::budgets::Budget::fair_named("rail", "rail");
            budget.leases = Some(crate::budgets::Leases { partitions, chunk: 1 });
            budget
        };
        let three = leased(3);
        let wake = FairWakeTask::of(crate::budgets::FairRing { budget: &three, partition: Some(2) });
        assert_eq!(wake.body(), br#"{"fair_wake":{"budget":"rail","partition":2,"partitions":3}}"#);
        let parsed = FairWakeTask::parse(&wake.body()).unwrap();
        assert_eq!(parsed.name(7), "fairwake-rail-p2-at-7", "one wake per partition's ring");
        assert_eq!(parsed.ring_of(&three).map(|r| r.name()), Some("rail@2".to_owned()));
        assert!(parsed.ring_of(&leased(4)).is_none(), "the partitions changed since");
        assert!(parsed.ring_of(&crate::budgets::Budget::fair_named("rail", "rail")).is_none(), "no longer leased");
        assert_eq!(parsed.budget_named().leases.map(|l| l.partitions), Some(3), "a gone budget's ring is found");
        let unleased = FairWakeTask::of(crate::budgets::FairRing { budget: &three, partition: None });
        assert!(unleased.ring_of(&three).is_none(), "a leased budget's rings are its partitions'");
    }

    #[test]
    fn task_names_are_stable_valid_and_distinct() {
        let id = task_id("payouts", "1234@aaaaaaaaaaaa", None);
        assert_eq!(id, task_id("payouts", "1234@aaaaaaaaaaaa", None));
        assert_ne!(id, task_id("payouts", "1234@bbbbbbbbbbbb", None));
        assert_ne!(id, task_id("payouts", "1235@aaaaaaaaaaaa", None));
        assert_ne!(id, task_id("kyc", "1234@aaaaaaaaaaaa", None));
        assert_ne!(id, task_id("payouts", "1234@aaaaaaaaaaaa", Some(1_785_758_400_000)));
        for id in [id, task_id("payouts", "1234@aaaaaaaaaaaa", Some(1_785_758_400_000))] {
            assert!(id.len() <= 500 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
        }
    }

    #[test]
    fn a_key_always_maps_to_one_queue_and_keys_spread() {
        assert_eq!(queue_index("r", "k", 4), queue_index("r", "k", 4));
        let used: std::collections::HashSet<usize> = (0..64).map(|i| queue_index("r", &format!("k{i}"), 4)).collect();
        assert_eq!(used.len(), 4);
    }

    fn body() -> TaskBody {
        TaskBody {
            is_ratelimited: true,
            rate_limit_meta: RateLimitMeta {
                key: "merchant_8421:payout".into(),
                rule: "payouts".into(),
                rule_id: None,
                window_type: "RPM".into(),
                limit: 100,
                scheduled_for: crate::time::parse_rfc3339("2026-08-03T14:02:00.000Z").unwrap(),
                overflow_topic: "payout-events-overflow".into(),
                cost: None,
            },
            payload: TaskPayload::Bytes(Vec::new()),
            attributes: BTreeMap::from([("event_type".into(), "payout".into())]),
            message_id: "m1".into(),
            subscription: None,
            publish_time: None,
        }
    }

    #[test]
    fn a_seal_holds_only_for_its_key_name_slot_expiry_and_body() {
        let signer = TaskSigner::new("k1");
        let seal = TaskSeal { name: "t1", slot: 1_000, expires: 9_000 };
        let header = signer.sign(&seal, b"body");
        assert!(header.starts_with("v2;slot=1000;exp=9000;sig=") && header.len() == 26 + 64, "{header}");
        assert_eq!(signer.verify(Some(&header), "t1", b"body"), Signature::Sealed { slot: 1_000, expires: 9_000 });
        assert_eq!(signer.verify(Some(&header), "t2", b"body"), Signature::Forged, "another task's name");
        assert_eq!(signer.verify(Some(&header), "t1", b"body!"), Signature::Forged, "another body");
        let earlier = header.replace("slot=1000", "slot=0");
        assert_eq!(signer.verify(Some(&earlier), "t1", b"body"), Signature::Forged, "another slot");
        let later = header.replace("exp=9000", "exp=99000");
        assert_eq!(signer.verify(Some(&later), "t1", b"body"), Signature::Forged, "another expiry");
        assert_eq!(TaskSigner::new("k2").verify(Some(&header), "t1", b"body"), Signature::Forged);
        assert_eq!(signer.verify(None, "t1", b"body"), Signature::Unsigned);
        for junk in ["", "v2;", "v2;slot=x;exp=1;sig=00", "sha256=zz", "v2;slot=1;exp=2;sig=00;more"] {
            assert_eq!(signer.verify(Some(junk), "t1", b"body"), Signature::Forged, "{junk}");
        }
    }

    #[test]
    fn a_rotation_verifies_with_either_key_and_signs_with_the_current() {
        let seal = TaskSeal { name: "t1", slot: 1, expires: 2 };
        let old = TaskSigner::new("old").sign(&seal, b"body");
        let rotated = TaskSigner::new("new").with_previous("old");
        assert!(matches!(rotated.verify(Some(&old), "t1", b"body"), Signature::Sealed { .. }));
        let new = rotated.sign(&seal, b"body");
        assert!(matches!(TaskSigner::new("new").verify(Some(&new), "t1", b"body"), Signature::Sealed { .. }));
        assert_eq!(TaskSigner::new("old").verify(Some(&new), "t1", b"body"), Signature::Forged);
    }

    #[test]
    fn a_body_only_signature_of_an_earlier_version_is_recognised_as_such() {
        let mut mac = mac(b"k1");
        mac.update(b"body");
        let header = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
        assert_eq!(TaskSigner::new("k1").verify(Some(&header), "any", b"body"), Signature::BodyOnly);
        assert_eq!(TaskSigner::new("k1").verify(Some(&header), "any", b"other"), Signature::Forged);
    }

    #[test]
    fn json_data_travels_verbatim_in_the_seed_format() {
        let data = br#"{"payoutId": "pay_902184", "amount": 2500.00, "currency": "INR"}"#;
        let json = serde_json::to_string(&TaskBody { payload: TaskPayload::inline(data), ..body() }).unwrap();
        assert!(json.starts_with(r#"{"isRatelimited":true,"rateLimitMeta":{"key":"merchant_8421:payout""#), "{json}");
        assert!(
            json.contains(r#""originalPayload":{"payoutId": "pay_902184", "amount": 2500.00, "currency": "INR"}"#),
            "{json}"
        );
        let back: TaskBody = serde_json::from_str(&json).unwrap();
        assert!(matches!(back.payload, TaskPayload::Json(_)));
        assert_eq!(back.payload.data().unwrap(), data);
    }

    #[test]
    fn other_data_travels_in_base64() {
        let data = b"\x00\xffnot json";
        let json = serde_json::to_string(&TaskBody { payload: TaskPayload::inline(data), ..body() }).unwrap();
        assert!(json.contains(r#""originalPayloadBase64":"AP9ub3QganNvbg==""#), "{json}");
        let back: TaskBody = serde_json::from_str(&json).unwrap();
        assert_eq!(back.payload.data().unwrap(), data);
    }

    #[test]
    fn a_claim_check_travels_as_a_reference_and_has_no_inline_data() {
        let reference = "drip:{payouts|m1}:p:abc";
        let json =
            serde_json::to_string(&TaskBody { payload: TaskPayload::ClaimCheck(reference.into()), ..body() }).unwrap();
        assert!(
            json.contains(r#""claimCheck":"drip:{payouts|m1}:p:abc""#) && !json.contains("originalPayload"),
            "{json}"
        );
        let back: TaskBody = serde_json::from_str(&json).unwrap();
        assert!(matches!(&back.payload, TaskPayload::ClaimCheck(r) if r == reference));
        assert_eq!(back.payload.data(), None);
    }

    #[test]
    fn a_body_with_two_payloads_or_bad_base64_does_not_deserialize() {
        let json = serde_json::to_string(&body()).unwrap();
        let two = json.replacen('{', r#"{"claimCheck":"x","#, 1);
        let error = serde_json::from_str::<TaskBody>(&two).unwrap_err().to_string();
        assert!(error.contains("more than one of"), "{error}");
        let bad = json.replace(r#""originalPayloadBase64":"""#, r#""originalPayloadBase64":"!!""#);
        assert_ne!(bad, json);
        let error = serde_json::from_str::<TaskBody>(&bad).unwrap_err().to_string();
        assert!(error.contains("originalPayloadBase64"), "{error}");
    }
}
