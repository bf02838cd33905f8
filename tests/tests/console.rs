//! The operator console over the real local stack (Redis, the Pub/Sub emulator, the Cloud Tasks
//! stand-in): its pages show the store's figures, its actions change the store through the API's
//! handlers, a form without its token or from another site is refused, and a viewer cannot act.

#[path = "support/console.rs"]
mod console;

use console::{element, start, start_on, token};
use reqwest::StatusCode;

#[tokio::test]
async fn the_pages_show_the_store_s_figures() {
    let c = start(|_| {}).await;
    c.backlog(7).await;
    c.backlog(8).await;
    let report = c.inspect(7).await;
    let (status, key) = c.page(&c.key_path(7)).await;
    assert_eq!(status, StatusCode::OK, "{key}");
    assert_eq!(element(&key, "backlog"), report["backlog"].to_string());
    assert_eq!(report["backlog"], 1);
    assert_eq!(element(&key, "verdict"), "backlogged");
    assert!(element(&key, "drains").starts_with(&format!("at {}", report["drainsAt"].as_str().unwrap())), "{key}");
    assert!(key.contains("<td>2 per 1h (fixed)</td><td>2</td><td>2</td><td>1</td>"), "used 2 of 2, 1 ahead: {key}");
    let waiting = format!("<li>{} · 1 event</li>", report["drainsAt"].as_str().unwrap());
    assert!(key.contains(&waiting), "the waiting payout's slot among its decisions: {key}");

    let feedback = serde_json::json!({"rule": "payouts", "key": "merchant_8", "status": 429});
    let answered = c.http.post(format!("{}/v1/feedback", c.limiter.url)).json(&feedback).send().await.unwrap();
    assert!(answered.status().is_success(), "{answered:?}");

    let (status, rule) = c.page(&format!("/console/rules/{}", c.rule)).await;
    assert_eq!(status, StatusCode::OK, "{rule}");
    for merchant in ["merchant_7", "merchant_8"] {
        assert!(rule.contains(&format!(">{merchant}</a>")), "{merchant} among the busiest keys: {rule}");
    }
    assert!(rule.contains("2 entities with state, all examined"), "{rule}");
    assert_eq!(element(&rule, "waiting"), "2 events over the keys below", "one waiting payout each");
    assert_eq!(element(&rule, "answers"), "1 × 429 in the last 15 minutes");

    c.checks(21).await;
    let (status, kyc) = c.page("/console/rules/kyc").await;
    assert_eq!(status, StatusCode::OK, "{kyc}");
    assert!(kyc.contains(">user_21</a>"), "a key under its budget's tag is found too: {kyc}");
    assert!(kyc.contains("<h3>kyc-api"), "the rule's budget: {kyc}");

    let (status, overview) = c.page("/console").await;
    assert_eq!(status, StatusCode::OK);
    let url = format!("{}/v1/rules/kyc/keys/user_21", c.limiter.url);
    let api: serde_json::Value = c.http.get(url).send().await.unwrap().json().await.unwrap();
    let budget = &api["budgets"][0]["limits"][0];
    assert_eq!((budget["usedNow"].as_u64(), budget["ahead"].as_u64()), (Some(1), Some(1)), "{api}");
    let row =
        format!("<td>kyc-api</td><td>100 per 1h (fixed): {} of 100 now, {} ahead", budget["usedNow"], budget["ahead"]);
    assert!(overview.contains(&row), "{overview}");
    // A rule's row says where its busiest key stands, as the key's own page does: of the two keys
    // with one payout waiting each, either may be listed first, and merchant_8 had a 429.
    let busiest = [7, 8].into_iter().find(|n| overview.contains(&format!(">merchant_{n}</a>"))).expect("a busiest key");
    let verdict = element(&c.page(&c.key_path(busiest)).await.1, "verdict");
    assert!(["backlogged", "paused"].contains(&verdict.as_str()), "{verdict}");
    assert!(overview.contains(&format!(">{}</a>", c.rule)) && overview.contains(&format!(">{verdict}<")), "{overview}");

    let (found, _) = c.page(&format!("/console/rules/{}?key=merchant_8", c.rule)).await;
    assert_eq!(found, StatusCode::SEE_OTHER, "a search opens the key's page");
    let (missing, page) = c.page("/console/rules/no-such-rule").await;
    assert_eq!(missing, StatusCode::NOT_FOUND);
    assert_eq!(element(&page, "message"), "no such rule");
}

