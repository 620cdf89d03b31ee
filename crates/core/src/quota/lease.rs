//! Leases: admission without a Redis round trip in the common case.
//!
//! Each instance holds, per account it serves, a lease: a reservation in Redis (id
//! `L:<instance>`) carved atomically out of the account's balance, plus a chunk of each
//! per-minute window the account's keys count in. Requests are admitted and settled here
//! against it; every `FLUSH_EVERY` the accounts with something to do get one `lease.lua` run
//! each, which pays what was settled as one sum (split back per settlement in order, allowance
//! first then lots, as paying each with `settle.lua` would: see `Paid`), gives back what is
//! not needed and carves the next share. Settling never waits: the request's usage event is
//! recorded once its share is known. On one Redis the round's accounts share one script call
//! (`lease_batch.lua`); on a cluster each account is its own call, all sent together.
//!
//! While the weekly allowance alone covers what a lease keeps, the lease is set aside from the
//! allowance rather than reserved (`aside`): no other request can pay from that part, so a
//! request settled within it is paid by the allowance, known here at once. Its usage event is
//! recorded then, and its cost waits for the lease's next script call (when it runs short,
//! idles or has not booked for a reservation timeout), which books the sum: an account at a
//! request every few seconds costs Redis a renewal every few requests instead of one per
//! request.
//!
//! Redis work follows the account's own traffic, not the clock: a lease is touched only when
//! settlements outside a set-aside share wait to be paid, when it is short (a request did not
//! fit, or fewer than a quarter of the requests it is sized for are left: at the next clock
//! round while that covers `TOP_UP_WAITS_MS` of its traffic), when it has been idle
//! `IDLE_MS` (given back), when it nears the reservation timeout (its start time is pushed
//! back, or the sweep would release it: one plain `ZADD`, with a plain read of the lots for
//! the tier hint, unless the set-aside settlements are due to be booked), and when another
//! instance drained the account (`q:drains`, heard within a `FLUSH_EVERY`: `drains`). A lease
//! nothing changed costs Redis nothing. What falls due on a clock (the start time, the next
//! minute's chunk, an idle lease) waits for the next clock round (`CLOCK_EVERY_MS`), so the
//! accounts it falls due for share that round's round trips.
//!
//! Exactness:
//! - the lease is a reservation, so what all instances admit never exceeds the balance;
//! - a lease takes at most 1/`SHARE` of what is left beyond every other reservation and lease;
//!   once that share is smaller than one request, or a window has less than `SHARE` chunks left,
//!   the account is drained: for a while no instance keeps or takes a share, each request is
//!   reserved exactly on its own (`reserve.lua`), and a reservation refused while leases still
//!   hold unused shares waits for them to come back (`DRAIN_WAIT`) before it is refused, so the
//!   last tokens are neither overspent nor stranded;
//! - a window chunk is counted in its minute's window before any of it is used, so a
//!   per-minute limit counts at least what was admitted; a minute's count adds the next
//!   minute's window, where chunks taken ahead are, so this minute and the next never hold
//!   more than the cap together (far below its cap, the minutes ahead come as a standing
//!   `Grant` that every count of those minutes adds, written with plain commands first and cut
//!   back if the rule refuses it, `ahead`; ending it keeps the minutes up to the current one);
//!   output tokens
//!   are corrected to the real amount when the settlement is paid (within `FLUSH_EVERY`, as
//!   one instance corrects at settlement);
//! - a set-aside share counts as spent for every other request and lease, and is set aside only
//!   while the allowance alone covers it beyond everything held, so what is settled within it
//!   is the allowance's whatever else happens before the renewal books it.
//!
//! The lease size follows the account's request rate on this instance: enough for `HORIZON_MS`
//! of its traffic, doubled each time it runs out between renewals.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::Value as RedisValue;
use tokio::sync::Notify;

use super::limits::{WindowView, WINDOW_MS};
use super::scripts::{
    account_keys, as_i64, as_string, grant_key, on_allowance, rate_key, ACCOUNT_TTL_SECS,
};
use super::{Later, OnPaid, RatePlan, RateView, Reservation, Ticket, Used};
use crate::config::TierLimits;
use crate::domain::{Breakdown, LotKind, Tier};
use crate::identity::Identity;
use crate::pricing::Weights;
use crate::util::{now_ms, FastHash};

/// How often settlements are paid and leases with something to do renewed (and drains polled,
/// while the drain listener is not subscribed).
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// How often (ms) a round also does the work that waits on a clock rather than on traffic: a
/// lease's start time pushed back (every third of the reservation timeout), the next minute's
/// chunks (in a minute's second half), an idle lease given back. Each has seconds to spare,
/// and the accounts due in one round share its one pipeline and one script call, where spread
/// over every round each account's would be a round trip of its own: a round trip costs Redis
/// far more than the commands in it.
const CLOCK_EVERY_MS: i64 = 1_000;
/// A lease unused this long (ms) is given back: long enough that an account sending a request
/// every minute or so keeps its lease (taking one is a call on the request path), while a held
/// lease costs Redis nothing.
const IDLE_MS: i64 = 300_000;
/// How often (ms) a renewal reads the lots even when the allowance covers everything, so the
/// tier hint follows lots that expired.
const LOTS_EVERY_MS: i64 = 300_000;
/// A renewal that runs the script anyway also pushes the lease's start time back and reads the
/// lots once 1/EARLY_BY of their period has passed: both cost the script's light path one
/// command, while a renewal of their own costs a whole call for the account.
const EARLY_BY: i64 = 2;
/// After a drain, how long (ms) this instance reserves the account's requests exactly before
/// it asks for a lease again.
const EXACT_MS: i64 = 1_000;
/// A lease takes at most 1/SHARE of what is left.
pub const SHARE: u64 = 4;
/// A lease covers this much (ms) of the account's traffic on this instance; its window chunks
/// at least `MIN_REQUESTS` requests, its weekly share at least `SHARE_MIN_REQUESTS`.
const HORIZON_MS: f64 = 2_000.0;
const MIN_REQUESTS: f64 = 32.0;
/// The weekly share covers at least this many requests: an account at a request every few
/// seconds then tops its share up every few minutes, not every few dozen seconds (each top-up
/// is a renewal). The share stays at most 1/`SHARE` of what is left, and a drain gives it back.
const SHARE_MIN_REQUESTS: f64 = 128.0;
/// A share is topped up once less than 1/TOP_UP_AT of what it is sized for is left: for a busy
/// account half a second of its traffic, still several rounds (`FLUSH_EVERY`) ahead of running
/// out; for an account at a request every few seconds, a top-up (a script call) every 96
/// requests rather than every 64. Set-aside settlements are booked at a top-up, or at the first
/// push of the lease's start time (every third of the reservation timeout) once a whole timeout
/// has passed since they were last booked, whichever comes first: what a crashed instance's
/// lease gives back unbooked is what it settled within about one timeout, the time the sweep
/// holds that lease before releasing it anyway.
const TOP_UP_AT: u64 = 4;
/// A share running short waits for the next clock round (`CLOCK_EVERY_MS`) while what is left
/// covers this long (ms) of the account's traffic: an account at a request every few seconds
/// then tops up in the round trip the clock round makes anyway, with every other account due,
/// instead of in a round trip of its own; a busy account (half a second of traffic left at
/// `TOP_UP_AT`) still tops up at the next round.
const TOP_UP_WAITS_MS: i64 = 3_000;
/// The most requests one lease covers.
const MAX_REQUESTS: f64 = 100_000.0;
/// A standing grant covers the minutes from the one before it is written to this many after
/// it: an account sending a few requests a minute then costs Redis one plain write and read
/// for that many minutes of its windows, where a chunk per minute costs both every minute.
pub(super) const GRANT_MINUTES: i64 = 10;
/// A grant is extended (written again for `GRANT_MINUTES` more) once it ends within this many
/// minutes, in the second half of a minute the scope was used in.
const GRANT_RENEW_MINUTES: i64 = 3;
/// A grant is taken only far below every cap: the grant itself counts up to three times in a
/// minute's sliding count (the previous, this and the next minute), and with this instance's
/// chunk and the window as last known it stays within 1/`GRANT_CAP_RATIO` of the cap.
const GRANT_CAP_RATIO: u64 = 4;
/// How long a request waits for a renewal in progress before it is reserved exactly.
pub(super) const WAIT_FOR_RENEWAL: Duration = Duration::from_millis(500);
/// How long a reservation refused while leases hold unused shares waits before asking again,
/// and how often it asks. A drain reaches every lease within two `FLUSH_EVERY` of its notice
/// (heard, then given back by the renewal); a notice lost with a connection that died quietly
/// is read by the next heartbeat's poll, within a second and a half in all.
pub const DRAIN_WAIT: Duration = Duration::from_millis(270);
pub const DRAIN_TRIES: usize = 6;

/// Requests, input tokens, output tokens.
type Dims = [u64; 3];

/// The account's request rate here (per second) after `admitted` requests in the `elapsed_ms`
/// since the last renewal, from the rate estimated then (`before`): an average over about the
/// last `HORIZON_MS`, the span a lease is sized to cover. Each interval weighs by its length:
/// renewals come at the clock round, on the request path and at the next flush after a request
/// settles, so one request a few milliseconds after a renewal would otherwise read as hundreds
/// a second, and an account at a request a second could be sized (its chunk ahead, its grant)
/// as a busy one for minutes.
fn decayed_rate(before: f64, admitted: u64, elapsed_ms: i64) -> f64 {
    let elapsed = elapsed_ms.max(1) as f64;
    let kept = (-elapsed / HORIZON_MS).exp();
    kept * before + (1.0 - kept) * admitted as f64 * 1000.0 / elapsed
}

/// The requests a chunk is sized for when `expected` arrive in its span on average: three
/// standard deviations more. Requests sent at random moments number their average give or
/// take its square root, so a chunk sized for the average alone runs out before its minute
/// ends about one minute in three (30 a minute against a chunk of 32), each time a script
/// call on the request path; with the spread, about one in three hundred. Far below the caps
/// that holds a little more of the window for a moment; near them the script grants at most
/// a quarter of what is left whatever is asked.
fn with_spread(expected: f64) -> f64 {
    expected + 3.0 * expected.max(0.0).sqrt()
}

