//! The contract between the Rust encoder and reserve.lua, pinned: the keys and arguments of one
//! rich call (two events: a fixed, a sliding and a gcra limit with a floor, a delivery margin and
//! an adaptive level, and a fair shared budget with a fair share, its own adaptive level and floors
//! for two rules: its near horizon, ring key and ring member). A change to
//! the contract shows as a diff of `golden/reserve_args.txt`; `DRIP_BLESS=1` rewrites it.

use drip_core::rules::{RuleSet, ServiceRules};
use drip_core::schedule::ReserveRequest;
use drip_store::{RedisStore, SlotRequest};

const RULES: &str = r#"
default_dlq_topic: dlq
budgets:
  partner:
    limits: [ { limit: 100, per: 1s, placement: spread } ]
    max_share: 0.25
    adaptive: { margin: 0.1, decrease: 0.5, min: 0.2 }
    floors: { payouts: 0.2, refunds: 0.1 }
    fair: true
    weights: { merchant_7: 2 }
rules:
  - name: payouts
    match: { attributes: { event_type: payout } }
    key: "merchant_{attributes.merchant}"
    limits:
      - { limit: 10, per: 1s }
      - { limit: 100, per: 1m, window: sliding }
      - { limit: 5, per: 1s, window: gcra, burst: 3 }
    budgets: [partner]
    adaptive: { margin: 0.1, decrease: 0.8, min: 0.25 }
    delivery_margin: 100ms
    max_delay: 1h
    forward: { topic: ready }
    overflow_topic: overflow
  - name: refunds
    match: { attributes: { event_type: refund } }
    key: "merchant_{attributes.merchant}"
    limits: [ { limit: 10, per: 1s } ]
    budgets: [partner]
    max_delay: 1h
    forward: { topic: ready }
    overflow_topic: overflow
"#;

#[test]
fn the_arguments_of_a_rich_call_are_pinned() {
    let rules = ServiceRules::new(RuleSet::parse("golden.yaml", RULES).unwrap(), "golden.yaml").unwrap();
    let rule = rules.rule("payouts").unwrap();
    let store = RedisStore::new((), "drip");
    let now = 1_800_000_000_123;
    let mut first = SlotRequest::for_rule(rule, "merchant_7", "m1", 2).at(now).published(Some(now));
    first.event = ReserveRequest { lease: 15_000, floor: Some(now + 2_000), ..first.event };
    let first = first.keeping_if_parked(b"{\"body\":1}");
    let second = SlotRequest {
        reslot: Some(drip_core::schedule::OldSlot::GivenBack),
        ..SlotRequest::for_rule(rule, "merchant_8", "m2", 1).at(now)
    };
    let call = store.reserve_batch_call(&[first, second]);
    let (keys, args) = call.described();
    let mut lines: Vec<String> = keys.iter().map(|key| format!("key = {key:?}")).collect();
    for (name, value) in &args {
        lines.push(match std::str::from_utf8(value) {
            Ok(text) => format!("{name} = {text:?}"),
            Err(_) => format!("{name} = 0x{}", hex(value)),
        });
    }
    // The command sends exactly these, in this order (after the script's SHA and the key count).
    let sent: Vec<Vec<u8>> = call
        .cmd()
        .args_iter()
        .skip(3)
        .filter_map(|arg| if let redis::Arg::Simple(bytes) = arg { Some(bytes.to_vec()) } else { None })
        .collect();
    let described: Vec<Vec<u8>> =
        keys.iter().map(|k| k.as_bytes().to_vec()).chain(args.iter().map(|(_, v)| v.clone())).collect();
    assert_eq!(sent, described, "the names describe what is sent");
    let text = lines.join("\n") + "\n";
    let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/reserve_args.txt");
    if std::env::var_os("DRIP_BLESS").is_some() {
        std::fs::write(golden, &text).unwrap();
    }
    let pinned = std::fs::read_to_string(golden).expect("golden/reserve_args.txt (DRIP_BLESS=1 writes it)");
    assert_eq!(text, pinned, "the reserve.lua contract changed: check the Lua reads it so, then DRIP_BLESS=1");
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
