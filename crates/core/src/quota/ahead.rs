//! Standing grants on the windows of accounts far below their per-minute caps, and the
//! leases' clocks (the start time pushed back, the lots read for the tier hint), done with
//! plain commands instead of `lease.lua`.
//!
//! The common renewal of an account sending a request every few seconds asks for nothing but
//! the per-minute capacity of the minutes ahead (`lease::Call::plain`). In a script that
//! renewal costs Redis several times what its commands do (its Lua reads and writes the
//! account too), and counted in each minute's window it would come every minute for every
//! such account. Here a standing grant (`lease::Grant`: the capacity of each of the next
//! `GRANT_MINUTES`) is written first into the scope's grants hash, where every count of those
//! minutes finds it (`account.lua`'s `grant_counts`), then the previous, this and the next
//! minute's windows and the grants are read, all the accounts of a round in one pipeline; the
//! counts it returned are checked against the rule `lease.lua` applies to a chunk taken ahead
//! (the sliding count, the grant included, within half the cap), and a grant that broke it is
//! put back to what it was (or to the minutes already in use). The account's drain mark is not
//! read here: an account this instance has heard is drained (by notice or poll, within a
//! round) renews through the script, which answers in exact mode and ends the grant; a grant
//! written in the moment before the notice is heard only makes the windows count more for that
//! moment, never less. A window therefore never counts less than what was admitted in it: for
//! a moment it may count a grant that is then cut back, which is why only grants far below
//! their caps come this way (`GRANT_CAP_RATIO`).
//!
//! A lease's start time is pushed back with `ZADD XX` (a lease the sweep released in the
//! meantime is not made to look held), and the lots are read with `HGETALL` for the highest
//! tier among those still running with something left, as the script's read does (expired
//! lots are left for the script to drop). Either costs Redis one command where a script call
//! for the account costs it dozens of µs.

use redis::Value as RedisValue;

use super::lease::{AheadAsk, Call, Grant, PlainAnswer, GRANT_MINUTES};
use super::scripts::{as_i64, as_string};
use super::shared::{Shared, Unreachable};
use super::tiers::running_tier;
use crate::domain::Tier;

/// How long (s) a grants hash lives after a grant is written: past the end of every grant in
/// it (each written at most `GRANT_MINUTES` + 1 minutes ahead, none later than this one).
/// `lease.lua` gives the same (780 s) when it cuts a grant back.
const GRANTS_TTL_S: i64 = (GRANT_MINUTES + 3) * 60;
const FIELDS: [&str; 3] = ["r", "i", "o"];

impl Shared {
    /// Does the plain renewals `calls` (each `Call::plain`) in a round trip of their own and
    /// hands each account its answer (`renew_batch` sends them with the round's script call
    /// instead).
    pub(super) async fn take_ahead(&self, calls: &[(&str, &Call)]) {
        let mut pipe = redis::pipe();
        self.ahead_commands(&mut pipe, calls);
        let replies = if self.breaker.is_open() {
            Err(Unreachable("redis is down".into()))
        } else {
            self.round_trip("ahead", &pipe).await
        };
        self.finish_ahead(calls, replies).await;
    }

    /// Adds to `pipe` the commands of the plain renewals `calls`: every chunk counted, start
    /// times pushed back, lots read. Their replies, in order, are `finish_ahead`'s.
    pub(super) fn ahead_commands(&self, pipe: &mut redis::Pipeline, calls: &[(&str, &Call)]) {
        for (_, call) in calls {
            let only = call.plain.as_ref();
            if only.is_some_and(|o| o.push) {
                // CH: 1 when the start time moved, 0 when there was none to move.
                pipe.cmd("ZADD")
                    .arg(call.start_times())
                    .arg("XX")
                    .arg("CH")
                    .arg(call.now)
                    .arg(&self.leases.id);
            }
            if only.is_some_and(|o| o.lots) {
                pipe.cmd("HGETALL").arg(call.lots());
            }
            for ask in asks(call) {
                let grants = call.window(ask.grants);
                // Written first, read after: a request admitted this minute before the write
                // is in what is read, one admitted after it found the grant.
                pipe.cmd("HSET")
                    .arg(grants)
                    .arg(&self.leases.id)
                    .arg(ask.grant.value());
                pipe.cmd("EXPIRE").arg(grants).arg(GRANTS_TTL_S);
                for window in ask.windows {
                    pipe.cmd("HMGET").arg(call.window(window)).arg(&FIELDS);
                }
                pipe.cmd("HVALS").arg(grants);
            }
        }
    }

