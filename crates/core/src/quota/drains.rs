//! Drains between instances: how an instance holding a lease learns, within a round, that
//! another instance drained the account.
//!
//! The instance that finds an account too short for leases records it in `q:drains` (by when)
//! and publishes the account on the channel of the same name. Every instance listens on that
//! channel over a connection of its own and polls `q:drains` every round only while it is not
//! listening (at start, after a lost connection); otherwise the keeper's heartbeat reads it
//! once a second (`Shared::heartbeat`: on one Redis in the heartbeat's own round trip, on a
//! cluster in a call of its own while leases are held), for a notice lost with a connection that
//! died quietly or a node that no longer hears the cluster's publications: soon enough that a
//! request refused while shares are held still sees them given back (`DRAIN_WAIT` ×
//! `DRAIN_TRIES`). A poll of its own, every round or every half second, would cost Redis a round
//! trip each time whatever the traffic, which at a few hundred requests a second is more than
//! the requests' own Redis work.
//!
//! Every drain heard, by notice or by poll, is applied to this instance's leases again at each
//! round for `DRAIN_SEEN_MS`, as when each round polled that span: a renewal in flight when the
//! notice came may still bring back a share, which a later round then gives back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use parking_lot::Mutex;

use super::shared::{Shared, Unreachable, MIN_CONNECT};
use crate::util::now_ms;

/// How long (ms) a drain is applied to the leases after it was made.
const DRAIN_SEEN_MS: i64 = 3_000;
/// How often the listener checks that it hears the channel: it publishes a probe of its own
/// there and expects it back within the call deadline. A probe, not a `PING`: a connection can
/// answer while it hears nothing (a subscription refused by an ACL but not failed by the
/// client, a cluster node cut off from the others' publications).
const PROBE_EVERY: Duration = Duration::from_secs(5);
/// How long after a lost listener connection it is opened again.
const RELISTEN_AFTER: Duration = Duration::from_secs(1);

/// What this instance knows of drains made anywhere.
#[derive(Default)]
pub(super) struct DrainNotices {
    /// The listener is subscribed: the heartbeat polls `q:drains`, the rounds do not.
    listening: AtomicBool,
    /// The next round polls `q:drains` even while listening: the drains made before the
    /// subscription.
    catch_up: AtomicBool,
    /// Drains heard: account → when the drain was made (ms).
    heard: Mutex<HashMap<String, i64>>,
}

impl DrainNotices {
    /// Whether this round polls `q:drains`: every round while not listening, once after the
    /// subscription (the drains made before it); while listening the heartbeat polls.
    fn round_polls(&self) -> bool {
        !self.listening.load(Ordering::Relaxed) || self.catch_up.swap(false, Ordering::Relaxed)
    }

    /// Whether the heartbeat polls `q:drains` (the listener is subscribed).
    pub(super) fn heartbeat_polls(&self) -> bool {
        self.listening.load(Ordering::Relaxed)
    }

    fn set_listening(&self, on: bool) {
        let was = self.listening.swap(on, Ordering::Relaxed);
        if on && !was {
            self.catch_up.store(true, Ordering::Relaxed);
        }
    }

    /// A drain made at `at` (by its instance's clock; never later than `now`), heard at `now`.
    /// Drains past their span are forgotten here too, so an instance holding no lease (whose
    /// rounds never ask for `recent`) keeps none.
    pub(super) fn hear(&self, user_id: String, at: i64, now: i64) {
        let at = at.min(now);
        let mut heard = self.heard.lock();
        heard.retain(|_, seen| now - *seen < DRAIN_SEEN_MS);
        let seen = heard.entry(user_id).or_insert(at);
        *seen = (*seen).max(at);
    }

    /// The accounts drained within `DRAIN_SEEN_MS` of `now`; older drains are forgotten.
    fn recent(&self, now: i64) -> Vec<String> {
        let mut heard = self.heard.lock();
        heard.retain(|_, at| now - *at < DRAIN_SEEN_MS);
        heard.keys().cloned().collect()
    }
}

