//! Payloads too large for a Cloud Task wait in Redis, under the entity's hash tag, until the
//! dispatcher fetches them by the reference the task carries.

use drip_core::time::Millis;
use redis::AsyncCommands;
use redis::aio::ConnectionLike;

use crate::StoreError;

/// The claim-check key of one message: `<namespace>:{rule|key}:payload:<message id>`.
pub fn claim_check_key(namespace: &str, rule: &str, key: &str, message_id: &str) -> String {
    format!("{}:payload:{message_id}", crate::keys::entity_prefix(namespace, rule, key))
}

/// Stores the payload for `ttl` (idempotent: a redelivery stores the same bytes again).
pub async fn put<C: ConnectionLike + Send + Sync>(
    connection: &mut C,
    reference: &str,
    payload: &[u8],
    ttl: Millis,
) -> Result<(), StoreError> {
    let _: () = connection.pset_ex(reference, payload, ttl.max(1) as u64).await?;
    Ok(())
}

/// The payload, or `None` when it expired or never existed.
pub async fn get<C: ConnectionLike + Send + Sync>(
    connection: &mut C,
    reference: &str,
) -> Result<Option<Vec<u8>>, StoreError> {
    Ok(connection.get(reference).await?)
}
