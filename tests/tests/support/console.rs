//! The operator console over the real local stack, shared by its handler tests and its browser
//! test: a limiter with one rule of 2 payouts an hour, and helpers that read its pages.
#![allow(dead_code)] // each test file uses its own part

use drip_tests::pubsub_emulator::Pubsub;
use drip_tests::redis_server::shared_url;
use drip_tests::stack::{LimiterUnderTest, LimiterWiring, RecordingTarget, TasksStandIn, spawn_limiter};
use drip_tests::unique;
use reqwest::StatusCode;

const RULES: &str = r#"
default_dlq_topic: {p}-dlq
budgets:
  kyc-api:
    limits: [{ limit: 100, per: 1h }]
rules:
  - name: payouts
    match: { attributes: { event_type: payout } }
    key: "merchant_{data.merchant_id}"
    limits: [{ limit: 2, per: 1h }]
    max_delay: 3h
    inline_wait: 0s
    forward: { topic: {p}-ready }
    overflow_topic: {p}-overflow
    dlq_topic: {p}-dlq
  - name: kyc
    match: { attributes: { event_type: kyc } }
    key: "user_{data.user}"
    limits: [{ limit: 1, per: 1h }]
    budgets: [kyc-api]
    max_delay: 3h
    inline_wait: 0s
    forward: { topic: {p}-ready }
    overflow_topic: {p}-overflow
    dlq_topic: {p}-dlq
"#;

pub struct Console {
    /// The prefix of its topics (each has a subscription of the same name).
    pub prefix: String,
    pub pubsub: Pubsub,
    pub rule: String,
    pub limiter: LimiterUnderTest,
    pub http: reqwest::Client,
    _tasks: TasksStandIn,
    _receiver: RecordingTarget,
}

/// A console on the shared Redis's database 9. The overview finds each rule's busiest key by a
/// bounded `SCAN` (about 20,000 keys), which in the database the other tests fill may not reach
/// this limiter's keys: the rule then reads "idle", its busiest key unknown.
pub async fn start(tune: impl FnOnce(&mut LimiterWiring)) -> Console {
    let url = shared_url();
    let server = url.strip_prefix("redis://").and_then(|rest| rest.split('/').next()).expect("a redis:// URL");
    start_on(format!("redis://{server}/9"), tune).await
}

/// The same on the Redis at `redis_url`.
pub async fn start_on(redis_url: String, tune: impl FnOnce(&mut LimiterWiring)) -> Console {
    let prefix = unique("con");
    let pubsub = Pubsub::shared();
    for topic in ["ready", "overflow", "dlq", "source"] {
        pubsub.topic_with_subscription(&format!("{prefix}-{topic}")).await;
    }
    let (tasks, receiver) = (TasksStandIn::start().await, RecordingTarget::start().await);
    let mut wiring = LimiterWiring::new(
        redis_url,
        pubsub.host.clone(),
        &tasks,
        tasks.queues(&prefix, 1),
        format!("{}/dispatch", receiver.url),
    );
    wiring.console.dlq_subscriptions = format!("{prefix}-dlq");
    wiring.console.replay_topics = format!("{prefix}-source");
    tune(&mut wiring);
    let limiter = spawn_limiter(&RULES.replace("{p}", &prefix), &wiring).await;
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    // Each limiter has a namespace of its own: its rule may have a plain name.
    Console { prefix, pubsub, rule: "payouts".into(), limiter, http, _tasks: tasks, _receiver: receiver }
}

impl Console {
    /// Three payouts of one merchant under 2 an hour: two forwarded, one waiting in a task.
    pub async fn backlog(&self, merchant: u32) {
        for id in ["a", "b", "c"] {
            self.push(&format!("{merchant}-{id}"), "payout", &format!(r#"{{"merchant_id":{merchant}}}"#)).await;
        }
    }

    /// Two checks of one user under 1 an hour, drawing from the budget `kyc-api`: one waits.
    pub async fn checks(&self, user: u32) {
        for id in ["a", "b"] {
            self.push(&format!("u{user}-{id}"), "kyc", &format!(r#"{{"user":{user}}}"#)).await;
        }
    }

    pub async fn push(&self, id: &str, event_type: &str, data: &str) {
        let body = drip_tests::push_envelope(
            id,
            "projects/drip-test/subscriptions/source",
            drip_tests::publish_time(),
            &[("event_type", event_type)],
            data.as_bytes(),
        );
        let pushed = self.http.post(format!("{}/push", self.limiter.url)).body(body).send().await.unwrap();
        assert_eq!(pushed.status(), StatusCode::NO_CONTENT);
    }

    pub async fn page(&self, path: &str) -> (StatusCode, String) {
        let response = self.http.get(format!("{}{path}", self.limiter.url)).send().await.unwrap();
        (response.status(), response.text().await.unwrap())
    }

    pub fn key_path(&self, merchant: u32) -> String {
        format!("/console/rules/{}/keys/merchant_{merchant}", self.rule)
    }

    pub async fn post(&self, path: &str, form: &[(&str, &str)], origin: Option<&str>) -> (StatusCode, String) {
        let mut request = self.http.post(format!("{}{path}", self.limiter.url)).form(form);
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        let response = request.send().await.unwrap();
        (response.status(), response.text().await.unwrap())
    }

    pub async fn inspect(&self, merchant: u32) -> serde_json::Value {
        let url = format!("{}/v1/rules/{}/keys/merchant_{merchant}", self.limiter.url, self.rule);
        self.http.get(url).send().await.unwrap().json().await.unwrap()
    }
}

/// The text between `id="<id>">` and the next `<`, as a browser shows it.
pub fn element(html: &str, id: &str) -> String {
    let marker = format!("id=\"{id}\">");
    let start = html.find(&marker).unwrap_or_else(|| panic!("no #{id} in {html}")) + marker.len();
    let text = html[start..].split('<').next().unwrap();
    [("&#39;", "'"), ("&quot;", "\""), ("&lt;", "<"), ("&gt;", ">"), ("&#43;", "+"), ("&amp;", "&")]
        .iter()
        .fold(text.to_owned(), |text, (entity, c)| text.replace(entity, c))
}

/// The form token a page's forms carry.
pub fn token(html: &str) -> String {
    let marker = "name=\"csrf\" value=\"";
    let start = html.find(marker).expect("a form with its token") + marker.len();
    html[start..].split('"').next().unwrap().to_owned()
}