impl Shared {
    /// The round's part: polls `q:drains` when due and wakes the leases of every account
    /// drained lately (`Leases::drained`).
    pub(super) async fn apply_drains(&self, now: i64) {
        if self.drains.round_polls() {
            self.poll_drains(now).await;
        }
        for user_id in self.drains.recent(now) {
            self.leases.drained(&user_id);
        }
    }

    /// Reads which accounts were drained lately (`q:drains`).
    pub(super) async fn poll_drains(&self, now: i64) {
        let mut conn = self.conn();
        match self
            .guarded("drains", self.drains_query(now).query_async(&mut conn))
            .await
        {
            Ok(drained) => self.hear_polled(drained, now),
            Err(Unreachable(e)) => log::warn!("{e}"),
        }
    }

    /// The poll's command: the drains made within `DRAIN_SEEN_MS` of `now`, with when.
    pub(super) fn drains_query(&self, now: i64) -> redis::Cmd {
        let mut cmd = redis::cmd("ZRANGEBYSCORE");
        cmd.arg(&self.drains_key)
            .arg(format!("({}", now - DRAIN_SEEN_MS))
            .arg("+inf")
            .arg("WITHSCORES");
        cmd
    }

    /// Hears the drains a poll read (`drains_query`'s reply).
    pub(super) fn hear_polled(&self, drained: Vec<(String, i64)>, now: i64) {
        for (user_id, at) in drained {
            self.drains.hear(user_id, at, now);
        }
    }

    /// Tells every instance that `user_id` is drained (their leases come back at their next
    /// round), and forgets drains long past. The notice is a call of its own, sent apart (the
    /// request that drained the account waits for the shares, not for the notice), bounded and
    /// unguarded: a Redis that refuses `PUBLISH` (an ACL without channels, a proxy) must not
    /// fail the drain or count against the breaker; the others then hear it by their polls.
    pub(super) async fn signal_drain(&self, user_id: &str, now: i64) {
        self.drains.hear(user_id.to_string(), now, now);
        let mut pipe = redis::pipe();
        pipe.cmd("ZADD")
            .arg(&self.drains_key)
            .arg(now)
            .arg(user_id)
            .ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(&self.drains_key)
            .arg("-inf")
            .arg(format!("({}", now - 10 * DRAIN_SEEN_MS))
            .ignore()
            .cmd("PEXPIRE")
            .arg(&self.drains_key)
            .arg(10 * DRAIN_SEEN_MS)
            .ignore();
        let mut conn = self.conn();
        if let Err(Unreachable(e)) = self
            .guarded("drains", pipe.query_async::<()>(&mut conn))
            .await
        {
            log::warn!("{e}");
            return;
        }
        let notice = self.publish(format!("{now} {user_id}"));
        tokio::spawn(async move {
            if let Err(e) = notice.await {
                log::debug!("drain notice not published: {e}");
            }
        });
    }

