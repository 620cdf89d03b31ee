//! Attempt counters shared by every instance (database rows keyed by a bucket name and a fixed
//! window): code requests per address and client, key rotations (hourly), wrong second-factor
//! codes (`twofactor::budget`).

use gateway_core::state::AppState;
use gateway_core::storage::StoreResult;
use gateway_core::util::now_ms;

/// The hourly counters' fixed window; two of them make the sliding hour.
pub const WINDOW_MS: i64 = 3_600_000;

/// One hit, counted: the window it went into (to give it back) and the sliding-window count
/// with it included.
#[derive(Debug, Clone, Copy)]
pub struct Hit {
    pub window_start: i64,
    pub count: i64,
}

/// Adds one hit to `bucket` and says how many it has had in the last `window_ms`: a sliding
/// estimate from two fixed windows of a database counter (shared by every instance), the
/// previous window's count weighted by how much of it still overlaps the sliding one (rounded
/// up, so hits just before a window turns still count whole), plus the current window's.
pub async fn hit(state: &AppState, bucket: &str, window_ms: i64) -> StoreResult<Hit> {
    let now = now_ms();
    let store = state.db.auth();
    let start = now - now.rem_euclid(window_ms);
    let current = store.hit(bucket, start).await?;
    let previous = store.hits(bucket, start - window_ms).await?;
    let overlap = window_ms - (now - start);
    Ok(Hit {
        window_start: start,
        count: previous
            .saturating_mul(overlap)
            .saturating_add(window_ms - 1)
            / window_ms
            + current,
    })
}

/// Takes back a hit that should not count (what it guarded turned out fine).
pub async fn give_back(state: &AppState, bucket: &str, hit: Hit) -> StoreResult<()> {
    state.db.auth().unhit(bucket, hit.window_start).await
}

/// Adds one hit to `bucket` and reports whether it went over `limit` in the last hour.
pub async fn over_limit(state: &AppState, bucket: &str, limit: i64) -> StoreResult<bool> {
    Ok(hit(state, bucket, WINDOW_MS).await?.count > limit)
}
