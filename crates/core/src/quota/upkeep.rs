//! The Redis engine's upkeep, off the request path: lots granted elsewhere, the sweep of
//! reservations (and leases) whose instance died, and recovery after an outage.

use std::time::Duration;

use redis::{FromRedisValue, Value as RedisValue};

/// An instance not heard from for this long (ms) no longer counts among those sharing the
/// accounts.
const INSTANCE_TTL_MS: i64 = 10_000;
/// The heartbeat pipeline's replies before the count of live instances.
const HEARTBEAT_IGNORED: usize = 3;

use super::scripts::ACCOUNT_TTL_SECS;
use super::scripts::{account_keys, lot_value};
use super::shared::{LoadError, Shared, Unreachable, MIN_CONNECT, SWEEP_BATCH};
use crate::domain::Lot;
use crate::storage::Db;
use crate::util::now_ms;

impl Shared {
    /// Adds a lot granted elsewhere to the account, if Redis (or the outage engine) holds it.
    /// False when Redis did not answer: the feed offers the lot again.
    pub async fn add_lot(&self, lot: Lot) -> bool {
        self.fallback.add_lot(lot.clone());
        if self.breaker.is_open() {
            return false;
        }
        let k = account_keys(&self.prefix, &lot.user_id);
        let mut conn = self.conn();
        let mut inv = self.add_lot.prepare_invoke();
        inv.key(&k[0])
            .key(&k[3])
            .arg(&lot.id)
            .arg(lot_value(&lot))
            .arg(ACCOUNT_TTL_SECS);
        match self
            .guarded("add lot", inv.invoke_async::<i64>(&mut conn))
            .await
        {
            Ok(_) => {
                // Renewals read the lots only now and then: the tier hint learns of this one
                // at once.
                if let (Some(tier), Some(mut hint)) = (lot.tier, self.hints.get_mut(&lot.user_id)) {
                    hint.1 = Some(hint.1.map_or(tier, |t| t.max(tier)));
                }
                true
            }
            Err(Unreachable(e)) => {
                log::warn!("{e}");
                false
            }
        }
    }

    /// Puts an account that took its first reservation into the sweep's set (on a cluster, where
    /// the set is in another slot than the account's keys). A failure is logged only: the
    /// account's own next reservation also releases its stale ones.
    pub(super) async fn join_sweep(&self, user_id: &str, now: i64) {
        let mut conn = self.conn();
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(&self.due_key).arg("NX").arg(now).arg(user_id);
        let add = cmd.query_async::<i64>(&mut conn);
        if let Err(Unreachable(e)) = self.guarded("sweep set", add).await {
            log::warn!("{e}");
        }
    }

    /// Says this instance is alive, learns how many are, and releases reservations older than
    /// `timeout_ms` on every account that holds one, so a reservation whose instance died is
    /// freed whether or not its account sends anything: every second while Redis answers.
    /// During an outage the last count of instances sets this instance's share of every limit
    /// and balance.
    ///
    /// On one Redis it is one round trip a second: the heartbeat, the sweep of the accounts the
    /// last heartbeat found due (a second late is nothing against a reservation timeout),
    /// the question which accounts are due now (after the sweep, which moves those it visited),
    /// and, while the drain listener is subscribed, the poll of `q:drains` (`drains`).
    pub async fn heartbeat(&self, now: i64, timeout_ms: i64) {
        if self.connector.is_cluster() {
            return self.heartbeat_cluster(now, timeout_ms).await;
        }
        let due = std::mem::take(&mut *self.sweep_next.lock());
        let mut pipe = self.heartbeat_pipe(now);
        let sweep = (!due.is_empty()).then(|| self.sweep_invocation(&due, now, timeout_ms, true));
        if let Some(inv) = &sweep {
            pipe.invoke_script(inv);
        }
        pipe.add_command(self.due_query(now, timeout_ms));
        let poll = self.drains.heartbeat_polls();
        if poll {
            pipe.add_command(self.drains_query(now));
        }
        let replies = match self.round_trip("instances", &pipe).await {
            Ok(replies) => replies,
            Err(Unreachable(e)) => {
                // The accounts due are asked for again next time (a sweep that ran after all
                // moved those it visited).
                log::warn!("{e}");
                return;
            }
        };
        let mut replies = replies.into_iter().skip(HEARTBEAT_IGNORED);
        let mut next = || replies.next().unwrap_or(RedisValue::Nil);
        let live = next();
        if let Ok(live) = u64::from_redis_value(&live) {
            self.fallback.set_share(live);
        }
        if let Some(inv) = &sweep {
            match self.script_reply::<Vec<i64>>("sweep", next(), inv).await {
                Ok(swept) => self.log_swept(&due, &swept),
                Err(Unreachable(e)) => log::warn!("{e}"),
            }
        }
        match Vec::<String>::from_redis_value(&next()) {
            Ok(due) => *self.sweep_next.lock() = due,
            Err(e) => log::warn!("redis sweep set: {e}"),
        }
        if poll {
            match Vec::<(String, i64)>::from_redis_value(&next()) {
                Ok(drained) => self.hear_polled(drained, now),
                Err(e) => log::warn!("redis drains: {e}"),
            }
        }
    }