    /// Publishes `payload` on the drains' channel, bounded by the call deadline and apart from
    /// the breaker. The channel is named as the key: a cluster routes it to the key's node. The
    /// future owns what it needs, so it can be sent apart.
    fn publish(
        &self,
        payload: String,
    ) -> impl std::future::Future<Output = Result<(), String>> + Send + 'static {
        let (mut conn, bound) = (self.conn(), self.settings.timeout);
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(&self.drains_key).arg(payload);
        async move {
            match tokio::time::timeout(bound, cmd.query_async::<()>(&mut conn)).await {
                Ok(sent) => sent.map_err(|e| e.to_string()),
                Err(_) => Err("no answer within the timeout".into()),
            }
        }
    }

    /// Listens for drain notices until the process ends, opening the connection again
    /// `RELISTEN_AFTER` it is lost; the rounds poll every time while it is not listening.
    pub async fn listen_for_drains(&self) {
        let client = self.connector.pubsub_client();
        // Said at the first failure and when listening is lost, not at every retry.
        let mut told = false;
        loop {
            if let Err(e) = self.listen(client).await {
                if self.drains.listening.load(Ordering::Relaxed) || !told {
                    log::warn!(
                        "drain notices: {e}; polling q:drains every round until listening again"
                    );
                }
                told = true;
            }
            self.drains.set_listening(false);
            tokio::time::sleep(RELISTEN_AFTER).await;
        }
    }

    async fn listen(&self, client: &redis::Client) -> Result<(), String> {
        let bound = self.settings.timeout.max(MIN_CONNECT);
        let within = |what: &'static str| move |_| format!("{what}: no answer within {bound:?}");
        let pubsub = tokio::time::timeout(bound, client.get_async_pubsub())
            .await
            .map_err(within("connect"))?
            .map_err(|e| e.to_string())?;
        let (mut sink, mut stream) = pubsub.split();
        tokio::time::timeout(bound, sink.subscribe(&self.drains_key))
            .await
            .map_err(within("subscribe"))?
            .map_err(|e| e.to_string())?;
        // Listening once the first probe comes back (the first tick is at once).
        let probe = format!("probe {}", self.instance);
        let mut check = tokio::time::interval(PROBE_EVERY);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut awaiting: Option<tokio::time::Instant> = None;
        loop {
            let deadline = awaiting.unwrap_or_else(tokio::time::Instant::now);
            tokio::select! {
                msg = stream.next() => {
                    let Some(msg) = msg else { return Err("connection closed".into()) };
                    let Ok(payload) = msg.get_payload::<String>() else { continue };
                    if payload == probe {
                        awaiting = None;
                        self.drains.set_listening(true);
                    } else if let Some((at, user_id)) = payload.split_once(' ') {
                        // Another instance's probe has no time: not a drain.
                        if let Ok(at) = at.parse::<i64>() {
                            let now = now_ms();
                            self.drains.hear(user_id.to_string(), at, now);
                        }
                    }
                }
                _ = check.tick(), if awaiting.is_none() => {
                    self.publish(probe.clone())
                        .await
                        .map_err(|e| format!("probe: {e}"))?;
                    awaiting = Some(tokio::time::Instant::now() + bound);
                }
                _ = tokio::time::sleep_until(deadline), if awaiting.is_some() => {
                    return Err(format!("a probe published was not heard within {bound:?}"));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_poll_drains_until_the_listener_is_subscribed_then_the_heartbeat_does() {
        let n = DrainNotices::default();
        assert!(n.round_polls());
        assert!(n.round_polls(), "not listening: every round");
        assert!(!n.heartbeat_polls());
        n.set_listening(true);
        assert!(n.round_polls(), "subscribing reads what came before it");
        assert!(!n.round_polls());
        assert!(!n.round_polls());
        assert!(n.heartbeat_polls());
        n.set_listening(true);
        assert!(!n.round_polls(), "still subscribed: nothing to catch up");
        n.set_listening(false);
        assert!(n.round_polls());
        assert!(!n.heartbeat_polls());
    }

    #[test]
    fn a_drain_heard_is_applied_for_its_span_then_forgotten() {
        let n = DrainNotices::default();
        n.hear("u1".into(), 1_000, 1_000);
        n.hear("u1".into(), 500, 1_000);
        n.hear("u2".into(), 2_500, 2_000);
        let mut recent = n.recent(1_000 + DRAIN_SEEN_MS - 1);
        recent.sort();
        assert_eq!(recent, ["u1", "u2"]);
        assert_eq!(n.recent(1_000 + DRAIN_SEEN_MS), ["u2"]);
        assert!(n.recent(2_000 + DRAIN_SEEN_MS).is_empty());
        // Hearing a drain forgets those past their span, recent asked for or not.
        n.hear("u1".into(), 10_000, 10_000);
        n.hear("u3".into(), 20_000, 20_000);
        assert_eq!(n.heard.lock().len(), 1);
    }
}
