//! Per-minute limits with a sliding-window counter.
//!
//! Semantics (documented in docs/developer-api.md): the count for a limit is
//! `previous_minute * (1 - elapsed_fraction) + current_minute`, the approximation of a true
//! 60-second sliding window that Cloudflare and others use. A request is admitted when its cost
//! fits under the limit; a single request costing more than the whole limit is admitted only
//! into an empty window (so an oversized request is slowed, never refused forever). Output tokens
//! are charged at admission with the reserved amount and corrected to the real amount at
//! settlement. The Redis engine runs the same arithmetic in Lua.

pub const WINDOW_MS: i64 = 60_000;

/// One limit dimension's view at an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowView {
    pub limit: u64,
    pub remaining: u64,
    /// Seconds until the current minute ends.
    pub reset_secs: u64,
}

/// The sliding count for `prev` and `curr` at `now_ms`.
pub fn sliding_count(prev: u64, curr: u64, now_ms: i64) -> u64 {
    let elapsed = now_ms.rem_euclid(WINDOW_MS) as u128;
    let carried = (prev as u128) * (WINDOW_MS as u128 - elapsed) / WINDOW_MS as u128;
    (carried as u64).saturating_add(curr)
}

/// Whether `cost` fits, and if not, how many whole seconds until it would.
pub fn check(limit: u64, prev: u64, curr: u64, cost: u64, now_ms: i64) -> Result<(), u64> {
    if limit == 0 {
        return Ok(());
    }
    let count = sliding_count(prev, curr, now_ms);
    let cost = cost.min(limit);
    if count + cost <= limit {
        return Ok(());
    }
    let into = now_ms.rem_euclid(WINDOW_MS);
    let left_in_minute = (WINDOW_MS - into) as u64;
    let need = count + cost - limit;
    // Within this minute only the previous minute's share decays, at prev/60000 per ms.
    let wait_ms = if prev > 0 && need <= sliding_count(prev, 0, now_ms) {
        (need as u128 * WINDOW_MS as u128).div_ceil(prev as u128) as u64
    } else {
        // Needs the current minute to roll over (and perhaps decay after that).
        left_in_minute
            + if curr + cost > limit {
                WINDOW_MS as u64 / 2
            } else {
                0
            }
    };
    Err(wait_ms.div_ceil(1000).max(1))
}

pub fn view(limit: u64, prev: u64, curr: u64, now_ms: i64) -> WindowView {
    let count = sliding_count(prev, curr, now_ms);
    let into = now_ms.rem_euclid(WINDOW_MS);
    WindowView {
        limit,
        remaining: limit.saturating_sub(count),
        reset_secs: ((WINDOW_MS - into) as u64).div_ceil(1000),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sliding() {
        assert_eq!(sliding_count(60, 0, 0), 60);
        assert_eq!(sliding_count(60, 0, 30_000), 30);
        assert_eq!(sliding_count(60, 5, 45_000), 20);
    }

    #[test]
    fn admits_until_full_then_waits() {
        assert!(check(10, 0, 9, 1, 1_000).is_ok());
        let wait = check(10, 0, 10, 1, 1_000).unwrap_err();
        assert!(wait >= 59, "{wait}");
        // Previous minute full, 30 s in: half of it still counts.
        let wait = check(10, 10, 0, 6, 30_000).unwrap_err();
        assert!((1..=6).contains(&wait), "{wait}");
        assert!(check(0, 100, 100, 100, 0).is_ok(), "0 = no limit");
        // Oversized single request fits an empty window.
        assert!(check(10, 0, 0, 50, 0).is_ok());
        assert!(check(10, 0, 1, 50, 0).is_err());
    }
}