    /// The heartbeat's commands: this instance alive now, the silent ones forgotten, the
    /// count of those left (the pipeline's first reply that is read: `HEARTBEAT_IGNORED`).
    fn heartbeat_pipe(&self, now: i64) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        pipe.cmd("ZADD")
            .arg(&self.instances_key)
            .arg(now)
            .arg(&self.instance)
            .cmd("ZREMRANGEBYSCORE")
            .arg(&self.instances_key)
            .arg("-inf")
            .arg(format!("({}", now - INSTANCE_TTL_MS))
            .cmd("PEXPIRE")
            .arg(&self.instances_key)
            .arg(INSTANCE_TTL_MS)
            .cmd("ZCARD")
            .arg(&self.instances_key);
        pipe
    }

    /// The accounts whose oldest reservation is past the timeout (`SWEEP_BATCH` at most).
    fn due_query(&self, now: i64, timeout_ms: i64) -> redis::Cmd {
        let mut cmd = redis::cmd("ZRANGEBYSCORE");
        cmd.arg(&self.due_key)
            .arg("-inf")
            .arg(format!("({}", now - timeout_ms))
            .arg("LIMIT")
            .arg(0)
            .arg(SWEEP_BATCH);
        cmd
    }

    /// On a cluster the sets live in different slots than each other and the accounts: the
    /// heartbeat, the due question, each account's sweep and, while listening and holding
    /// leases, the drains poll are calls of their own.
    async fn heartbeat_cluster(&self, now: i64, timeout_ms: i64) {
        let pipe = self.heartbeat_pipe(now);
        let mut conn = self.conn();
        let answer = match self.round_trip("instances", &pipe).await {
            Ok(replies) => match replies.get(HEARTBEAT_IGNORED).map(u64::from_redis_value) {
                Some(Ok(live)) => {
                    self.fallback.set_share(live);
                    self.guarded(
                        "sweep",
                        self.due_query(now, timeout_ms)
                            .query_async::<Vec<String>>(&mut conn),
                    )
                    .await
                }
                _ => Err(Unreachable("redis instances: no count".into())),
            },
            Err(e) => Err(e),
        };
        let due = match answer {
            Ok(due) => due,
            Err(Unreachable(e)) => {
                log::warn!("{e}");
                return;
            }
        };
        // Before the sweeps, which may be many calls.
        if self.drains.heartbeat_polls() && self.leases.any() {
            self.poll_drains(now).await;
        }
        for user_id in &due {
            let inv = self.sweep_invocation(std::slice::from_ref(user_id), now, timeout_ms, false);
            let swept = match self
                .guarded("sweep", inv.invoke_async::<Vec<i64>>(&mut conn))
                .await
            {
                Ok(r) => r,
                Err(Unreachable(e)) => {
                    log::warn!("{e}");
                    break;
                }
            };
            self.log_swept(std::slice::from_ref(user_id), &swept);
            if let [_, oldest] = swept[..] {
                self.rescore(&mut conn, user_id, oldest).await;
            }
        }
    }

    /// `sweep.lua`'s call for `users`: their stale reservations released and, on one Redis
    /// (`with_set`), each moved in the sweep's set to its oldest reservation left.
    fn sweep_invocation(
        &self,
        users: &[String],
        now: i64,
        timeout_ms: i64,
        with_set: bool,
    ) -> redis::ScriptInvocation<'_> {
        let mut inv = self.sweep.prepare_invoke();
        for user_id in users {
            let k = account_keys(&self.prefix, user_id);
            inv.key(&k[0]).key(&k[1]).key(&k[4]);
        }
        if with_set {
            inv.key(&self.due_key);
        }
        inv.arg(now).arg(timeout_ms);
        for user_id in users {
            inv.arg(user_id);
        }
        inv
    }

    /// Says which accounts had stale reservations released (`sweep.lua`'s reply: released,
    /// oldest left, per account).
    fn log_swept(&self, users: &[String], swept: &[i64]) {
        for (user_id, pair) in users.iter().zip(swept.chunks(2)) {
            if pair[0] > 0 {
                log::warn!("released {} stale reservation(s) of {user_id}", pair[0]);
            }
        }
    }

    /// Moves an account in the sweep's set to the start of its oldest reservation, or out of
    /// it when it holds none (`oldest` < 0): on a cluster, after the account's own call.
    async fn rescore(&self, conn: &mut super::redis_conn::Conn, user_id: &str, oldest: i64) {
        let cmd = if oldest >= 0 {
            let mut c = redis::cmd("ZADD");
            c.arg(&self.due_key).arg("XX").arg(oldest).arg(user_id);
            c
        } else {
            let mut c = redis::cmd("ZREM");
            c.arg(&self.due_key).arg(user_id);
            c
        };
        if let Err(Unreachable(e)) = self.guarded("sweep", cmd.query_async::<i64>(conn)).await {
            log::warn!("{e}");
        }
    }

    /// One probe of a Redis the breaker gave up on. When a fresh connection answers, it
    /// replaces the old one and every account served in process is reloaded from the database
    /// into Redis; then the breaker closes. Anything failing leaves it open for the next probe.
    pub async fn recover(&self, db: &Db) {
        let connect = self.connector.connect();
        let Ok(Ok(mut fresh)) =
            tokio::time::timeout(self.settings.timeout.max(MIN_CONNECT), connect).await
        else {
            return;
        };
        let ping_cmd = redis::cmd("PING");
        let ping = ping_cmd.query_async::<String>(&mut fresh);
        if !matches!(
            tokio::time::timeout(self.settings.timeout.max(MIN_CONNECT), ping).await,
            Ok(Ok(_))
        ) {
            return;
        }
        self.conn.store(std::sync::Arc::new(fresh));
        // What was settled in process must be in the database before it is read back: wait
        // (briefly) for the usage writer to write what was queued until now.
        if let Some(usage) = &self.settings.usage {
            let queued = usage.queued();
            let until = tokio::time::Instant::now() + Duration::from_secs(1);
            while usage.written() < queued && tokio::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let orphans = std::mem::take(&mut *self.orphans.lock());
        let mut accounts: Vec<String> = self.fallback.account_ids();
        for user_id in orphans.keys() {
            if !accounts.contains(user_id) {
                accounts.push(user_id.clone());
            }
        }
        let now = now_ms();
        let mut failed = false;
        for user_id in &accounts {
            let released = orphans.get(user_id).map(Vec::as_slice).unwrap_or(&[]);
            if let Err(LoadError::Redis(Unreachable(e)) | LoadError::Db(e)) =
                self.reload_account(db, user_id, released, now).await
            {
                log::warn!("reconciling {user_id} into Redis: {e}");
                failed = true;
                break;
            }
        }
        if failed {
            // Try again with the next probe; the releases are kept for it.
            let mut kept = self.orphans.lock();
            for (user_id, ids) in orphans {
                kept.entry(user_id).or_default().extend(ids);
            }
            self.breaker.failure(true, now_ms());
            return;
        }
        self.fallback.clear();
        self.breaker.close();
        log::warn!(
            "Redis answers again: {} account(s) reconciled from the database",
            accounts.len()
        );
    }
}