#[tokio::test]
async fn a_pause_asks_to_confirm_then_pauses_and_a_resume_lifts_it() {
    let c = start(|_| {}).await;
    let (_, page) = c.page(&c.key_path(3)).await;
    let (csrf, path) = (token(&page), format!("{}/pause", c.key_path(3)));
    let form = [("csrf", csrf.as_str()), ("for", "15m"), ("reason", "partner maintenance")];

    let (status, confirm) = c.post(&path, &form, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(element(&confirm, "question").starts_with("Pause merchant_3 of"), "{confirm}");
    assert!(c.inspect(3).await["pausedUntil"].is_null(), "nothing is done before the confirmation");

    let confirmed = [form.as_slice(), &[("confirm", "yes")]].concat();
    let (status, done) = c.post(&path, &confirmed, None).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    let until = c.inspect(3).await["pausedUntil"].as_str().expect("paused").to_owned();
    assert!(element(&done, "message").contains(&format!("paused key until {until}")), "{done}");
    let (_, page) = c.page(&c.key_path(3)).await;
    assert_eq!(element(&page, "verdict"), "paused");
    assert!(
        page.contains(&format!("paused key until {until}")) && page.contains("partner maintenance"),
        "audited: {page}"
    );

    let resume = [("csrf", csrf.as_str()), ("confirm", "yes")];
    let (status, done) = c.post(&format!("{}/resume", c.key_path(3)), &resume, None).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(c.inspect(3).await["pausedUntil"].is_null());
    assert!(element(&done, "message").contains(&format!("lifted the pause until {until}")), "{done}");
}

#[tokio::test]
async fn an_override_set_in_the_console_is_the_api_s_and_a_bad_one_shows_the_api_s_message() {
    let c = start(|_| {}).await;
    let (_, page) = c.page(&c.key_path(4)).await;
    let csrf = token(&page);
    let set = [("csrf", csrf.as_str()), ("limit", "5/1h"), ("confirm", "yes")];
    let (status, done) = c.post(&format!("{}/set-limit", c.key_path(4)), &set, None).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(c.inspect(4).await["limits"][0]["capacity"], 5);
    let bad = [("csrf", csrf.as_str()), ("limit", "5/1d"), ("confirm", "yes")];
    let (status, refused) = c.post(&format!("{}/set-limit", c.key_path(4)), &bad, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let api = c.http.put(format!("{}/v1/rules/{}/keys/merchant_4/limits", c.limiter.url, c.rule));
    let api: serde_json::Value =
        api.json(&serde_json::json!({"limit": "5/1d"})).send().await.unwrap().json().await.unwrap();
    assert_eq!(element(&refused, "message"), api["error"]["message"].as_str().unwrap(), "the API's own words");
}

#[tokio::test]
async fn a_form_without_its_token_or_from_another_site_is_refused() {
    let c = start(|_| {}).await;
    let (_, page) = c.page(&c.key_path(5)).await;
    let path = format!("{}/pause", c.key_path(5));
    let (status, refused) = c.post(&path, &[("for", "15m"), ("confirm", "yes")], None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(element(&refused, "message").contains("token is missing or stale"), "{refused}");
    let forged = [("csrf", "493000.00ff"), ("for", "15m"), ("confirm", "yes")];
    assert_eq!(c.post(&path, &forged, None).await.0, StatusCode::FORBIDDEN);
    let good = [("csrf", token(&page)), ("for", "15m".into()), ("confirm", "yes".into())];
    let good: Vec<(&str, &str)> = good.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let (status, _) = c.post(&path, &good, Some("https://elsewhere.example")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "another site's post is refused even with a token");
    assert!(c.inspect(5).await["pausedUntil"].is_null(), "none of them paused the key");
}

#[tokio::test]
async fn a_viewer_sees_no_action_and_cannot_act() {
    let c = start(|w| w.console.anonymous = "viewer".into()).await;
    c.backlog(6).await;
    let (status, page) = c.page(&c.key_path(6)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(element(&page, "backlog"), "1");
    assert!(!page.contains("<form method=\"post\""), "no action for a viewer: {page}");
    let (status, refused) =
        c.post(&format!("{}/pause", c.key_path(6)), &[("for", "15m"), ("confirm", "yes")], None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(element(&refused, "message").contains("may view the console, not act in it"), "{refused}");
    assert!(c.inspect(6).await["pausedUntil"].is_null());
}

/// A P-256 key that signs the test's IAP assertions, and its public half as IAP publishes keys.
const IAP_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgUirb0tbydFuA8goO
SStjVM9ZaTAcGkjzM9AiIeL8m4GhRANCAATc4NxOMEAbso+hCRfdaCULyiUTdRos
77xRyjs7FGua4663SunhNVWUTvGS2bNsA4jCqCnIfmMMy4rE5fIkdojS
-----END PRIVATE KEY-----
";
const IAP_JWK: &str = r#"{"keys": [{"kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": "iap-test",
  "x": "3ODcTjBAG7KPoQkX3WglC8olE3UaLO-8Uco7OxRrmuM", "y": "rrdK6eE1VZRO8ZLZs2wDiMKoKch-YwzLisTl8iR2iNI"}]}"#;
const IAP_AUDIENCE: &str = "/projects/123/locations/europe-west1/services/drip-admin";

/// IAP's signed header for `email`, to `audience`.
fn iap_assertion(email: &str, audience: &str) -> String {
    let now = drip_core::time::wall_clock_millis() / 1_000;
    let claims = serde_json::json!({
        "iss": "https://cloud.google.com/iap", "aud": audience, "email": email, "sub": "accounts.google.com:1",
        "iat": now, "exp": now + 600,
    });
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some("iap-test".into());
    let key = jsonwebtoken::EncodingKey::from_ec_pem(IAP_KEY.as_bytes()).unwrap();
    jsonwebtoken::encode(&header, &claims, &key).unwrap()
}

#[tokio::test]
async fn behind_iap_the_signed_header_names_the_caller_and_the_lists_give_the_role() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let jwks = format!("http://{}/jwks", listener.local_addr().unwrap());
    let keys = axum::Router::new().route("/jwks", axum::routing::get(|| async { IAP_JWK }));
    tokio::spawn(async move { axum::serve(listener, keys).await });
    let c = start(|w| {
        w.routes = "admin,console".into();
        w.oidc_audience = Some("https://drip-admin.example".into());
        w.console.iap_audience = Some(IAP_AUDIENCE.into());
        w.console.iap_jwks_url = Some(jwks);
        w.console.operators = "ops@example.com".into();
        w.console.viewers = "support@example.com".into();
    })
    .await;
    let open = async |assertion: Option<String>| {
        let mut request = c.http.get(format!("{}{}", c.limiter.url, c.key_path(9)));
        if let Some(assertion) = assertion {
            request = request.header("x-goog-iap-jwt-assertion", assertion);
        }
        let response = request.send().await.unwrap();
        (response.status(), response.text().await.unwrap())
    };
    assert_eq!(open(None).await.0, StatusCode::UNAUTHORIZED, "no header: not through IAP");
    let (status, page) = open(Some(iap_assertion("ops@example.com", IAP_AUDIENCE))).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("ops@example.com · operator") && page.contains("id=\"pause\""), "{page}");
    let (status, page) = open(Some(iap_assertion("support@example.com", IAP_AUDIENCE))).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("support@example.com · viewer") && !page.contains("<form method=\"post\""), "{page}");
    let (status, page) = open(Some(iap_assertion("someone@example.com", IAP_AUDIENCE))).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(element(&page, "message").contains("neither DRIP_CONSOLE_OPERATORS nor DRIP_CONSOLE_VIEWERS"), "{page}");
    let other_service = "/projects/123/locations/europe-west1/services/other";
    assert_eq!(open(Some(iap_assertion("ops@example.com", other_service))).await.0, StatusCode::UNAUTHORIZED);
    let api = c.http.get(format!("{}/v1/rules/{}/keys/merchant_9", c.limiter.url, c.rule));
    let api = api.header("x-goog-iap-jwt-assertion", iap_assertion("ops@example.com", IAP_AUDIENCE));
    assert_eq!(api.send().await.unwrap().status(), StatusCode::UNAUTHORIZED, "the API still takes ID tokens only");
}