/// This instance's standing grant on one scope's per-minute windows: `dims` in each minute of
/// [`from`, `to`), held in the scope's grants hash (`scripts::grant_key`, one field per
/// instance) rather than counted in each minute's window. Every count of a minute adds the
/// grants covering it (`account.lua`'s `grant_counts`, and `ahead`), so a window counts a
/// grant as it counts a chunk taken in it, and the instance admits up to `dims` in each of
/// those minutes without asking Redis (`Chunk::roll` makes each minute's chunk of it). An
/// account far below its caps sending a request every few seconds then costs Redis one plain
/// write every `GRANT_MINUTES` instead of a chunk counted every minute.
///
/// A grant is written with plain commands (`ahead`), checked after the write by the rule a
/// chunk taken ahead meets (the sliding count, the grant included, within half the cap), and
/// put back to cover only the minutes already in use when it breaks it. It ends when its scope
/// gives its chunks back (idle, drained, the instance stopping) or needs more in a minute than
/// it grants: `lease.lua` then cuts it back to the minutes up to the current one, whose use
/// (and the previous minute's, which the current count weighs) it keeps counting; what it held
/// of the minutes after comes back at once. An instance keeps its grant's record until it no
/// longer covers the previous minute, so a grant it writes later never counts less for a
/// minute than this one did, and a call that failed to end it keeps it too.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Grant {
    pub(super) from: i64,
    pub(super) to: i64,
    pub(super) dims: Dims,
}

impl Grant {
    pub(super) fn covers(&self, minute: i64) -> bool {
        self.from <= minute && minute < self.to
    }

    /// The grant as its field holds it ("from,to,r,i,o"); empty when it covers no minute (the
    /// field is deleted).
    pub(super) fn value(&self) -> String {
        if self.from >= self.to {
            return String::new();
        }
        let [r, i, o] = self.dims;
        format!("{},{},{r},{i},{o}", self.from, self.to)
    }

    /// A grant as its field holds it (`value`'s form).
    pub(super) fn parse(text: &str) -> Option<Grant> {
        let mut parts = text.split(',');
        let mut field = || parts.next()?.parse::<i64>().ok();
        let (from, to) = (field()?, field()?);
        let mut dims = [0u64; 3];
        for d in &mut dims {
            *d = u64::try_from(field()?).ok()?;
        }
        Some(Grant { from, to, dims })
    }

    /// The grant cut back to the minutes before `minute`.
    fn until(self, minute: i64) -> Grant {
        Grant {
            to: self.to.min(minute),
            ..self
        }
    }
}

/// This instance's share of one scope's per-minute windows.
#[derive(Debug, Clone, Default)]
struct Chunk {
    minute: i64,
    caps: Dims,
    granted: Dims,
    used: Dims,
    /// The window's sliding count when the chunk was granted, the chunk not included.
    counted: Dims,
    last_used: i64,
    /// Granted for the next minute, ahead of it (counted in that minute's window, which this
    /// minute's count adds): the chunk when that minute comes (`roll`), so an account sending
    /// requests every minute asks for its chunks in the periodic round, not on the request
    /// path.
    ahead: Dims,
    /// The next minute's window count when `ahead` was granted, `ahead` not included.
    ahead_counted: Dims,
    /// This minute's ahead chunk was asked for (granted or not): asked once a minute.
    ahead_asked: bool,
    /// The scope's standing grant, while it stands.
    grant: Option<Grant>,
    /// This minute's chunk is the grant's (`granted` is counted by the grant, not in the
    /// window).
    standing: bool,
    /// The minutes [from, to) whose use a grant of this scope counts instead of their window: a
    /// settlement of such a minute that used less than it was charged cannot take the
    /// difference off the window, which never counted the charge.
    granted_minutes: (i64, i64),
}

impl Chunk {
    /// The same scope's chunk for `minute`, holding nothing yet.
    fn bare(&self, minute: i64) -> Chunk {
        Chunk {
            minute,
            caps: self.caps,
            last_used: self.last_used,
            grant: self.grant,
            granted_minutes: self.granted_minutes,
            ..Chunk::default()
        }
    }

    /// Whether it holds part of a window, this minute's or the next's, or a grant on them.
    fn holds(&self) -> bool {
        self.granted != [0; 3] || self.ahead != [0; 3] || self.grant.is_some()
    }

    /// In the minute after the chunk's, its ahead part becomes the chunk; in a later minute a
    /// standing grant covers, the grant's share of it does. True when either did.
    fn roll(&mut self, minute: i64) -> bool {
        if self.minute + 1 == minute && self.ahead != [0; 3] {
            *self = Chunk {
                granted: self.ahead,
                counted: self.ahead_counted,
                ..self.bare(minute)
            };
            return true;
        }
        match self.grant {
            Some(g) if self.minute < minute && g.covers(minute) => {
                *self = Chunk {
                    granted: g.dims,
                    counted: self.counted,
                    standing: true,
                    ..self.bare(minute)
                };
                true
            }
            _ => false,
        }
    }

    /// Records a grant written for the scope.
    fn stand(&mut self, grant: Grant) {
        self.grant = Some(grant);
        let (from, to) = self.granted_minutes;
        self.granted_minutes = if from < to {
            (from.min(grant.from), to.max(grant.to))
        } else {
            (grant.from, grant.to)
        };
    }

    /// The grant as it is to stay once it ends in `minute`: cut back to the minutes up to this
    /// one, whose use (and the previous minute's, which this minute's count weighs) it keeps
    /// counting.
    fn end_grant(&mut self, minute: i64) -> Option<Grant> {
        let ended = self.grant.take()?.until(minute + 1);
        self.granted_minutes.1 = self.granted_minutes.1.min(minute + 1);
        Some(ended)
    }

    /// Whether to ask for the next minute's chunk: in the second half of the minute, once,
    /// when this minute has a chunk (or is `taking` one) and the scope admitted a request in
    /// this minute or the last. An account sending a few requests a minute skips a minute now
    /// and then; without the last minute counted, its next request would find no chunk and
    /// wait for a script call on the request path. A scope left unused two minutes running
    /// stops asking.
    fn wants_ahead(&self, now: i64, taking: bool) -> bool {
        let minute = now.div_euclid(WINDOW_MS);
        // This minute's chunk as `roll` makes it from last minute's ahead, when not rolled yet.
        let mut c = self.clone();
        c.roll(minute);
        let current = c.minute == minute;
        let recent = c.last_used.div_euclid(WINDOW_MS) >= minute - 1;
        if c.grant
            .is_some_and(|g| g.covers(minute + 1) && g.to > minute + GRANT_RENEW_MINUTES)
        {
            // The grant makes the next minute's chunk.
            return false;
        }
        now.rem_euclid(WINDOW_MS) >= WINDOW_MS / 2
            && (taking || (current && c.granted != [0; 3] && recent))
            && !(current && (c.ahead != [0; 3] || c.ahead_asked))
    }
}

/// A window correction (input, output: actual − charged) a chunk could not take, for the
/// window of `scope` in `minute`.
type Fix = (String, i64, [i64; 2]);

/// A request settled against the lease, waiting for the renewal that pays it.
pub(super) struct Pending {
    pub(super) ticket: Ticket,
    pub(super) used: Used,
    on_paid: Option<OnPaid>,
}

impl Pending {
    /// Hands the request its share of what the renewal paid.
    pub(super) fn paid(mut self, b: Breakdown) {
        if let Some(on_paid) = self.on_paid.take() {
            on_paid(b);
        }
    }
}

impl Drop for Pending {
    /// A settlement never paid (the lease went away with it) is still recorded, booked on
    /// the allowance, so the usage record adds up and nothing waits for it forever.
    fn drop(&mut self) {
        if let Some(on_paid) = self.on_paid.take() {
            on_paid(on_allowance(&self.ticket, self.used, now_ms()));
        }
    }
}

#[derive(Default)]
pub(super) struct Slot {
    /// Tokens and requests the lease holds in Redis.
    held: [u64; 2],
    /// Held by admitted requests not settled yet.
    inflight: [u64; 2],
    /// Settled here, paid at the next renewal; `pending_cost` is what they held.
    pending: Vec<Pending>,
    pending_cost: [u64; 2],
    /// The lease is set aside from the weekly allowance (`lease.lua`): a request settled
    /// within it is paid by the allowance, recorded at once, and only its cost (tokens,
    /// requests) waits here for the next renewal, which books the sum.
    aside: bool,
    aside_paid: [u64; 2],
    /// The weekly limits (tokens, requests; 0 requests: unlimited) the renewal that set the
    /// lease aside was made with: a settlement is the allowance's only while the account's
    /// limits are still at least those (a config reload or a tier change may lower them).
    aside_limits: (u64, u64),
    /// Window corrections of set-aside settlements that their chunk could not take.
    late_fixes: Vec<Fix>,
    /// Below this much unused (tokens, requests) the share is topped up at the next round, if
    /// a request was admitted since the last renewal: 1/`TOP_UP_AT` of what the lease is
    /// sized for.
    top_up: [u64; 2],
    chunks: HashMap<String, Chunk>,
    exact_until: i64,
    pub(super) renewing: bool,
    limits: TierLimits,
    unlimited: bool,
    /// What the next renewal must at least make room for (a request that did not fit).
    need: Dims,
    admitted: u64,
    rate_per_s: f64,
    avg_in: f64,
    avg_out: f64,
    /// Average quota tokens reserved per request (the raw averages at the models' weights):
    /// sizes the lease's tokens, while `avg_in`/`avg_out` size the per-minute windows' chunks.
    avg_tokens: f64,
    want: f64,
    last_renewal: i64,
    last_used: i64,
    /// When the lease's start time in Redis was last pushed back.
    refreshed: i64,
    /// When a renewal last read the lots.
    lots_read: i64,
    /// When a script call last booked the set-aside settlements.
    booked: i64,
    /// A plain push found the lease's start time gone from Redis (the sweep released the
    /// lease): the next renewal runs the script, which finds out what is left.
    recheck: bool,
    /// Another instance drained the account: give the lease back at the next round.
    pub(super) wake: bool,
}

impl Slot {
    /// The periodic parts of a renewal (`lease.lua`'s flags) due once 1/`by` of their period
    /// has passed: 1 = push the lease's start time back (every third of the reservation
    /// timeout), 2 = read the lots (`LOTS_EVERY_MS`).
    fn clocks(&self, now: i64, timeout_ms: i64, by: i64) -> u8 {
        let push = now - self.refreshed >= timeout_ms / 3 / by;
        let lots = now - self.lots_read >= LOTS_EVERY_MS / by;
        u8::from(push) | (u8::from(lots) << 1)
    }

    /// Whether what is left unused (`free`) covers `ms` of the account's traffic here, at the
    /// larger of its rate as last estimated and that estimate with the requests since the last
    /// renewal counted in (a burst since then weighs at once; one request a moment after the
    /// renewal is not a burst).
    fn lasts(&self, free: [u64; 2], now: i64, ms: i64) -> bool {
        let rate = self.rate_per_s.max(decayed_rate(
            self.rate_per_s,
            self.admitted,
            now - self.last_renewal,
        ));
        let requests = rate * ms as f64 / 1000.0;
        let per_request = [self.avg_tokens.max(1.0), 1.0];
        (0..2).all(|i| self.top_up[i] == 0 || free[i] as f64 >= requests * per_request[i])
    }

