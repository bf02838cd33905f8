//! Publishing the burst: the payouts, spread over the merchants, as fast as the emulator takes them.

use std::collections::{BTreeMap, HashMap};

use drip_core::time::wall_clock_millis;
use pubsub_emulator_client::EmulatorClient;

use crate::*;

/// The `i`th payout of a burst, for `merchant`: the data and attributes the shipped examples'
/// payout rules match and key (`event_type: payout`, `data.merchant_id`).
pub(crate) fn payout(i: usize, merchant: &str) -> (Vec<u8>, BTreeMap<String, String>) {
    let data = serde_json::json!({
        "payoutId": format!("pay_{:06}", 902_184 + i),
        "merchant_id": merchant,
        "amount": 100 + (i * 37) % 5_000,
        "currency": "INR",
        "beneficiary": {"ifsc": "HDFC0000123", "account": format!("XXXXXX{:04}", i % 10_000)},
    });
    (data.to_string().into_bytes(), BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]))
}

/// Publishes `args.events` payouts over `args.keys` merchants, in batches of 100, as fast as the
/// emulator takes them.
pub(crate) async fn publish_burst(args: &Args, pubsub: &EmulatorClient) -> anyhow::Result<Burst> {
    let merchants: Vec<String> = (1..=args.keys).map(|k| format!("m{k:03}")).collect();
    let mut burst =
        Burst { merchant_of: HashMap::new(), published_at: HashMap::new(), started: wall_clock_millis(), merchants };
    let mut batch = Vec::new();
    for i in 0..args.events {
        batch.push(payout(i, &burst.merchants[i % burst.merchants.len()]));
        if batch.len() == 100 || i + 1 == args.events {
            let sent = wall_clock_millis();
            let ids = pubsub.publish_batch(SOURCE, &batch).await?;
            let first = i + 1 - batch.len();
            for (offset, id) in ids.into_iter().enumerate() {
                burst.merchant_of.insert(id.clone(), burst.merchants[(first + offset) % burst.merchants.len()].clone());
                burst.published_at.insert(id, sent);
            }
            batch.clear();
        }
    }
    Ok(burst)
}