/// A payout with no merchant is dead-lettered; the console's look lists it and changes nothing, a
/// viewer may look but not replay, and an operator's confirmed replay publishes its event again to
/// the source topic, marked as a replay of it.
#[tokio::test]
async fn dead_letters_are_looked_at_and_replayed_from_the_console() {
    let c = start(|_| {}).await;
    c.push("no-merchant", "payout", r#"{"amount":1}"#).await;
    let (dlq, source) = (
        format!("projects/drip-test/subscriptions/{}-dlq", c.prefix),
        format!("projects/drip-test/topics/{}-source", c.prefix),
    );
    let (status, page) = c.page("/console/dead-letters").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains(&format!("<option>{dlq}</option>")), "{page}");
    let csrf = token(&page);
    let form = |mode: &'static str| {
        vec![
            ("csrf", csrf.clone()),
            ("mode", mode.into()),
            ("subscription", dlq.clone()),
            ("topic", source.clone()),
            ("reason", "missing_key_field".into()),
        ]
    };
    let as_pairs = |form: &[(&'static str, String)]| form.iter().map(|(n, v)| (*n, v.clone())).collect::<Vec<_>>();
    let post = async |form: Vec<(&'static str, String)>| {
        let form: Vec<(&str, &str)> = form.iter().map(|(n, v)| (*n, v.as_str())).collect();
        c.post("/console/dead-letters", &form, None).await
    };
    let (status, looked) = post(as_pairs(&form("look"))).await;
    assert_eq!(status, StatusCode::OK, "{looked}");
    assert!(element(&looked, "summary").starts_with("a look: 1 would be replayed"), "{looked}");
    assert!(looked.contains("<td>would replay</td>") && looked.contains("<td>payouts</td>"), "{looked}");
    let (status, confirm) = post(as_pairs(&form("replay"))).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        element(&confirm, "question").starts_with("Replay the dead letters of reason missing_key_field"),
        "{confirm}"
    );
    assert!(c.pubsub.pull(&format!("{}-source", c.prefix), 10).await.is_empty(), "nothing before the confirmation");

    let mut confirmed = as_pairs(&form("replay"));
    confirmed.push(("confirm", "yes".into()));
    let (status, done) = post(confirmed).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(element(&done, "summary").starts_with(&format!("1 replayed to {source}")), "{done}");
    let replayed = c.pubsub.pull_until(&format!("{}-source", c.prefix), 1, std::time::Duration::from_secs(10)).await;
    assert_eq!(replayed.len(), 1);
    assert_eq!(replayed[0].data, br#"{"amount":1}"#);
    assert!(replayed[0].attributes.contains_key("drip-replay-of"), "{:?}", replayed[0].attributes);
}

#[tokio::test]
async fn a_viewer_may_look_at_dead_letters_but_not_replay_them() {
    let c = start(|w| w.console.anonymous = "viewer".into()).await;
    let (_, page) = c.page("/console/dead-letters").await;
    assert!(page.contains("id=\"look\"") && !page.contains("id=\"replay\""), "{page}");
    let dlq = format!("projects/drip-test/subscriptions/{}-dlq", c.prefix);
    let topic = format!("projects/drip-test/topics/{}-source", c.prefix);
    let csrf = token(&page);
    let form =
        [("csrf", csrf.as_str()), ("mode", "replay"), ("subscription", &dlq), ("topic", &topic), ("confirm", "yes")];
    let (status, refused) = c.post("/console/dead-letters", &form, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    let elsewhere =
        [("csrf", csrf.as_str()), ("mode", "look"), ("subscription", "projects/drip-test/subscriptions/other")];
    let (status, refused) = c.post("/console/dead-letters", &elsewhere, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(element(&refused, "message").contains("not among DRIP_CONSOLE_DLQ_SUBSCRIPTIONS"), "{refused}");
}

/// On a Redis Cluster the busiest keys are not listed (a scan reaches one node per call): the rule's
/// page says so and offers the search, and a key's page shows its figures as on one Redis.
#[tokio::test]
async fn on_a_cluster_the_rule_s_page_says_to_search_and_a_key_s_page_works() {
    let cluster = drip_tests::redis_server::RedisCluster::start();
    let c = start_on(cluster.urls()[0].clone(), |w| w.redis_cluster = true).await;
    c.backlog(31).await;
    let (status, rule) = c.page("/console/rules/payouts").await;
    assert_eq!(status, StatusCode::OK, "{rule}");
    assert!(rule.contains("not listed on a Redis Cluster: search for a key by name"), "{rule}");
    let (_, overview) = c.page("/console").await;
    assert!(overview.contains(">unknown<") && !overview.contains(">idle<"), "not idle, unknown: {overview}");
    let (status, key) = c.page(&c.key_path(31)).await;
    assert_eq!(status, StatusCode::OK, "{key}");
    assert_eq!(element(&key, "backlog"), "1");
    assert_eq!(element(&key, "verdict"), "backlogged");
}