    fn free(&self) -> [u64; 2] {
        [0, 1].map(|i| {
            self.held[i]
                .saturating_sub(self.inflight[i] + self.pending_cost[i] + self.aside_paid[i])
        })
    }

    /// Whether the periodic renewal has something to do for this account (see the module's
    /// doc): nothing on a clock but the reservation timeout.
    /// `booking`: Redis answers, so what only waits to be booked in Redis is due too.
    /// `clock`: the round is a clock round (`CLOCK_EVERY_MS`), so the work that waits on a clock
    /// (the next minute's chunk, giving an idle lease back, pushing the start time back) is due
    /// too; what the account's traffic or another instance asks for is due every round.
    fn due(&self, now: i64, timeout_ms: i64, closing: bool, booking: bool, clock: bool) -> bool {
        if self.renewing {
            return false;
        }
        if closing {
            return self.held != [0, 0]
                || !self.pending.is_empty()
                || self.aside_paid != [0, 0]
                || self.chunks.values().any(Chunk::holds);
        }
        // Set-aside settlements that a failed renewal gave back (the lease is no longer set
        // aside): sent again at once.
        let unbooked = !self.aside && self.aside_paid != [0, 0];
        let minute = now.div_euclid(WINDOW_MS);
        let chunk = self
            .chunks
            .values()
            .any(|c| (c.minute == minute && c.holds()) || c.grant.is_some());
        let holds = self.held != [0, 0] || chunk;
        let idle = now - self.last_used > IDLE_MS && self.inflight == [0, 0];
        let free = self.free();
        let running_short = self.admitted > 0
            && self.held != [0, 0]
            && (free[0] < self.top_up[0] || free[1] < self.top_up[1]);
        let top_up_waits = running_short && self.lasts(free, now, TOP_UP_WAITS_MS);
        let on_clock = clock
            && ((!idle && self.chunks.values().any(|c| c.wants_ahead(now, false)))
                || (holds && idle)
                || (self.held != [0, 0] && self.clocks(now, timeout_ms, 1) & 1 != 0)
                || top_up_waits);
        !self.pending.is_empty()
            || (booking && (!self.late_fixes.is_empty() || unbooked))
            || (running_short && !top_up_waits)
            || (holds && self.wake)
            // A push found the lease released by the sweep: what it holds is checked at once.
            || (self.held != [0, 0] && self.recheck)
            || on_clock
    }
}

#[derive(Default)]
pub(super) struct Cell {
    pub(super) slot: Mutex<Slot>,
    pub(super) renewed: Notify,
}

/// What admission against the lease decided.
pub(super) enum Admit {
    Granted(Box<Reservation>),
    /// Reserve this request on its own.
    Exact,
    /// The lease is too small: renew it, then try again.
    Renew,
    /// A renewal is under way: wait for it.
    Wait(Arc<Cell>),
}

/// This instance's leases, by account.
pub struct Leases {
    pub(super) id: String,
    cells: dashmap::DashMap<String, Arc<Cell>, FastHash>,
    /// The instance is stopping: every lease is given back at the next round.
    closing: std::sync::atomic::AtomicBool,
    /// When (ms) the next clock round may come (`CLOCK_EVERY_MS`).
    next_clock: std::sync::atomic::AtomicI64,
}

/// One scope of a `lease.lua` call: whether its chunk for this minute is renewed (given back,
/// taken) and whether the next minute's is asked for.
pub(super) struct ScopeCall {
    scope: String,
    renewed: bool,
    ahead: bool,
    /// The grant the call ends, as it stood: kept again when the call fails (Redis may still
    /// hold it whole).
    ended: Option<Grant>,
}

/// The arguments of one `lease.lua` call and what to do with its answer.
pub(super) struct Call {
    pub(super) keys: Vec<String>,
    pub(super) args: Vec<String>,
    /// Tokens and requests the lease keeps for admitted requests plus the unused part kept.
    kept: [u64; 2],
    scopes: Vec<ScopeCall>,
    idle: bool,
    /// What it books of set-aside settlements, and the window corrections those left: given
    /// back to the slot when the call fails.
    aside_paid: [u64; 2],
    late_fixes: Vec<Fix>,
    /// The weekly limits it was made with (see `Slot::aside_limits`).
    limits: (u64, u64),
    /// Set when all it does is write standing grants, push the lease's start time back and
    /// read the lots: done with plain commands, not `lease.lua`
    /// (`Shared::take_ahead`, answered by `Leases::finish_ahead`).
    pub(super) plain: Option<PlainRenewal>,
    /// When it was made (the windows' minute and the sliding count's weight).
    pub(super) now: i64,
}

/// A renewal done with plain commands (see `Call::plain`).
pub(super) struct PlainRenewal {
    /// The standing grants asked for.
    pub(super) asks: Vec<AheadAsk>,
    /// Push the lease's start time back (`ZADD XX`: a lease the sweep released stays so).
    pub(super) push: bool,
    /// Read the lots for the tier hint.
    pub(super) lots: bool,
}

/// What a plain renewal (`Call::plain`) found.
#[derive(Debug, Default)]
pub(super) struct PlainAnswer {
    /// For each ask: the grant that stands in Redis now (`None`: unknown, Redis did not
    /// answer).
    pub(super) grants: Vec<Option<Grant>>,
    /// The highest tier among the lots, when they were read.
    pub(super) top: Option<Option<Tier>>,
    /// The push found no start time to move.
    pub(super) lease_gone: bool,
}

/// One scope's standing grant written (or extended) with plain commands.
pub(super) struct AheadAsk {
    /// Its place among the call's scopes.
    scope: usize,
    /// The previous, this and the next minute's windows, and the scope's grants hash, as
    /// `lease.lua`'s window indices (`Call::window`).
    pub(super) windows: [usize; 3],
    pub(super) grants: usize,
    pub(super) caps: Dims,
    pub(super) grant: Grant,
    /// What the field is put back to when the rule refuses `grant`: the grant before it, or
    /// the minutes already in use.
    pub(super) kept: Grant,
}

impl Call {
    /// The window key of `lease.lua`'s window index `i` (1: the first after the account's).
    pub(super) fn window(&self, i: usize) -> &str {
        &self.keys[4 + i]
    }

    /// The account's reservation start times (`account_keys`).
    pub(super) fn start_times(&self) -> &str {
        &self.keys[4]
    }

    /// The account's lots (`account_keys`).
    pub(super) fn lots(&self) -> &str {
        &self.keys[3]
    }
}

