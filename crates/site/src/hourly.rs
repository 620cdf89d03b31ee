//! Hourly attempt counters shared by every instance (database rows keyed by a bucket name):
//! code requests per address and client, key rotations, two-factor guesses.

use gateway_core::state::AppState;
use gateway_core::storage::StoreResult;
use gateway_core::util::now_ms;

/// The counters' fixed window; two of them make the sliding hour.
pub const WINDOW_MS: i64 = 3_600_000;

/// Adds one hit to `bucket` and reports whether it went over `limit` in the last hour: a
/// sliding-hour estimate from two fixed windows of a database counter (shared by every
/// instance), the previous window's count weighted by how much of it still overlaps the last
/// hour, plus the current window's.
pub async fn over_limit(state: &AppState, bucket: &str, limit: i64) -> StoreResult<bool> {
    let now = now_ms();
    let store = state.db.auth();
    let start = now - now.rem_euclid(WINDOW_MS);
    let current = store.hit(bucket, start).await?;
    let previous = store.hits(bucket, start - WINDOW_MS).await?;
    let overlap = WINDOW_MS - (now - start);
    Ok(previous * overlap / WINDOW_MS + current > limit)
}