    /// Reads the plain renewals' replies (`ahead_commands`'), gives back the chunks the rule
    /// refuses and hands each account its answer. When Redis did not answer, or answered any
    /// command with an error, no chunk is taken (a count that did land errs high), the tier hint
    /// stays, and the start time is pushed back at a later round.
    pub(super) async fn finish_ahead(
        &self,
        calls: &[(&str, &Call)],
        replies: Result<Vec<RedisValue>, Unreachable>,
    ) {
        // `round_trip` fails on any error reply but a lost script's, and no script is here.
        let taken = replies.map(|replies| self.read_ahead(calls, replies.into_iter()));
        let taken = match taken {
            Ok((answers, follow_up)) => {
                if let Some(follow_up) = follow_up {
                    // Not given back when Redis fails now: the windows then err high, never
                    // low.
                    let mut conn = self.conn();
                    let _ = self
                        .guarded("ahead", follow_up.query_async::<()>(&mut conn))
                        .await;
                }
                answers
            }
            Err(Unreachable(e)) => {
                log::warn!("{e}; next-minute chunks of {} accounts", calls.len());
                calls
                    .iter()
                    .map(|(_, call)| PlainAnswer {
                        grants: vec![None; asks(call).len()],
                        ..PlainAnswer::default()
                    })
                    .collect()
            }
        };
        for ((user_id, call), answer) in calls.iter().zip(taken) {
            if let Some(top) = answer.top {
                if let Some(mut hint) = self.hints.get_mut(*user_id) {
                    hint.1 = top;
                }
            }
            self.leases.finish_ahead(user_id, call, &answer);
        }
    }

    /// Each plain renewal's answer from its replies, checked against the rule, and the
    /// pipeline putting back the grants it refuses (if any).
    fn read_ahead(
        &self,
        calls: &[(&str, &Call)],
        mut replies: impl Iterator<Item = RedisValue>,
    ) -> (Vec<PlainAnswer>, Option<redis::Pipeline>) {
        let mut next = || replies.next().unwrap_or(RedisValue::Nil);
        let num = |v: &RedisValue| as_i64(v).unwrap_or(0).max(0) as u64;
        let mut follow_up = redis::pipe();
        let mut any_follow_up = false;
        let mut out = Vec::with_capacity(calls.len());
        for (_, call) in calls {
            let only = call.plain.as_ref();
            let lease_gone = only.is_some_and(|o| o.push) && as_i64(&next()) == Some(0);
            let top = only
                .is_some_and(|o| o.lots)
                .then(|| top_tier(&next(), call.now));
            let minute = call.now.div_euclid(60_000);
            let elapsed = call.now.rem_euclid(60_000) as u64;
            let mut grants = Vec::new();
            for ask in asks(call) {
                next(); // HSET
                next(); // EXPIRE
                let mut read = || match next() {
                    RedisValue::Array(a) => a.iter().map(num).collect(),
                    _ => vec![0; 3],
                };
                let windows: [Vec<u64>; 3] = [read(), read(), read()];
                let granted = grant_counts(&next(), minute);
                let ok = (0..3).all(|d| {
                    let count = |k: usize| windows[k].get(d).copied().unwrap_or(0) + granted[k][d];
                    let sliding = count(0) * (60_000 - elapsed) / 60_000 + count(1) + count(2);
                    ask.caps[d] == 0 || 2 * sliding <= ask.caps[d]
                });
                if ok {
                    grants.push(Some(ask.grant));
                    continue;
                }
                any_follow_up = true;
                // `kept` covers at least the previous and this minute: never empty.
                follow_up
                    .cmd("HSET")
                    .arg(call.window(ask.grants))
                    .arg(&self.leases.id)
                    .arg(ask.kept.value())
                    .ignore();
                grants.push(Some(ask.kept));
            }
            out.push(PlainAnswer {
                grants,
                top,
                lease_gone,
            });
        }
        (out, any_follow_up.then_some(follow_up))
    }
}