impl Leases {
    pub fn new(instance: &str) -> Leases {
        Leases {
            id: format!("L:{instance}"),
            cells: Default::default(),
            closing: Default::default(),
            next_clock: Default::default(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn admit(
        &self,
        plan: &RatePlan,
        limits: &TierLimits,
        who: &Identity,
        id: &str,
        input: u64,
        output: u64,
        weights: Weights,
        now: i64,
    ) -> Admit {
        let user_id = &who.user.id;
        let cell = match self.cells.get(user_id) {
            Some(c) => c.clone(),
            None => self.cells.entry(user_id.clone()).or_default().clone(),
        };
        let mut guard = cell.slot.lock();
        if guard.renewing {
            drop(guard);
            return Admit::Wait(cell);
        }
        let s = &mut *guard;
        s.last_used = now;
        s.limits = *limits;
        s.unlimited = who.user.unlimited;
        if s.exact_until > now {
            return Admit::Exact;
        }
        let tokens = weights.estimate(input, output);
        let caps = [plan.rpm, plan.itpm, plan.otpm];
        let costs = [1, input, output];
        let minute = now.div_euclid(WINDOW_MS);
        let free = s.free();
        let quota_fits = free[0] >= tokens && free[1] >= 1;
        let windowed = caps != [0; 3];
        let window_fits = !windowed
            || s.chunks.get_mut(&plan.scope).is_some_and(|c| {
                c.roll(minute);
                c.minute == minute
                    && (0..3).all(|d| caps[d] == 0 || c.used[d] + costs[d] <= c.granted[d])
            });
        if !(quota_fits && window_fits) {
            s.need = [
                tokens.max(s.need[0]),
                input.max(s.need[1]),
                output.max(s.need[2]),
            ];
            if windowed {
                let chunk = s.chunks.entry(plan.scope.clone()).or_default();
                chunk.caps = caps;
                chunk.last_used = now;
            }
            return Admit::Renew;
        }
        s.inflight[0] += tokens;
        s.inflight[1] += 1;
        s.admitted += 1;
        if s.avg_in == 0.0 && s.avg_out == 0.0 && s.avg_tokens == 0.0 {
            (s.avg_in, s.avg_out, s.avg_tokens) = (input as f64, output as f64, tokens as f64);
        } else {
            s.avg_in += (input as f64 - s.avg_in) / 16.0;
            s.avg_out += (output as f64 - s.avg_out) / 16.0;
            s.avg_tokens += (tokens as f64 - s.avg_tokens) / 16.0;
        }
        let mut rate = RateView::default();
        if let Some(c) = s.chunks.get_mut(&plan.scope).filter(|_| windowed) {
            c.last_used = now;
            for (used, cost) in c.used.iter_mut().zip(costs) {
                *used += cost;
            }
            let reset_secs = ((WINDOW_MS - now.rem_euclid(WINDOW_MS)) as u64).div_ceil(1000);
            let view = |d: usize| {
                (caps[d] > 0).then(|| WindowView {
                    limit: caps[d],
                    remaining: caps[d].saturating_sub(c.counted[d] + c.used[d]),
                    reset_secs,
                })
            };
            rate = RateView {
                requests: view(0),
                input_tokens: view(1),
                output_tokens: view(2),
            };
        }
        Admit::Granted(Box::new(Reservation {
            ticket: Ticket {
                id: id.to_string(),
                user_id: user_id.clone(),
                tokens,
                requests: 1,
                input_cost: input,
                output_cost: output,
                weights,
                minute,
                plan: plan.clone(),
                limits: *limits,
                unlimited: who.user.unlimited,
                in_process: false,
                leased: true,
            },
            rate,
        }))
    }

    /// Moves a settled request from the lease's admitted ones to those the next renewal pays;
    /// `on_paid` gets its breakdown once it is paid. Both come back when there is no lease.
    pub(super) fn settle(&self, t: Ticket, used: Used, on_paid: OnPaid) -> Result<(), Later> {
        let Some(cell) = self.cells.get(&t.user_id).map(|c| c.clone()) else {
            return Err(Later {
                ticket: Box::new(t),
                on_paid,
            });
        };
        let mut guard = cell.slot.lock();
        let s = &mut *guard;
        s.inflight[0] = s.inflight[0].saturating_sub(t.tokens);
        s.inflight[1] = s.inflight[1].saturating_sub(t.requests);
        let charge = t.charge(used);
        // Within a set-aside share (and not while a renewal may be changing its kind) the
        // allowance pays: recorded now, booked in Redis at the next renewal.
        let limits = (t.limits.weekly_tokens, t.limits.weekly_requests);
        let as_generous = limits.0 >= s.aside_limits.0
            && (limits.1 == 0 || (s.aside_limits.1 != 0 && limits.1 >= s.aside_limits.1));
        if s.aside && !s.renewing && charge <= t.tokens && as_generous {
            s.aside_paid[0] += charge;
            s.aside_paid[1] += t.requests;
            let by = window_fix(&mut s.chunks, &t, used);
            if by != [0, 0] {
                add_fix(&mut s.late_fixes, &t.plan.scope, t.minute, by);
            }
            drop(guard);
            on_paid(on_allowance(&t, used, now_ms()));
            return Ok(());
        }
        s.pending_cost[0] += t.tokens;
        s.pending_cost[1] += t.requests;
        s.pending.push(Pending {
            ticket: t,
            used,
            on_paid: Some(on_paid),
        });
        Ok(())
    }

    /// Prepares one renewal of `user_id`'s lease, with the settlements it pays; `None` when one
    /// is under way or there is no lease. Admission waits until `finish` (the lease changes
    /// size in between). With `plain_ahead`, a renewal that only takes the next minute's
    /// chunks far below their caps is marked `plain` (the caller must then take them with
    /// `Shared::take_ahead`, not the script: its set-aside settlements are left to book later).
    pub(super) fn begin(
        &self,
        prefix: &str,
        user_id: &str,
        timeout_ms: i64,
        now: i64,
        plain_ahead: bool,
    ) -> Option<(Call, Vec<Pending>)> {
        let cell = self.cells.get(user_id)?.clone();
        let mut guard = cell.slot.lock();
        let s = &mut *guard;
        if s.renewing {
            return None;
        }
        s.renewing = true;
        // Woken by another instance's drain: the script answers it (exact mode, the drain
        // passed on), never the plain commands.
        let woken = std::mem::take(&mut s.wake);
        let pending = std::mem::take(&mut s.pending);
        let paid = std::mem::take(&mut s.pending_cost);
        let aside_paid = std::mem::take(&mut s.aside_paid);
        let held_before = s.held;
        s.held = [0, 1].map(|i| s.held[i].saturating_sub(paid[i] + aside_paid[i]));

        s.rate_per_s = decayed_rate(s.rate_per_s, s.admitted, now - s.last_renewal);
        s.admitted = 0;
        let closing = self.closing.load(std::sync::atomic::Ordering::Relaxed);
        let idle = (closing || now - s.last_used > IDLE_MS) && s.inflight == [0, 0];
        let exact = s.exact_until > now || idle;
        let urgent = s.need != [0; 3];
        let mut want = (s.rate_per_s * HORIZON_MS / 1000.0).max(MIN_REQUESTS);
        if urgent {
            want = want.max(s.want * 2.0);
        }
        s.want = want.min(MAX_REQUESTS);
        let share = s.want.max(SHARE_MIN_REQUESTS);
        let want_requests = share.ceil() as u64;
        // Before the lease's first admission its averages are unknown: the request that did
        // not fit stands for them (else the first share and chunk fit that one request only,
        // and each following request renews them on the request path).
        let fresh = s.avg_in == 0.0 && s.avg_out == 0.0 && s.avg_tokens == 0.0;
        let (avg_in, avg_out, avg_tokens) = if fresh {
            (s.need[1] as f64, s.need[2] as f64, s.need[0] as f64)
        } else {
            (s.avg_in, s.avg_out, s.avg_tokens)
        };
        let avg = [avg_in.max(1.0), avg_out.max(0.0)];
        let avg_tokens = avg_tokens.max(1.0);
        let want_tokens = ((share * avg_tokens).ceil() as u64).max(s.need[0]);
        let free = if idle { [0, 0] } else { s.free() };
        // A share is carved only when it runs short: a request did not fit, or less than
        // 1/TOP_UP_AT of what the lease is sized for is left. Otherwise the call only pays.
        s.top_up = [want_tokens / TOP_UP_AT, want_requests.div_ceil(TOP_UP_AT)];
        let short = free[0] < s.top_up[0] || free[1] < s.top_up[1];
        let ask = if exact || !(urgent || short) {
            [0, 0]
        } else {
            [
                want_tokens.saturating_sub(free[0]),
                want_requests.saturating_sub(free[1]),
            ]
        };
        let mut flags = s.clocks(now, timeout_ms, 1) | u8::from(s.held == [0, 0]);
        let least = s.need[0].max(avg_tokens as u64).max(1);

        let minute = now.div_euclid(WINDOW_MS);
        let mut keys: Vec<String> = account_keys(prefix, user_id).to_vec();
        let mut index = |key: String| -> usize {
            match keys[5..].iter().position(|k| *k == key) {
                Some(i) => i + 1,
                None => {
                    keys.push(key);
                    keys.len() - 5
                }
            }
        };
        // The settlements are paid as one sum (split back per request from the answer, see
        // `Paid`), and their token windows corrected once per window: the script's work does
        // not grow with the traffic.
        let mut settled = [0u64; 2];
        let late_fixes: Vec<Fix> = std::mem::take(&mut s.late_fixes);
        let mut fixes = late_fixes.clone();
        for p in &pending {
            let t = &p.ticket;
            settled[0] += t.charge(p.used);
            settled[1] += t.requests;
            let by = window_fix(&mut s.chunks, t, p.used);
            if by != [0, 0] {
                add_fix(&mut fixes, &t.plan.scope, t.minute, by);
            }
        }
        let mut items: Vec<String> = Vec::with_capacity(fixes.len() * 3);
        for (scope, minute, by) in fixes.into_iter().filter(|f| f.2 != [0, 0]) {
            items.push(index(rate_key(prefix, user_id, &scope, minute)).to_string());
            items.extend(by.map(|v| v.to_string()));
        }
        let mut args: Vec<String> = Vec::with_capacity(20 + items.len());
        s.chunks
            .retain(|_, c| c.holds() || now - c.last_used <= IDLE_MS);
        let mut scopes = Vec::new();
        let mut scope_args: Vec<String> = Vec::new();
        let need = s.need;
        let needed: Dims = [1, need[1], need[2]];
        // A chunk sized for the account's traffic until the minute ends (it is of no use after).
        let rest_s = (WINDOW_MS - now.rem_euclid(WINDOW_MS)) as f64 / 1000.0;
        let chunk_requests = with_spread(s.rate_per_s * rest_s)
            .max(s.want)
            .min(MAX_REQUESTS);
        // The next minute's chunk, asked for ahead: the account's traffic for a whole minute.
        let ahead_requests = with_spread(s.rate_per_s * 60.0)
            .max(s.want)
            .min(MAX_REQUESTS);
        // Tokens at twice the average estimate: a request's real use moves its chunk's count
        // (`window_fix`), and a chunk whose tokens ran out before its requests is renewed on
        // the request path.
        let sized = |requests: f64, need: Dims| -> Dims {
            [
                requests.ceil() as u64,
                ((2.0 * requests * avg[0]).ceil() as u64)
                    .max(need[1])
                    .max(1),
                ((2.0 * requests * avg[1]).ceil() as u64).max(need[2]),
            ]
        };
        let capped = |caps: Dims, v: Dims| -> Vec<String> {
            (0..3)
                .map(|d| if caps[d] > 0 { v[d] } else { 0 }.to_string())
                .collect()
        };
        let mut plain_asks: Vec<AheadAsk> = Vec::new();
        let mut all_plain = true;
        for (scope, c) in s.chunks.iter_mut() {
            if c.minute != minute && !c.roll(minute) {
                // A past minute's chunk can no longer be used: dropped here, its unused part
                // left counted in its window (the count errs high, never low).
                *c = c.bare(c.minute);
            }
            if c.grant.is_some_and(|g| g.to < minute) {
                // Past: it covers neither this minute nor the previous one (which this minute's
                // count weighs), and its field goes with the key. Until then it is kept: a grant
                // written later must not count less for that minute than this one did.
                c.grant = None;
            }
            let current = c.minute == minute && c.granted != [0; 3];
            let chunk_idle = now - c.last_used > IDLE_MS;
            let short = urgent
                && !(c.minute == minute
                    && (0..3).all(|d| c.caps[d] == 0 || c.used[d] + needed[d] <= c.granted[d]));
            let give_back = current && (exact || chunk_idle || short);
            let take = !exact && !chunk_idle && short;
            let ahead_back = c.minute == minute && c.ahead != [0; 3] && (exact || chunk_idle);
            let ask_ahead = !exact && !chunk_idle && c.wants_ahead(now, take);
            // A grant ends when its scope gives its chunks back or needs more this minute.
            let end_grant = c.grant.is_some() && (exact || chunk_idle || short);
            if !(give_back || take || ahead_back || ask_ahead || end_grant) {
                continue;
            }
            let before = c.grant;
            let ended = if end_grant { c.end_grant(minute) } else { None };
            let give_back_window = give_back && !c.standing;
            let back = if give_back_window {
                index(rate_key(prefix, user_id, scope, minute))
            } else {
                0
            };
            let prev = index(rate_key(prefix, user_id, scope, minute - 1));
            let curr = index(rate_key(prefix, user_id, scope, minute));
            // Whenever a chunk is asked for: the next minute's count is part of this one's.
            let next = if ahead_back || ask_ahead || take {
                index(rate_key(prefix, user_id, scope, minute + 1))
            } else {
                0
            };
            let asked: Dims = if take {
                sized(chunk_requests, need)
            } else {
                [0; 3]
            };
            let least: Dims = [1, need[1].max(1), need[2]];
            scope_args.extend([prev, curr].map(|i| i.to_string()));
            scope_args.extend(c.caps.map(|v| v.to_string()));
            scope_args.push(back.to_string());
            for d in 0..3 {
                let unused = if give_back_window {
                    c.granted[d].saturating_sub(c.used[d])
                } else {
                    0
                };
                scope_args.push(unused.to_string());
            }
            let whole = if give_back_window { c.granted } else { [0; 3] };
            scope_args.extend(whole.map(|v| v.to_string()));
            scope_args.extend(capped(c.caps, asked));
            scope_args.extend(capped(c.caps, least));
            scope_args.push(next.to_string());
            let ahead_whole = if ahead_back { c.ahead } else { [0; 3] };
            scope_args.extend(ahead_whole.map(|v| v.to_string()));
            // At least what the request that did not fit needs: a lease renewed before its
            // first admission has no averages yet.
            let ahead_asked = if ask_ahead {
                sized(ahead_requests, need)
            } else {
                [0; 3]
            };
            scope_args.extend(capped(c.caps, ahead_asked));
            let grants = index(grant_key(prefix, user_id, scope));
            scope_args.push(grants.to_string());
            match ended {
                Some(g) => scope_args.extend(["1".to_string(), g.value()]),
                None => scope_args.extend(["0", ""].map(String::from)),
            }
            let asked_dims: Dims =
                std::array::from_fn(|d| if c.caps[d] > 0 { ahead_asked[d] } else { 0 });
            let far = (0..3).all(|d| {
                c.caps[d] == 0
                    || (asked_dims[d] > 0
                        && GRANT_CAP_RATIO * (c.counted[d] + c.granted[d] + 3 * asked_dims[d])
                            <= c.caps[d])
            });
            if ask_ahead && !(give_back || take || ahead_back || end_grant) && far {
                // Written for the minutes from the previous one on: its use, and this one's, may
                // be a grant's this instance lost track of (a call that failed), which the
                // field this overwrites covered.
                let old = c.grant;
                let dims = std::array::from_fn(|d| asked_dims[d].max(old.map_or(0, |g| g.dims[d])));
                let from = old.map_or(minute - 1, |g| g.from.min(minute - 1));
                let grant = Grant {
                    from,
                    to: minute + 1 + GRANT_MINUTES,
                    dims,
                };
                plain_asks.push(AheadAsk {
                    scope: scopes.len(),
                    windows: [prev, curr, next],
                    grants,
                    caps: c.caps,
                    grant,
                    kept: old.unwrap_or(Grant {
                        to: minute + 1,
                        ..grant
                    }),
                });
            } else {
                all_plain = false;
            }
            if give_back || take {
                // This minute's chunk starts again; the next minute's stays.
                c.minute = minute;
                c.granted = [0; 3];
                c.used = [0; 3];
                c.counted = [0; 3];
                c.standing = false;
            }
            if ahead_back {
                c.ahead = [0; 3];
            }
            c.ahead_asked |= ask_ahead;
            scopes.push(ScopeCall {
                scope: scope.clone(),
                renewed: give_back || take,
                ahead: ask_ahead,
                ended: before.filter(|_| end_grant),
            });
        }
        // The lease's clocks alone (its start time, the lots) are one plain command each, while
        // it holds a share and its set-aside settlements were booked within the last
        // reservation timeout: those then wait for a later call (see `TOP_UP_AT`).
        let clocks_plain = flags == 0
            || (s.held != [0, 0]
                && !s.recheck
                && (aside_paid == [0, 0] || now - s.booked < timeout_ms));
        // Only standing grants, far below their caps, and the clocks, with nothing to pay or
        // book but set-aside settlements: plain commands do it (`Shared::take_ahead`),
        // and the set-aside settlements wait for the next renewal that needs the script (the
        // share stays set aside in full until then, so the allowance errs high, never low).
        let plain = (plain_ahead
            && !woken
            && !exact
            && all_plain
            && (!plain_asks.is_empty() || flags != 0)
            && pending.is_empty()
            && paid == [0, 0]
            && settled == [0, 0]
            && late_fixes.is_empty()
            && items.is_empty()
            && ask == [0, 0]
            && clocks_plain
            && !urgent)
            .then(|| {
                s.held = held_before;
                s.aside_paid = aside_paid;
                PlainRenewal {
                    asks: plain_asks,
                    push: flags & 1 != 0,
                    lots: flags & 2 != 0,
                }
            });
        let aside_paid = if plain.is_some() {
            [0, 0]
        } else {
            // A script call in any case: it also does what would fall due on its own within
            // the next half period (`EARLY_BY`), so an account whose share is topped up more
            // often than that never needs a renewal of its own for it.
            flags |= s.clocks(now, timeout_ms, EARLY_BY);
            s.booked = now;
            s.recheck = false;
            aside_paid
        };
        if flags & 1 != 0 {
            s.refreshed = now;
        }
        if flags & 2 != 0 {
            s.lots_read = now;
        }
        s.need = [0; 3];
        args.extend([
            now.to_string(),
            self.id.clone(),
            s.limits.weekly_tokens.to_string(),
            s.limits.weekly_requests.to_string(),
            if s.unlimited { "1" } else { "0" }.to_string(),
            timeout_ms.to_string(),
            ACCOUNT_TTL_SECS.to_string(),
            SHARE.to_string(),
            s.inflight[0].to_string(),
            s.inflight[1].to_string(),
            free[0].to_string(),
            free[1].to_string(),
            ask[0].to_string(),
            ask[1].to_string(),
            least.to_string(),
            settled[0].to_string(),
            settled[1].to_string(),
            (items.len() / 3).to_string(),
            scopes.len().to_string(),
            flags.to_string(),
            aside_paid[0].to_string(),
            aside_paid[1].to_string(),
        ]);
        args.extend(items);
        args.extend(scope_args);
        let call = Call {
            kept: [s.inflight[0] + free[0], s.inflight[1] + free[1]],
            keys,
            args,
            scopes,
            idle,
            aside_paid,
            late_fixes,
            limits: (s.limits.weekly_tokens, s.limits.weekly_requests),
            plain,
            now,
        };
        Some((call, pending))
    }

    /// Applies a renewal's answer: `granted` on top of what was kept (or, in `exact` mode,
    /// only what admitted requests hold), the scopes' new chunks, and lets admission go on.
    /// True when the answer drained an account this instance was leasing (the other
    /// instances are then told, `Shared::signal_drain`).
    pub(super) fn finish(
        &self,
        user_id: &str,
        call: &Call,
        answer: Option<&Renewed>,
        now: i64,
    ) -> bool {
        let Some(cell) = self.cells.get(user_id).map(|c| c.clone()) else {
            return false;
        };
        let mut guard = cell.slot.lock();
        let s = &mut *guard;
        let newly_exact = matches!(answer, Some(r) if r.exact) && s.exact_until <= now;
        // Admission was paused: what is admitted now was admitted before the call, and some
        // of it may have settled since (still held, as pending).
        let holding = [0, 1].map(|i| s.inflight[i] + s.pending_cost[i]);
        match answer {
            Some(r) if r.exact => {
                s.held = holding;
                s.exact_until = now + EXACT_MS;
            }
            Some(r) => s.held = [call.kept[0] + r.granted[0], call.kept[1] + r.granted[1]],
            None => {
                s.held = holding;
                s.aside = false;
                s.exact_until = now + EXACT_MS;
                // Its chunks are forgotten (what the call gave back may or may not be); a
                // standing grant is kept, to be ended by a later call (it stands in Redis
                // whatever the call did, unless the call ended it), and so are the minutes
                // grants counted for (their settlements still to come).
                for c in s.chunks.values_mut() {
                    *c = c.bare(c.minute);
                }
                let minute = call.now.div_euclid(WINDOW_MS);
                for sc in &call.scopes {
                    if let (Some(g), Some(c)) = (sc.ended, s.chunks.get_mut(&sc.scope)) {
                        // Whole in Redis if the call did not run, cut back if it did: kept
                        // whole for what a later grant must cover, cut back for admission.
                        c.grant = Some(Grant {
                            to: g.to.min(minute + 1),
                            ..g
                        });
                    }
                }
                // The call may not have run: what it booked is sent again with the next one
                // (booked twice if it did run, so Redis's sums err high, never low), and so are
                // the window corrections that take room.
                for i in 0..2 {
                    s.aside_paid[i] += call.aside_paid[i];
                }
                for (scope, minute, by) in &call.late_fixes {
                    let by = by.map(|v| v.max(0));
                    if by != [0, 0] {
                        add_fix(&mut s.late_fixes, scope, *minute, by);
                    }
                }
            }
        }
        if let Some(r) = answer {
            s.aside = r.aside;
            s.aside_limits = call.limits;
            for (sc, answer) in call.scopes.iter().zip(&r.chunks) {
                let Some(c) = s.chunks.get_mut(&sc.scope) else {
                    continue;
                };
                if sc.renewed {
                    c.granted = answer.granted;
                    c.counted = answer.counted;
                }
                if sc.ahead {
                    c.ahead = answer.ahead;
                    c.ahead_counted = answer.ahead_counted;
                }
            }
        }
        s.last_renewal = now;
        s.renewing = false;
        s.chunks
            .retain(|_, c| c.holds() || now - c.last_used <= IDLE_MS);
        let gone = call.idle
            && s.held == [0, 0]
            && s.pending.is_empty()
            && s.chunks.is_empty()
            && s.aside_paid == [0, 0]
            && s.late_fixes.is_empty();
        drop(guard);
        cell.renewed.notify_waiters();
        if gone {
            self.cells.remove_if(user_id, |_, c| {
                let s = c.slot.lock();
                !s.renewing
                    && s.held == [0, 0]
                    && s.inflight == [0, 0]
                    && s.pending.is_empty()
                    && s.aside_paid == [0, 0]
            });
        }
        newly_exact
    }

    /// Applies what `Shared::take_ahead` found for a `plain` call. Nothing else of the lease
    /// changes (it paid and booked nothing).
    pub(super) fn finish_ahead(&self, user_id: &str, call: &Call, answer: &PlainAnswer) {
        let Some(cell) = self.cells.get(user_id).map(|c| c.clone()) else {
            return;
        };
        let mut guard = cell.slot.lock();
        let s = &mut *guard;
        if let Some(only) = &call.plain {
            for (ask, grant) in only.asks.iter().zip(&answer.grants) {
                let scope = &call.scopes[ask.scope].scope;
                if let (Some(c), Some(grant)) = (s.chunks.get_mut(scope), grant) {
                    c.stand(*grant);
                }
            }
        }
        if answer.lease_gone {
            s.recheck = true;
            s.refreshed = 0;
        }
        s.last_renewal = call.now;
        s.renewing = false;
        drop(guard);
        cell.renewed.notify_waiters();
    }

    pub(super) fn due(&self, now: i64, timeout_ms: i64, booking: bool) -> Vec<String> {
        use std::sync::atomic::Ordering::Relaxed;
        let closing = self.closing.load(Relaxed);
        // A clock round at most every `CLOCK_EVERY_MS` (rounds come from one task).
        let clock = now >= self.next_clock.load(Relaxed);
        if clock {
            self.next_clock.store(now + CLOCK_EVERY_MS, Relaxed);
        }
        self.cells
            .iter()
            .filter(|e| {
                e.value()
                    .slot
                    .lock()
                    .due(now, timeout_ms, closing, booking, clock)
            })
            .map(|e| e.key().clone())
            .collect()
    }

    /// The instance is stopping: the next round gives every lease back (`Slot::due`).
    pub(super) fn close(&self) {
        self.closing
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether any lease still holds something or has something to book (a graceful stop
    /// waits until none does).
    pub(super) fn holding(&self) -> bool {
        let closing = self.closing.load(std::sync::atomic::Ordering::Relaxed);
        self.cells.iter().any(|e| {
            let s = e.value().slot.lock();
            s.renewing || s.due(now_ms(), i64::MAX, closing, true, true)
        })
    }

    /// Whether this instance holds any lease (the drain poll is skipped otherwise).
    pub(super) fn any(&self) -> bool {
        !self.cells.is_empty()
    }

    /// `user_id` was drained lately: a lease still holding an unused share or chunk gives it
    /// back at the next round (its renewal finds the account drained).
    pub(super) fn drained(&self, user_id: &str) {
        if let Some(cell) = self.cells.get(user_id) {
            let mut s = cell.slot.lock();
            let minute = now_ms().div_euclid(WINDOW_MS);
            let chunk = s.chunks.values().any(|c| {
                (c.minute == minute
                    && ((0..3).any(|d| c.granted[d] > c.used[d]) || c.ahead != [0; 3]))
                    || c.grant.is_some()
            });
            if s.free() != [0, 0] || chunk {
                s.wake = true;
            }
        }
    }
}

/// What of a settlement's token correction (actual − charged) its window must still hear of.
/// Within the minute's chunk the window already counts the whole chunk: the difference moves
/// the chunk's own use (less used leaves room for more, more used takes room), and Redis hears
/// of it only when the chunk cannot take it.
fn window_fix(chunks: &mut HashMap<String, Chunk>, t: &Ticket, used: Used) -> [i64; 2] {
    let caps = [t.plan.itpm, t.plan.otpm];
    if caps == [0, 0] {
        return [0, 0];
    }
    let mut by = [
        used.input_tokens as i64 - t.input_cost as i64,
        used.output_tokens as i64 - t.output_cost as i64,
    ];
    let Some(c) = chunks.get_mut(t.plan.scope.as_str()) else {
        (0..2).filter(|d| caps[*d] == 0).for_each(|d| by[d] = 0);
        return by;
    };
    let (from, to) = c.granted_minutes;
    if from <= t.minute && t.minute < to && !(c.minute == t.minute && c.standing) {
        // A grant counted the charge, not the window: the window cannot give back what it
        // never held.
        by = by.map(|v| v.max(0));
    }
    match Some(c).filter(|c| c.minute == t.minute && c.granted != [0; 3]) {
        Some(c) => {
            for d in 0..2 {
                let dim = d + 1;
                if caps[d] == 0 {
                    by[d] = 0;
                } else if by[d] <= 0 {
                    c.used[dim] = c.used[dim].saturating_sub(by[d].unsigned_abs());
                    by[d] = 0;
                } else if c.used[dim] + by[d] as u64 <= c.granted[dim] {
                    c.used[dim] += by[d] as u64;
                    by[d] = 0;
                }
            }
        }
        None => (0..2).filter(|d| caps[*d] == 0).for_each(|d| by[d] = 0),
    }
    by
}

/// Adds a correction to the list, one entry per window: the script's work does not grow with
/// the traffic.
fn add_fix(fixes: &mut Vec<Fix>, scope: &str, minute: i64, by: [i64; 2]) {
    match fixes.iter_mut().find(|f| f.0 == scope && f.1 == minute) {
        Some(f) => (0..2).for_each(|d| f.2[d] += by[d]),
        None => fixes.push((scope.to_string(), minute, by)),
    }
}

/// What a renewal answered for one scope: the chunk granted for this minute and its window's
/// count before it, the same for the next minute's chunk asked ahead.
#[derive(Default)]
struct ChunkAnswer {
    granted: Dims,
    counted: Dims,
    ahead: Dims,
    ahead_counted: Dims,
}

/// A renewal's answer.
pub(super) struct Renewed {
    exact: bool,
    /// The lease is set aside from the allowance (see `Slot::aside`).
    aside: bool,
    granted: [u64; 2],
    pub(super) weekly: u64,
    /// The highest lot tier; `None`: the lots were not read (keep what was known).
    pub(super) top: Option<Option<Tier>>,
    pub(super) first: bool,
    pub(super) paid: Paid,
    chunks: Vec<ChunkAnswer>,
}

pub(super) fn parse(reply: &[RedisValue]) -> Option<Renewed> {
    let num = |i: usize| reply.get(i).and_then(as_i64).unwrap_or(0).max(0) as u64;
    let array = |i: usize| match reply.get(i) {
        Some(RedisValue::Array(a)) => a.clone(),
        _ => vec![],
    };
    let mode = reply.first().and_then(as_string)?;
    let chunks = array(7)
        .iter()
        .map(|v| {
            let RedisValue::Array(a) = v else {
                return ChunkAnswer::default();
            };
            let n = |i: usize| a.get(i).and_then(as_i64).unwrap_or(0).max(0) as u64;
            ChunkAnswer {
                granted: [n(0), n(1), n(2)],
                counted: [n(3), n(4), n(5)],
                ahead: [n(6), n(7), n(8)],
                ahead_counted: [n(9), n(10), n(11)],
            }
        })
        .collect();
    Some(Renewed {
        exact: mode == "exact",
        aside: num(8) == 1,
        granted: [num(1), num(2)],
        weekly: num(3),
        top: match reply.get(4).and_then(as_i64) {
            Some(-2) => None,
            t => Some(t.and_then(Tier::from_index)),
        },
        first: num(5) == 1,
        paid: Paid::read(&array(6)),
        chunks,
    })
}

/// What one renewal paid for all its settlements together: from the week's allowance (`room`),
/// then lots soonest-expiring first, then what nothing covered, booked on the allowance all the
/// same (`over`), per dimension (tokens, requests).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Paid {
    room: [u64; 2],
    lots: Vec<(String, LotKind, u64)>,
    over: [u64; 2],
}

impl Paid {
    /// From `lease.lua`'s answer: room tokens, room requests, uncovered tokens, uncovered
    /// requests, then (lot id, kind, amount) triples.
    fn read(items: &[RedisValue]) -> Paid {
        let num = |i: usize| items.get(i).and_then(as_i64).unwrap_or(0).max(0) as u64;
        let lots = items
            .get(4..)
            .unwrap_or_default()
            .chunks_exact(3)
            .map(|t| {
                let kind = if as_string(&t[1]).as_deref() == Some("r") {
                    LotKind::Request
                } else {
                    LotKind::Token
                };
                let id = as_string(&t[0]).unwrap_or_default();
                (id, kind, as_i64(&t[2]).unwrap_or(0).max(0) as u64)
            })
            .collect();
        Paid {
            room: [num(0), num(1)],
            lots,
            over: [num(2), num(3)],
        }
    }

    /// Each settlement's share, `amounts` being (tokens, requests) in the order they were
    /// settled: what paying them one by one would have given each (allowance first, then
    /// lots, then the uncovered rest on the allowance), since a sum paid in that order splits
    /// at the same points.
    pub(super) fn split(&self, user_id: &str, amounts: &[[u64; 2]], now: i64) -> Vec<Breakdown> {
        let kinds = [LotKind::Token, LotKind::Request];
        let mut room = self.room;
        let mut over = self.over;
        let mut lots: [Vec<(&str, u64)>; 2] = kinds.map(|kind| {
            self.lots
                .iter()
                .filter(|l| l.1 == kind)
                .map(|l| (l.0.as_str(), l.2))
                .collect()
        });
        let mut next_lot = [0usize; 2];
        amounts
            .iter()
            .map(|amount| {
                let mut b = Breakdown {
                    user_id: user_id.to_string(),
                    at_ms: now,
                    ..Breakdown::default()
                };
                for d in 0..2 {
                    let mut need = amount[d];
                    let from_room = need.min(room[d]);
                    room[d] -= from_room;
                    need -= from_room;
                    let mut on_allowance = from_room;
                    while need > 0 && next_lot[d] < lots[d].len() {
                        let (id, left) = &mut lots[d][next_lot[d]];
                        let n = need.min(*left);
                        *left -= n;
                        need -= n;
                        if n > 0 {
                            b.lots.push((id.to_string(), kinds[d], n));
                        }
                        if *left == 0 {
                            next_lot[d] += 1;
                        }
                    }
                    over[d] = over[d].saturating_sub(need);
                    on_allowance += need;
                    if d == 0 {
                        b.allowance_tokens = on_allowance;
                    } else {
                        b.allowance_requests = on_allowance;
                    }
                }
                b
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::{
        grant_key, rate_key, Call, Cell, Chunk, Grant, Leases, Paid, PlainAnswer, GRANT_MINUTES,
        IDLE_MS, WINDOW_MS,
    };
    use crate::config::TierLimits;
    use crate::domain::{Breakdown, LotKind};
    use crate::quota::{RatePlan, Ticket, Used};

    #[test]
    fn a_request_just_after_a_renewal_is_not_read_as_a_burst() {
        // One request 5 ms after the last renewal, at an account resting at one a second.
        let rate = super::decayed_rate(1.0, 1, 5);
        assert!(rate < 2.0, "{rate}");
        // The same request over a whole second reads as the same rate.
        assert!((super::decayed_rate(1.0, 1, 1_000) - 1.0).abs() < 1e-9);
        // A lease's first renewal (nothing before it) counts from the epoch: nothing yet.
        assert!(super::decayed_rate(0.0, 3, crate::util::now_ms()) < 1e-6);
    }

    #[test]
    fn the_rate_follows_steady_traffic_whatever_the_renewals_pace() {
        // 200 requests a second, renewed every 20 ms or every second: both settle near 200.
        for (every_ms, per_renewal) in [(20, 4), (1_000, 200)] {
            let mut rate = 0.0;
            for _ in 0..(20_000 / every_ms) {
                rate = super::decayed_rate(rate, per_renewal, every_ms);
            }
            assert!((rate - 200.0).abs() < 1.0, "every {every_ms} ms: {rate}");
        }
        // Traffic that stops: the estimate falls away within seconds.
        let quiet = super::decayed_rate(200.0, 0, 10_000);
        assert!(quiet < 10.0, "{quiet}");
    }

    /// A lease on account `u` set aside with weekly limits (10,000 tokens, unlimited requests),
    /// holding 1,000 tokens and 10 requests, one request of 100 tokens admitted.
    fn set_aside_lease() -> Leases {
        let leases = Leases::new("test");
        let cell = Arc::new(Cell::default());
        {
            let mut s = cell.slot.lock();
            s.aside = true;
            s.aside_limits = (10_000, 0);
            s.held = [1_000, 10];
            s.inflight = [100, 1];
            s.last_used = crate::util::now_ms();
            s.refreshed = s.last_used;
        }
        leases.cells.insert("u".into(), cell);
        leases
    }

    fn ticket(weekly_tokens: u64) -> Ticket {
        Ticket {
            id: "r1".into(),
            user_id: "u".into(),
            tokens: 100,
            requests: 1,
            input_cost: 40,
            output_cost: 60,
            weights: Default::default(),
            minute: 0,
            plan: RatePlan {
                scope: "acct:u".into(),
                rpm: 0,
                itpm: 0,
                otpm: 0,
            },
            limits: TierLimits {
                weekly_tokens,
                ..TierLimits::default()
            },
            unlimited: false,
            in_process: false,
            leased: true,
        }
    }

    /// Settles `ticket(weekly_tokens)` into the lease; the breakdown if it was paid at once.
    fn settle(leases: &Leases, weekly_tokens: u64) -> Option<Breakdown> {
        let paid = Arc::new(Mutex::new(None));
        let sink = paid.clone();
        let used = Used {
            input_tokens: 40,
            output_tokens: 20,
            cached_input_tokens: 0,
        };
        let on_paid = Box::new(move |b: Breakdown| *sink.lock().unwrap() = Some(b));
        assert!(leases.settle(ticket(weekly_tokens), used, on_paid).is_ok());
        let b = paid.lock().unwrap().take();
        b
    }

    #[test]
    fn a_first_share_and_chunk_are_sized_from_the_request_that_did_not_fit() {
        // No admission yet (no averages); the request that did not fit needs 79 quota tokens,
        // 15 input and 64 output tokens: the weekly share covers 128 such requests, the chunk
        // 32.
        let leases = Leases::new("test");
        let cell = Arc::new(Cell::default());
        let now = crate::util::now_ms();
        {
            let mut s = cell.slot.lock();
            s.need = [79, 15, 64];
            s.last_used = now;
            s.chunks.insert(
                "acct:u".into(),
                super::Chunk {
                    caps: [100, 10_000, 10_000],
                    last_used: now,
                    ..Default::default()
                },
            );
        }
        leases.cells.insert("u".into(), cell);
        let (call, _) = leases
            .begin("p:", "u", 900_000, now, true)
            .expect("renewal");
        assert_eq!(call.args[12..14], ["10112".to_string(), "128".to_string()]);
        // The scope's arguments follow the 22 fixed ones; the chunk asked for is at 12..15
        // (its tokens at twice the estimate: real use moves the chunk's count).
        assert_eq!(call.args[34..37], ["32", "960", "4096"].map(String::from));
    }

    #[test]
    fn a_set_aside_settlement_is_the_allowances_at_once_unless_the_limits_fell() {
        let leases = set_aside_lease();
        let b = settle(&leases, 10_000).expect("paid at once");
        assert_eq!((b.allowance_tokens, b.allowance_requests), (60, 1));
        assert!(b.lots.is_empty());
        // A config reload lowered the weekly allowance: the next renewal splits it.
        let leases = set_aside_lease();
        assert!(settle(&leases, 5_000).is_none());
        assert_eq!(leases.cells.get("u").unwrap().slot.lock().pending.len(), 1);
    }

    #[test]
    fn a_failed_renewal_gives_its_set_aside_settlements_back_to_be_booked() {
        let leases = set_aside_lease();
        settle(&leases, 10_000).expect("paid at once");
        let now = crate::util::now_ms();
        {
            let cell = leases.cells.get("u").unwrap().clone();
            let s = cell.slot.lock();
            assert_eq!(s.aside_paid, [60, 1]);
            assert!(
                !s.due(now, 900_000, false, true, true),
                "set-aside cost waits"
            );
        }
        let (call, pending) = leases
            .begin("p:", "u", 900_000, now, true)
            .expect("renewal");
        assert!(pending.is_empty());
        assert_eq!(call.aside_paid, [60, 1]);
        assert_eq!(call.args[20..22], ["60".to_string(), "1".to_string()]);
        // Redis did not answer: the cost comes back, due at once while Redis answers.
        leases.finish("u", &call, None, now);
        let cell = leases.cells.get("u").unwrap().clone();
        let s = cell.slot.lock();
        assert_eq!(s.aside_paid, [60, 1]);
        assert!(!s.aside);
        assert!(
            s.due(now, 900_000, false, true, false),
            "sent again at any round"
        );
        assert!(
            !s.due(now, 900_000, false, false, true),
            "not during an outage"
        );
    }

    #[test]
    fn clock_work_waits_for_a_clock_round_and_traffic_work_does_not() {
        let leases = set_aside_lease();
        let now = crate::util::now_ms();
        // The lease's start time is due to be pushed back (a third of the timeout passed).
        leases.cells.get("u").unwrap().slot.lock().refreshed = now - 301_000;
        assert_eq!(
            leases.due(now, 900_000, true),
            ["u"],
            "the first round is a clock round"
        );
        assert!(
            leases.due(now + 100, 900_000, true).is_empty(),
            "the next is not"
        );
        assert!(leases.due(now + 999, 900_000, true).is_empty());
        assert_eq!(
            leases.due(now + 1_000, 900_000, true),
            ["u"],
            "a second later it is"
        );
        // A settlement waiting to be paid (the limits fell since the lease was set aside) is
        // due at every round.
        assert!(settle(&leases, 5_000).is_none());
        assert_eq!(leases.due(now + 1_100, 900_000, true), ["u"]);
    }

    #[test]
    fn a_chunk_covers_the_spread_of_random_arrivals_not_only_their_average() {
        use super::with_spread;
        assert_eq!(with_spread(0.0), 0.0);
        // 30 a minute on average: more than 32 in about a third of minutes, more than 47 in
        // under one in three hundred.
        assert!(
            (46.0..47.0).contains(&with_spread(30.0)),
            "{}",
            with_spread(30.0)
        );
        // A busy account's chunk grows by a few percent only.
        let busy = with_spread(90_000.0);
        assert!(busy > 90_000.0 && busy < 91_000.0, "{busy}");
    }

    #[test]
    fn a_short_share_with_seconds_of_traffic_left_waits_for_the_clock_round() {
        let leases = set_aside_lease();
        let now = crate::util::now_ms();
        assert_eq!(leases.due(now, 900_000, true), Vec::<String>::new());
        let cell = leases.cells.get("u").unwrap().clone();
        {
            let mut s = cell.slot.lock();
            // Sized for 128 requests of 100 tokens; 10 requests and 900 tokens left, under a
            // quarter: short. At a request every two seconds that is 20 s of traffic.
            s.top_up = [3_200, 32];
            s.admitted = 1;
            s.avg_tokens = 100.0;
            s.rate_per_s = 0.5;
            s.last_renewal = now - 2_000;
        }
        assert!(
            leases.due(now + 100, 900_000, true).is_empty(),
            "not a clock round: it waits"
        );
        assert_eq!(
            leases.due(now + 1_000, 900_000, true),
            ["u"],
            "topped up in the clock round"
        );
        // At ten requests a second the same share lasts one second: topped up at once.
        cell.slot.lock().rate_per_s = 10.0;
        assert_eq!(leases.due(now + 1_100, 900_000, true), ["u"]);
        // So does a burst since the last renewal, whatever the estimate said.
        {
            let mut s = cell.slot.lock();
            s.rate_per_s = 0.5;
            s.admitted = 20;
        }
        assert_eq!(leases.due(now + 1_200, 900_000, true), ["u"]);
        // One request a moment after a renewal is no burst: it waits for the clock round.
        {
            let mut s = cell.slot.lock();
            s.admitted = 1;
            s.last_renewal = now + 1_250;
        }
        assert!(leases.due(now + 1_300, 900_000, true).is_empty());
    }

    fn lot(id: &str, kind: LotKind, n: u64) -> (String, LotKind, u64) {
        (id.to_string(), kind, n)
    }

    #[test]
    fn a_sum_paid_splits_as_if_each_settlement_had_been_paid_alone() {
        // 100 tokens of allowance left, then lot a (50 tokens), lot b (30), then 20 uncovered;
        // requests: 2 of allowance, then lot r (1).
        let paid = Paid {
            room: [100, 2],
            lots: vec![
                lot("a", LotKind::Token, 50),
                lot("r", LotKind::Request, 1),
                lot("b", LotKind::Token, 30),
            ],
            over: [20, 0],
        };
        let b = paid.split("u", &[[60, 1], [70, 1], [70, 1]], 7);
        let shares: Vec<_> = b
            .iter()
            .map(|b| (b.allowance_tokens, b.allowance_requests, b.lots.clone()))
            .collect();
        assert_eq!(
            shares,
            vec![
                (60, 1, vec![]),
                (40, 1, vec![lot("a", LotKind::Token, 30)]),
                (
                    20,
                    0,
                    vec![
                        lot("a", LotKind::Token, 20),
                        lot("b", LotKind::Token, 30),
                        lot("r", LotKind::Request, 1),
                    ]
                ),
            ]
        );
        assert!(b.iter().all(|b| b.user_id == "u" && b.at_ms == 7));
        let total: u64 = b
            .iter()
            .map(|b| {
                b.allowance_tokens
                    + b.lots
                        .iter()
                        .filter(|l| l.1 == LotKind::Token)
                        .map(|l| l.2)
                        .sum::<u64>()
            })
            .sum();
        assert_eq!(total, 200, "every token paid once");
    }

    #[test]
    fn a_script_renewal_pushes_the_start_time_back_and_reads_the_lots_early() {
        // The set-aside lease has 9 of its share's 128 requests left: a top-up, a script call.
        // Its start time was pushed back and the lots read `ago` ms before; the reservation
        // timeout is 900 s (a push due every 300 s, early from 150 s).
        for (ago, flags) in [(200_000, "3"), (100_000, "0")] {
            let leases = set_aside_lease();
            let now = crate::util::now_ms();
            {
                let cell = leases.cells.get("u").unwrap().clone();
                let mut s = cell.slot.lock();
                s.refreshed = now - ago;
                s.lots_read = now - ago;
            }
            let (call, _) = leases.begin("p:", "u", 900_000, now, true).unwrap();
            assert!(call.plain.is_none());
            assert_eq!(call.args[19], flags, "{ago} ms ago");
            let cell = leases.cells.get("u").unwrap().clone();
            let s = cell.slot.lock();
            let done = if flags == "3" { now } else { now - ago };
            assert_eq!((s.refreshed, s.lots_read), (done, done));
        }
        // A renewal that only takes the next minute's chunk with plain commands stays so.
        let (leases, call, now) = renewal_ahead(600, true);
        assert!(call.plain.is_some());
        assert_eq!(call.args[19], "0");
        let cell = leases.cells.get("u").unwrap().clone();
        assert_eq!(cell.slot.lock().refreshed, now - 200_000);
    }

    /// A set-aside lease with plenty left, one settlement made within its share, its start time
    /// pushed back and its lots read 301 s before (the reservation timeout is 900 s), its
    /// set-aside settlements last booked `booked_ago` ms before, last used `used_ago` ms before:
    /// its renewal.
    fn clocks_due(booked_ago: i64, used_ago: i64, plain: bool) -> (Leases, Call, i64) {
        let leases = set_aside_lease();
        let now = crate::util::now_ms();
        {
            let cell = leases.cells.get("u").unwrap().clone();
            let mut s = cell.slot.lock();
            s.held = [1_000_000, 1_000];
            s.inflight = [0, 0];
            s.last_used = now - used_ago;
            s.refreshed = now - 301_000;
            s.lots_read = now - 301_000;
            s.booked = now - booked_ago;
            s.aside_paid = [79, 1];
            assert!(
                s.due(now, 900_000, false, true, true),
                "the start time is due"
            );
            assert!(
                !s.due(now, 900_000, false, true, false),
                "at a clock round only"
            );
        }
        let (call, pending) = leases.begin("p:", "u", 900_000, now, plain).unwrap();
        assert!(pending.is_empty());
        (leases, call, now)
    }

    #[test]
    fn the_clocks_alone_are_plain_commands_until_a_booking_is_due() {
        let (leases, call, now) = clocks_due(100_000, 1_000, true);
        let only = call.plain.as_ref().expect("plain commands");
        assert!(only.asks.is_empty());
        assert!(only.push && only.lots);
        assert_eq!(call.start_times(), "p:q:{u}:rat");
        assert_eq!(call.lots(), "p:q:{u}:lots");
        assert_eq!(call.aside_paid, [0, 0]);
        {
            let cell = leases.cells.get("u").unwrap().clone();
            let s = cell.slot.lock();
            // The settlement waits to be booked; both clocks start again.
            assert_eq!(s.aside_paid, [79, 1]);
            assert_eq!(s.held, [1_000_000, 1_000]);
            assert_eq!(
                (s.refreshed, s.lots_read, s.booked),
                (now, now, now - 100_000)
            );
        }
        leases.finish_ahead("u", &call, &PlainAnswer::default());
        assert!(!leases.cells.get("u").unwrap().slot.lock().renewing);

        // The push found the lease released by the sweep: the next round runs the script.
        let (leases, call, now) = clocks_due(100_000, 1_000, true);
        let gone = PlainAnswer {
            lease_gone: true,
            ..PlainAnswer::default()
        };
        leases.finish_ahead("u", &call, &gone);
        assert!(leases
            .cells
            .get("u")
            .unwrap()
            .slot
            .lock()
            .due(now, 900_000, false, true, false));
        let (call, _) = leases.begin("p:", "u", 900_000, now + 100, true).unwrap();
        assert!(call.plain.is_none());
        assert_eq!(call.aside_paid, [79, 1]);

        // A reservation timeout since the last booking: the script books it, and the clocks.
        let (leases, call, now) = clocks_due(900_000, 1_000, true);
        assert!(call.plain.is_none());
        assert_eq!(call.aside_paid, [79, 1]);
        assert_eq!(call.args[19], "3");
        assert_eq!(leases.cells.get("u").unwrap().slot.lock().booked, now);

        // On a cluster, and for an idle lease (given back), the script does it all.
        assert!(clocks_due(100_000, 1_000, false).1.plain.is_none());
        assert!(clocks_due(100_000, 400_000, true).1.plain.is_none());
    }

    #[test]
    fn nothing_settled_splits_into_nothing() {
        assert!(Paid::default().split("u", &[], 0).is_empty());
    }

    /// A set-aside lease in the second half of a minute, its chunk of `rpm` used once and one
    /// settlement made within the share, its start time pushed back 200 s ago: its renewal asks
    /// only for the next minute's chunk.
    fn renewal_ahead(rpm: u64, plain_ahead: bool) -> (Leases, Call, i64) {
        let leases = set_aside_lease();
        let minute = 29_000_000;
        let now = minute * WINDOW_MS + 40_000;
        {
            let cell = leases.cells.get("u").unwrap().clone();
            let mut s = cell.slot.lock();
            s.held = [1_000_000, 1_000];
            s.last_used = now;
            // Not due on their own yet, but early enough for a script call to do them.
            s.refreshed = now - 200_000;
            s.lots_read = now - 200_000;
            s.aside_paid = [79, 1];
            s.chunks.insert(
                "acct:u".into(),
                Chunk {
                    minute,
                    caps: [rpm, 0, 0],
                    granted: [32, 0, 0],
                    used: [1, 0, 0],
                    last_used: now,
                    ..Chunk::default()
                },
            );
        }
        let (call, pending) = leases.begin("p:", "u", 900_000, now, plain_ahead).unwrap();
        assert!(pending.is_empty());
        (leases, call, now)
    }

    #[test]
    fn a_renewal_that_only_takes_a_standing_grant_books_nothing() {
        let (leases, call, now) = renewal_ahead(600, true);
        let only = call.plain.as_ref().expect("plain commands");
        assert_eq!(only.asks.len(), 1);
        let minute = now.div_euclid(WINDOW_MS);
        // From the previous minute to GRANT_MINUTES after the next one.
        let grant = Grant {
            from: minute - 1,
            to: minute + 1 + GRANT_MINUTES,
            dims: [32, 0, 0],
        };
        assert_eq!(only.asks[0].grant, grant);
        assert_eq!(
            call.window(only.asks[0].grants),
            grant_key("p:", "u", "acct:u")
        );
        let next = call.window(only.asks[0].windows[2]);
        assert_eq!(next, rate_key("p:", "u", "acct:u", minute + 1));
        assert_eq!(call.aside_paid, [0, 0]);
        {
            // The set-aside settlement waits for the next script call; the share is unchanged.
            let cell = leases.cells.get("u").unwrap().clone();
            let s = cell.slot.lock();
            assert_eq!(s.aside_paid, [79, 1]);
            assert_eq!(s.held, [1_000_000, 1_000]);
        }
        let answer = PlainAnswer {
            grants: vec![Some(grant)],
            ..PlainAnswer::default()
        };
        leases.finish_ahead("u", &call, &answer);
        let cell = leases.cells.get("u").unwrap().clone();
        let mut s = cell.slot.lock();
        assert!(!s.renewing);
        let c = s.chunks.get_mut("acct:u").unwrap();
        assert_eq!(c.grant, Some(grant));
        // Each following minute's chunk is the grant's, and none is asked for until the grant
        // nears its end.
        let later = (minute + 1) * WINDOW_MS + 40_000;
        assert!(!c.wants_ahead(later, false));
        assert!(c.roll(minute + 1));
        assert!(c.standing);
        assert_eq!(c.granted, [32, 0, 0]);
        let near_end = (minute + GRANT_MINUTES - 1) * WINDOW_MS + 40_000;
        c.last_used = near_end;
        assert!(c.wants_ahead(near_end, false));
    }

    #[test]
    fn a_grant_ends_cut_back_to_the_minutes_it_counted() {
        let leases = set_aside_lease();
        let minute = 29_000_000;
        let now = minute * WINDOW_MS + 10_000;
        let grant = Grant {
            from: minute - 3,
            to: minute + 8,
            dims: [32, 0, 0],
        };
        {
            let cell = leases.cells.get("u").unwrap().clone();
            let mut s = cell.slot.lock();
            s.held = [1_000_000, 1_000];
            // Idle: the lease and its chunks are given back.
            s.last_used = now - IDLE_MS - 1;
            let mut c = Chunk {
                minute: minute - 1,
                caps: [600, 0, 0],
                last_used: now - IDLE_MS - 1,
                ..Chunk::default()
            };
            c.stand(grant);
            assert!(c.roll(minute));
            c.used = [5, 0, 0];
            s.chunks.insert("acct:u".into(), c);
        }
        let (call, _) = leases.begin("p:", "u", 900_000, now, true).unwrap();
        assert!(call.plain.is_none());
        // The scope's arguments follow the 22 fixed ones: nothing given back to the window (the
        // grant counted the chunk, not the window), the grant cut back to the minutes up to
        // this one, whose use it keeps counting.
        let scope = &call.args[22..];
        assert_eq!(scope[5], "0");
        let grants: usize = scope[25].parse().unwrap();
        assert_eq!(call.window(grants), grant_key("p:", "u", "acct:u"));
        assert_eq!(
            &scope[26..28],
            ["1", &format!("{},{},32,0,0", minute - 3, minute + 1)]
        );
        assert_eq!(scope.len(), 28);
        let cell = leases.cells.get("u").unwrap().clone();
        let s = cell.slot.lock();
        let c = &s.chunks["acct:u"];
        assert_eq!(c.grant, None);
        // A settlement of these minutes that used less than charged cannot take the difference
        // off a window that never counted it.
        assert_eq!(c.granted_minutes, (minute - 3, minute + 1));
    }

    #[test]
    fn a_minute_skipped_still_asks_for_the_next_minutes_chunk() {
        let minute = 29_000_000;
        let late = |m: i64| m * WINDOW_MS + 40_000;
        // Used last minute, which took this minute's chunk ahead; nothing this minute yet.
        let skipped = Chunk {
            minute,
            caps: [600, 0, 0],
            granted: [32, 0, 0],
            used: [3, 0, 0],
            last_used: minute * WINDOW_MS + 20_000,
            ahead: [32, 0, 0],
            ahead_asked: true,
            ..Chunk::default()
        };
        assert!(
            skipped.wants_ahead(late(minute + 1), false),
            "before the roll"
        );
        let mut rolled = skipped.clone();
        assert!(rolled.roll(minute + 1));
        assert!(
            rolled.wants_ahead(late(minute + 1), false),
            "after the roll"
        );
        assert!(
            !rolled.wants_ahead(minute * WINDOW_MS + 60_000 + 10_000, false),
            "first half"
        );
        // Unused two minutes running: the chunk it holds is the last one asked for.
        let mut idle = rolled.clone();
        idle.ahead = [32, 0, 0];
        idle.ahead_asked = true;
        assert!(!idle.wants_ahead(late(minute + 2), false));
        assert!(idle.roll(minute + 2));
        assert!(!idle.wants_ahead(late(minute + 2), false));
        // No chunk this minute (none was taken ahead): the request that comes takes one.
        let none = Chunk {
            ahead: [0; 3],
            ahead_asked: false,
            ..skipped
        };
        assert!(!none.wants_ahead(late(minute + 1), false));
    }

    #[test]
    fn a_next_minutes_chunk_near_its_cap_or_on_a_cluster_goes_through_the_script() {
        // Near its cap, or where the caller runs every renewal as a script (a Redis Cluster).
        for (rpm, plain_ahead) in [(100, true), (600, false)] {
            let (leases, call, _) = renewal_ahead(rpm, plain_ahead);
            assert!(call.plain.is_none());
            assert_eq!(call.aside_paid, [79, 1], "booked by this call");
            assert_eq!(call.args[19], "3", "the start time and the lots, early");
            let cell = leases.cells.get("u").unwrap().clone();
            assert_eq!(cell.slot.lock().aside_paid, [0, 0]);
        }
    }
}
