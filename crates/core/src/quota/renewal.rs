//! The Redis engine's side of leases: admission against this instance's lease on an account,
//! settlement into it, and the periodic `lease.lua` call that pays, gives back and renews
//! (the bookkeeping itself is `lease`).

use std::pin::pin;

use redis::Value as RedisValue;
use tokio::sync::oneshot;

use super::lease::{Admit, Call, Renewed, WAIT_FOR_RENEWAL};

/// Accounts renewed in one script call at most (one Redis): bounds how long one call holds
/// Redis.
const BATCH: usize = 256;
use super::scripts::{as_string, on_allowance};
use super::shared::{LoadError, Shared, Unreachable};
use super::{Later, OnPaid, RatePlan, Reservation, Ticket, Used};
use crate::config::QuotaConfig;
use crate::domain::Breakdown;
use crate::identity::Identity;
use crate::pricing::Weights;
use crate::storage::Db;
use crate::util::now_ms;

impl Shared {
    /// Admission against this instance's lease on the account. `None`: reserve the request on
    /// its own (`reserve.lua`): the account is new here, drained, or its lease could not grow.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn reserve_leased(
        &self,
        db: &Db,
        cfg: &QuotaConfig,
        who: &Identity,
        id: &str,
        input: u64,
        output: u64,
        weights: Weights,
    ) -> Option<Result<Reservation, Unreachable>> {
        if !self.hints.contains_key(&who.user.id) {
            // First sight on this instance: the exact path loads the account and its tier.
            return None;
        }
        let limits = *cfg.limits(self.tier_for(cfg, who));
        let plan = RatePlan::for_key(who, &limits);
        for _ in 0..3 {
            match self
                .leases
                .admit(&plan, &limits, who, id, input, output, weights, now_ms())
            {
                Admit::Granted(r) => return Some(Ok(*r)),
                Admit::Exact => return None,
                Admit::Wait(cell) => {
                    let mut renewed = pin!(cell.renewed.notified());
                    renewed.as_mut().enable();
                    if cell.slot.lock().renewing {
                        let _ = tokio::time::timeout(WAIT_FOR_RENEWAL, renewed).await;
                    }
                }
                Admit::Renew => {
                    let timeout_ms = cfg.reservation_timeout.as_millis() as i64;
                    // Boxed: a renewal's state is large and rare on the request path; inline,
                    // every request's future would carry (and move) room for it.
                    if let Err(e) = Box::pin(self.renew(db, &who.user.id, timeout_ms)).await {
                        return Some(Err(e));
                    }
                }
            }
        }
        None
    }

    /// Settles a request admitted against a lease without waiting: `on_paid` gets its
    /// breakdown when the lease's next renewal has paid it. `Err` gives `on_paid` back when
    /// there is no lease (cannot happen while the request is admitted).
    pub(super) fn settle_into_lease(
        &self,
        t: Ticket,
        used: Used,
        on_paid: OnPaid,
    ) -> Result<(), Later> {
        self.leases.settle(t, used, on_paid)
    }

    /// Settles a request admitted against a lease and waits until it is paid.
    pub(super) async fn settle_leased(&self, db: &Db, t: &Ticket, used: Used) -> Breakdown {
        let now = now_ms();
        let (tx, rx) = oneshot::channel();
        let on_paid: OnPaid = Box::new(move |b| {
            let _ = tx.send(b);
        });
        if self.leases.settle(t.clone(), used, on_paid).is_err() {
            // No lease here any more: pay in process so the record still adds up.
            return self.fallback.settle_loading(db, t, used, now).await;
        }
        rx.await.unwrap_or_else(|_| on_allowance(t, used, now))
    }

    /// Renews every lease with something to do (see `lease`'s doc); run every `FLUSH_EVERY`.
    /// On one Redis the round is one script call per `BATCH` accounts; on a cluster each
    /// account is its own call (its keys share one slot, not other accounts'), sent together.
    pub async fn renew_leases(&self, db: &Db, timeout_ms: i64) {
        let now = now_ms();
        if self.leases.any() && !self.breaker.is_open() {
            self.apply_drains(now).await;
        }
        let due = self.leases.due(now, timeout_ms, !self.breaker.is_open());
        if due.is_empty() {
            return;
        }
        if self.connector.is_cluster() || due.len() == 1 {
            futures::future::join_all(due.iter().map(|u| async move {
                if let Err(Unreachable(e)) = self.renew(db, u, timeout_ms).await {
                    log::warn!("{e}; lease of {u}");
                }
            }))
            .await;
            return;
        }
        for users in due.chunks(BATCH) {
            self.renew_batch(db, users, timeout_ms).await;
        }
    }

    /// One round trip for several accounts: the plain renewals' commands (`ahead`) and one
    /// `lease_batch.lua` call for the others. An account Redis does not hold any more
    /// (`load`) is loaded and renewed on its own.
    async fn renew_batch(&self, db: &Db, users: &[String], timeout_ms: i64) {
        let now = now_ms();
        let plain = !self.connector.is_cluster();
        let begun: Vec<(&String, Call, Vec<super::lease::Pending>)> = users
            .iter()
            .filter_map(|u| {
                let (call, pending) = self.leases.begin(&self.prefix, u, timeout_ms, now, plain)?;
                Some((u, call, pending))
            })
            .collect();
        let (plain, begun): (Vec<_>, Vec<_>) = begun
            .into_iter()
            .partition(|(_, call, _)| call.plain.is_some());
        if plain.is_empty() && begun.is_empty() {
            // Every account was being renewed already.
            return;
        }
        // The plain renewals' commands and the others' script call share one round trip.
        let plain: Vec<(&str, &Call)> = plain.iter().map(|(u, c, _)| (u.as_str(), c)).collect();
        let mut pipe = redis::pipe();
        self.ahead_commands(&mut pipe, &plain);
        let ahead_len = pipe.len();
        let script = (!begun.is_empty()).then(|| {
            let mut inv = self.lease_batch.prepare_invoke();
            inv.arg(begun.len());
            for (_, call, _) in &begun {
                for k in &call.keys {
                    inv.key(k);
                }
                inv.arg(call.keys.len()).arg(call.args.len());
                for a in &call.args {
                    inv.arg(a);
                }
            }
            inv
        });
        if let Some(inv) = &script {
            pipe.invoke_script(inv);
        }
        let sent = if self.breaker.is_open() {
            Err(Unreachable("redis is down".into()))
        } else {
            self.round_trip("lease", &pipe).await
        };
        let (ahead, script_reply) = match sent {
            Ok(mut replies) => {
                let script_reply = replies.split_off(ahead_len).into_iter().next();
                (Ok(replies), Ok(script_reply))
            }
            Err(Unreachable(e)) => (Err(Unreachable(e.clone())), Err(Unreachable(e))),
        };
        if !plain.is_empty() {
            self.finish_ahead(&plain, ahead).await;
        }
        let Some(inv) = script else { return };
        let replies = match script_reply {
            Ok(Some(reply)) => {
                self.script_reply::<Vec<RedisValue>>("lease", reply, &inv)
                    .await
            }
            Ok(None) => Err(Unreachable("redis lease: no reply".into())),
            Err(e) => Err(e),
        };
        match replies {
            Ok(replies) if replies.len() == begun.len() => {
                for ((user_id, call, pending), reply) in begun.into_iter().zip(replies) {
                    let reply = match reply {
                        RedisValue::Array(a) => a,
                        other => vec![other],
                    };
                    let outcome = if reply.first().and_then(as_string).as_deref() == Some("load") {
                        self.call_lease(db, user_id, &call).await
                    } else {
                        super::lease::parse(&reply).ok_or_else(|| {
                            Unreachable(format!("redis lease: unexpected reply {reply:?}"))
                        })
                    };
                    if let Err(Unreachable(e)) = self
                        .complete(db, user_id, &call, pending, outcome, now)
                        .await
                    {
                        log::warn!("{e}; lease of {user_id}");
                    }
                }
            }
            other => {
                let e = match other {
                    Err(Unreachable(e)) => e,
                    Ok(r) => format!(
                        "redis lease: {} replies for {} accounts",
                        r.len(),
                        begun.len()
                    ),
                };
                log::warn!("{e}; leases of {} accounts", begun.len());
                for (user_id, call, pending) in begun {
                    let _ = self
                        .complete(
                            db,
                            user_id,
                            &call,
                            pending,
                            Err(Unreachable(e.clone())),
                            now,
                        )
                        .await;
                }
            }
        }
    }

    /// One `lease.lua` call for one account (see the module's doc). When Redis does not
    /// answer, what was settled is paid in process (reconciled when Redis is back) and the
    /// account's requests are reserved on their own for a while.
    async fn renew(&self, db: &Db, user_id: &str, timeout_ms: i64) -> Result<(), Unreachable> {
        let now = now_ms();
        // On a Redis Cluster an account's windows and meta share a slot, but the script keeps
        // doing it all (one call per account either way).
        let plain = !self.connector.is_cluster();
        let Some((call, pending)) =
            self.leases
                .begin(&self.prefix, user_id, timeout_ms, now, plain)
        else {
            return Ok(());
        };
        if call.plain.is_some() {
            self.take_ahead(&[(user_id, &call)]).await;
            return Ok(());
        }
        let mut outcome = Err(Unreachable("redis is down".into()));
        if !self.breaker.is_open() {
            outcome = self.call_lease(db, user_id, &call).await;
        }
        self.complete(db, user_id, &call, pending, outcome, now)
            .await
    }

    /// Applies one account's renewal answer (or its failure) and hands each settlement it
    /// paid its share.
    async fn complete(
        &self,
        db: &Db,
        user_id: &str,
        call: &Call,
        pending: Vec<super::lease::Pending>,
        outcome: Result<Renewed, Unreachable>,
        now: i64,
    ) -> Result<(), Unreachable> {
        match outcome {
            Ok(r) => {
                let amounts: Vec<[u64; 2]> = pending
                    .iter()
                    .map(|p| [p.ticket.charge(p.used), p.ticket.requests])
                    .collect();
                let shares = r.paid.split(user_id, &amounts, now);
                let top = match r.top {
                    Some(top) => top,
                    None => self.hints.get(user_id).and_then(|h| h.1),
                };
                self.hints.insert(user_id.to_string(), (r.weekly, top));
                // The lease is live again: a failed renewal's note to release it after an
                // outage is void.
                {
                    let mut orphans = self.orphans.lock();
                    if let Some(ids) = orphans.get_mut(user_id) {
                        ids.retain(|id| *id != self.leases.id);
                        if ids.is_empty() {
                            orphans.remove(user_id);
                        }
                    }
                }
                let newly_exact = self.leases.finish(user_id, call, Some(&r), now_ms());
                for (p, b) in pending.into_iter().zip(shares) {
                    p.paid(b);
                }
                if newly_exact {
                    self.signal_drain(user_id, now).await;
                }
                if r.first {
                    self.join_sweep(user_id, now).await;
                }
                Ok(())
            }
            Err(e) => {
                self.leases.finish(user_id, call, None, now_ms());
                self.orphans
                    .lock()
                    .entry(user_id.to_string())
                    .or_default()
                    .push(self.leases.id.clone());
                for p in pending {
                    let b = self
                        .fallback
                        .settle_loading(db, &p.ticket, p.used, now)
                        .await;
                    p.paid(b);
                }
                Err(e)
            }
        }
    }

    async fn call_lease(
        &self,
        db: &Db,
        user_id: &str,
        call: &Call,
    ) -> Result<Renewed, Unreachable> {
        for _attempt in 0..2 {
            let mut inv = self.lease.prepare_invoke();
            for k in &call.keys {
                inv.key(k);
            }
            for a in &call.args {
                inv.arg(a);
            }
            let mut conn = self.conn();
            let reply: Vec<RedisValue> = self.guarded("lease", inv.invoke_async(&mut conn)).await?;
            if reply.first().and_then(as_string).as_deref() == Some("load") {
                match self.load_account(db, user_id, now_ms()).await {
                    Ok(()) => continue,
                    Err(LoadError::Redis(e)) => return Err(e),
                    Err(LoadError::Db(e)) => return Err(Unreachable(format!("quota load: {e}"))),
                }
            }
            return super::lease::parse(&reply)
                .ok_or_else(|| Unreachable(format!("redis lease: unexpected reply {reply:?}")));
        }
        Err(Unreachable("redis lease: account not loaded".into()))
    }
}