/// The grants (`HVALS`'s reply, values "from,to,r,i,o") covering the minutes `minute` - 1,
/// `minute` and `minute` + 1, summed per minute: what `account.lua`'s `grant_counts` adds to
/// each minute's count.
fn grant_counts(values: &RedisValue, minute: i64) -> [[u64; 3]; 3] {
    let mut sums = [[0u64; 3]; 3];
    let RedisValue::Array(values) = values else {
        return sums;
    };
    for grant in values.iter().filter_map(|v| Grant::parse(&as_string(v)?)) {
        for (k, sum) in sums.iter_mut().enumerate() {
            if grant.covers(minute - 1 + k as i64) {
                for (sum, granted) in sum.iter_mut().zip(grant.dims) {
                    *sum += granted;
                }
            }
        }
    }
    sums
}

fn asks(call: &Call) -> &[AheadAsk] {
    call.plain.as_ref().map_or(&[], |o| &o.asks[..])
}

/// The highest tier among the lots (`HGETALL`'s reply, values "kind,left,expires_ms,tier")
/// still running at `now` with something left (`tiers::running_tier`, the rule
/// `account.lua`'s `top_tier` applies too).
fn top_tier(lots: &RedisValue, now: i64) -> Option<Tier> {
    let values: Vec<&RedisValue> = match lots {
        RedisValue::Array(fields) => fields.iter().skip(1).step_by(2).collect(),
        RedisValue::Map(pairs) => pairs.iter().map(|(_, v)| v).collect(),
        _ => return None,
    };
    let lots = values.into_iter().filter_map(|v| {
        let v = as_string(v)?;
        let mut parts = v.split(',').skip(1);
        let left: u64 = parts.next()?.parse().ok()?;
        let expires: i64 = parts.next()?.parse().ok()?;
        let tier: i64 = parts.next()?.parse().ok()?;
        Some((left, expires, Tier::from_index(tier)))
    });
    running_tier(lots, now)
}

#[cfg(test)]
mod tests {
    use redis::Value as RedisValue;

    use super::top_tier;
    use crate::domain::Tier;

    fn lots(values: &[&str]) -> RedisValue {
        RedisValue::Array(
            values
                .iter()
                .enumerate()
                .flat_map(|(i, v)| {
                    [
                        RedisValue::BulkString(format!("lot{i}").into_bytes()),
                        RedisValue::BulkString(v.as_bytes().to_vec()),
                    ]
                })
                .collect(),
        )
    }

    #[test]
    fn the_top_tier_counts_only_running_lots_with_something_left() {
        let now = 1_000;
        assert_eq!(top_tier(&lots(&[]), now), None);
        assert_eq!(top_tier(&lots(&["t,5,2000,0"]), now), Some(Tier::ALL[0]));
        // Expired, used up, or no tier (-1): none of them counts.
        assert_eq!(
            top_tier(&lots(&["t,5,1000,2", "r,0,2000,2", "t,9,2000,-1"]), now),
            None
        );
        assert_eq!(
            top_tier(&lots(&["t,5,2000,0", "r,1,3000,2", "t,5,900,3"]), now),
            Some(Tier::ALL[2])
        );
        assert_eq!(top_tier(&RedisValue::Nil, now), None);
    }
}
