//! Usage events: the exact record of every developer request, and the hourly rollup the
//! account usage report reads.
//!
//! Every batch of events also adds its counts to `usage_rollup` (one row per account, Unix hour
//! and model) in the same transaction, so the rollup always equals the events it summarises. A
//! 30-day report then reads at most 721 hours x models rollup rows, plus the raw events of at
//! most half an hour at the window's ragged start, whatever the account's volume.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::sync::OnceLock;

use sqlx::any::AnyArguments;
use sqlx::error::BoxDynError;
use sqlx::{Arguments, Executor};

use super::keys::KeyStore;
use super::quota::{QuotaStore, HOUR_MS};

use super::{Backend, Db, StoreError, StoreResult};
use crate::domain::Breakdown;

/// One settled request, as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageEvent {
    pub id: String,
    pub user_id: String,
    pub key_id: String,
    pub model: String,
    /// The endpoint's name (static for every request the gateway records).
    pub endpoint: &'static str,
    pub reasoning_effort: Option<String>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_tokens: u64,
    /// Quota tokens charged for the raw counts at the model's weights (`pricing`).
    pub quota_charged: u64,
    pub status: u16,
    pub latency_ms: u64,
    pub ttfb_ms: Option<u64>,
    /// How the numbers were obtained: `provider`, `counted`, plus why (`client_disconnect`, …).
    pub settlement: &'static str,
    pub deployment: Option<String>,
    pub error_code: Option<&'static str>,
    pub created_at: i64,
    /// How the settlement was paid; written with the event in one transaction so balances
    /// always add up to the recorded usage.
    pub breakdown: Option<Breakdown>,
}

fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Request and token counts of a set of usage events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageTotals {
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
    /// The part of `input_tokens` read from providers' caches.
    pub cached_tokens: u64,
    /// Quota tokens charged for them at their models' weights.
    pub quota_charged: u64,
}

impl UsageTotals {
    pub fn add(&mut self, o: &UsageTotals) {
        self.requests = self.requests.saturating_add(o.requests);
        self.input_tokens = self.input_tokens.saturating_add(o.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(o.output_tokens);
        self.total_tokens = self.total_tokens.saturating_add(o.total_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(o.cached_tokens);
        self.quota_charged = self.quota_charged.saturating_add(o.quota_charged);
    }

    fn sub(&mut self, o: &UsageTotals) {
        self.requests = self.requests.saturating_sub(o.requests);
        self.input_tokens = self.input_tokens.saturating_sub(o.input_tokens);
        self.output_tokens = self.output_tokens.saturating_sub(o.output_tokens);
        self.total_tokens = self.total_tokens.saturating_sub(o.total_tokens);
        self.cached_tokens = self.cached_tokens.saturating_sub(o.cached_tokens);
        self.quota_charged = self.quota_charged.saturating_sub(o.quota_charged);
    }

    /// Totals from a row's sums, in column order (negative sums, which never occur, read
    /// as 0).
    pub(crate) fn from_sums(sums: [i64; 6]) -> Self {
        let [requests, input_tokens, output_tokens, total_tokens, cached_tokens, quota_charged] =
            sums.map(u);
        UsageTotals {
            requests,
            input_tokens,
            output_tokens,
            total_tokens,
            cached_tokens,
            quota_charged,
        }
    }
}

/// One of the newest events of a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecentEvent {
    pub id: String,
    pub model: String,
    pub reasoning_effort: Option<String>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
    pub cached_tokens: u64,
    pub quota_charged: u64,
    pub created_at: i64,
}

row! {
    /// Rollup sums of one day or hour.
    struct BucketRow {
        bucket: i64,
        requests: i64,
        input_tokens: i64,
        output_tokens: i64,
        total_tokens: i64,
        cached_tokens: i64,
        quota_charged: i64,
    }
}

row! {
    /// Rollup or raw-event sums of one model.
    struct ModelRow {
        model: String,
        requests: i64,
        input_tokens: i64,
        output_tokens: i64,
        total_tokens: i64,
        cached_tokens: i64,
        quota_charged: i64,
    }
}

impl ModelRow {
    fn into_pair(self) -> (String, UsageTotals) {
        let t = UsageTotals::from_sums([
            self.requests,
            self.input_tokens,
            self.output_tokens,
            self.total_tokens,
            self.cached_tokens,
            self.quota_charged,
        ]);
        (self.model, t)
    }
}

row! {
    /// A `usage_events` row as a report's newest events show it.
    struct RecentRow {
        id: String,
        model: String,
        reasoning_effort: Option<String>,
        input_tokens: i64,
        output_tokens: i64,
        total_tokens: i64,
        cached_tokens: i64,
        quota_charged: i64,
        created_at: i64,
    }
}

impl From<RecentRow> for RecentEvent {
    fn from(r: RecentRow) -> RecentEvent {
        RecentEvent {
            id: r.id,
            model: r.model,
            reasoning_effort: r.reasoning_effort,
            input_tokens: u(r.input_tokens),
            output_tokens: u(r.output_tokens),
            total_tokens: u(r.total_tokens),
            cached_tokens: u(r.cached_tokens),
            quota_charged: u(r.quota_charged),
            created_at: r.created_at,
        }
    }
}

/// Rollup sums of one account's hours `$2..=$3`, each group named `$key`, grouped by `$group`.
macro_rules! rollup_sums {
    ($key:literal, $group:literal) => {
        concat!(
            "SELECT ",
            $key,
            ", CAST(SUM(requests) AS BIGINT) AS requests, \
             CAST(SUM(input_tokens) AS BIGINT) AS input_tokens, \
             CAST(SUM(output_tokens) AS BIGINT) AS output_tokens, \
             CAST(SUM(total_tokens) AS BIGINT) AS total_tokens, \
             CAST(SUM(COALESCE(cached_tokens, 0)) AS BIGINT) AS cached_tokens, \
             CAST(SUM(COALESCE(quota_charged, total_tokens)) AS BIGINT) AS quota_charged \
             FROM usage_rollup WHERE user_id = $1 AND hour >= $2 AND hour <= $3 GROUP BY ",
            $group
        )
    };
}

pub(crate) mod sql {
    queries! {
        /// Adds a batch's counts to one rollup row.
        /// A row from before weights has no `quota_charged` (its tokens were charged 1 each)
        /// and no `cached_tokens` (counted as none).
        ADD_ROLLUP = "INSERT INTO usage_rollup (user_id, hour, model, requests, input_tokens, \
             output_tokens, total_tokens, cached_tokens, quota_charged) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
             ON CONFLICT (user_id, hour, model) DO UPDATE SET \
             requests = usage_rollup.requests + excluded.requests, \
             input_tokens = usage_rollup.input_tokens + excluded.input_tokens, \
             output_tokens = usage_rollup.output_tokens + excluded.output_tokens, \
             total_tokens = usage_rollup.total_tokens + excluded.total_tokens, \
             cached_tokens = COALESCE(usage_rollup.cached_tokens, 0) + excluded.cached_tokens, \
             quota_charged = COALESCE(usage_rollup.quota_charged, usage_rollup.total_tokens) \
             + excluded.quota_charged";
        ROLLUP_BY_DAY -> super::BucketRow = rollup_sums!("hour / 24 AS bucket", "hour / 24");
        ROLLUP_BY_HOUR -> super::BucketRow = rollup_sums!("hour AS bucket", "hour");
        ROLLUP_BY_MODEL -> super::ModelRow = rollup_sums!("model", "model");
        EVENTS_BY_MODEL -> super::ModelRow = "SELECT model, CAST(COUNT(*) AS BIGINT) AS requests, \
             CAST(SUM(input_tokens) AS BIGINT) AS input_tokens, \
             CAST(SUM(output_tokens) AS BIGINT) AS output_tokens, \
             CAST(SUM(total_tokens) AS BIGINT) AS total_tokens, \
             CAST(SUM(cached_tokens) AS BIGINT) AS cached_tokens, \
             CAST(SUM(COALESCE(quota_charged, total_tokens)) AS BIGINT) AS quota_charged \
             FROM usage_events WHERE user_id = $1 AND created_at >= $2 AND created_at < $3 \
             GROUP BY model";
        RECENT -> super::RecentRow = "SELECT id, model, reasoning_effort, input_tokens, \
             output_tokens, total_tokens, cached_tokens, \
             COALESCE(quota_charged, total_tokens) AS quota_charged, created_at FROM usage_events \
             WHERE user_id = $1 AND created_at >= $2 ORDER BY created_at DESC LIMIT $3";
        LAST_CALL -> i64 = "SELECT created_at FROM usage_events WHERE user_id = $1 \
             ORDER BY created_at DESC LIMIT 1";
        COUNT_FOR_USER -> i64 =
            "SELECT CAST(COUNT(*) AS BIGINT) AS n FROM usage_events WHERE user_id = $1";
    }
}

/// An account's usage in `[from, now]`, as the usage report needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageReport {
    /// Per UTC day (days since the Unix epoch); only days with usage, ascending.
    pub daily: BTreeMap<i64, UsageTotals>,
    /// Per Unix hour, for windows of at most `HOURLY_MAX_SPAN_MS` (a day charted as one bar
    /// says nothing); only hours with usage, ascending. `None` for longer windows.
    pub hourly: Option<BTreeMap<i64, UsageTotals>>,
    /// Per model; only models with usage.
    pub by_model: BTreeMap<String, UsageTotals>,
    /// The newest events of the window, newest first.
    pub recent: Vec<RecentEvent>,
    /// The newest event of the account at all, in or before the window.
    pub last_call: Option<i64>,
}

impl UsageReport {
    /// Every request in the window.
    pub fn summary(&self) -> UsageTotals {
        let mut s = UsageTotals::default();
        for t in self.daily.values() {
            s.add(t);
        }
        s
    }
}

fn apply<K: Ord>(map: &mut BTreeMap<K, UsageTotals>, key: K, t: &UsageTotals, add: bool) {
    let slot = map.entry(key).or_default();
    if add {
        slot.add(t);
    } else {
        slot.sub(t);
    }
}

/// The rollup key of an event: account, Unix hour, model.
/// Borrowed from the batch's events: a batch has thousands of events and a handful of keys, so
/// no per-event copies of the user id and model.
type RollupKey<'a> = (&'a str, i64, &'a str);

const DAY_HOURS: i64 = 24;
/// Report windows up to this long also get per-hour sums (`UsageReport::hourly`).
pub const HOURLY_MAX_SPAN_MS: i64 = DAY_HOURS * HOUR_MS;

/// Most events per multi-row INSERT (a power of two, see [`statement_sized`]): 18 parameters
/// each stays far below SQLite's 32,766 and Postgres's 65,535 bound parameters.
const INSERT_ROWS: usize = 256;
/// How many chunk sizes [`statement_sized`] makes: 1, 2, 4, … [`INSERT_ROWS`].
const INSERT_SIZES: usize = INSERT_ROWS.trailing_zeros() as usize + 1;

/// Splits `items` into slices whose lengths are powers of two (at most [`INSERT_ROWS`]),
/// largest first. A multi-row INSERT's text depends on its row count, and a text the
/// connection has not prepared before costs a parse and a plan, which for SQLite costs more
/// than inserting the rows. With these sizes at most nine texts exist, all kept in the
/// connection's statement cache.
fn statement_sized<T>(mut items: &[T]) -> impl Iterator<Item = &[T]> {
    std::iter::from_fn(move || {
        if items.is_empty() {
            return None;
        }
        let n = items.len().min(INSERT_ROWS);
        let size = 1usize << (usize::BITS - 1 - n.leading_zeros());
        let (head, rest) = items.split_at(size);
        items = rest;
        Some(head)
    })
}

const EVENT_COLUMNS: usize = 18;

/// Inserts `chunk` with one statement (`ON CONFLICT DO NOTHING`) and returns how many rows
/// were new. One statement instead of one per event: each statement is a round trip to the
/// database (for SQLite, to its worker thread). No `RETURNING`: every returned row would be
/// one more message from that thread.
///
/// The arguments are sized for the whole chunk up front. Bound one by one, their list grew by
/// doubling to thousands of values for a full chunk, each growth a reallocation and a copy.
async fn insert_events(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    backend: Backend,
    chunk: &[&UsageEvent],
) -> StoreResult<u64> {
    let mut args = AnyArguments::default();
    args.reserve(chunk.len() * EVENT_COLUMNS, 0);
    // Text bound as `&str`, not `&String`: sqlx's `Any` layer keeps a `&str` borrowed but
    // clones a `String` into the argument list (nine copies per event).
    for e in chunk {
        add_event(&mut args, e)
            .map_err(|err| StoreError::Invalid(format!("usage event: {err}")))?;
    }
    let sql = insert_sql(backend, chunk.len());
    Ok(sqlx::query_with(&sql, args)
        .execute(&mut **tx)
        .await?
        .rows_affected())
}

/// The event's 18 values, in the order of the INSERT's columns.
fn add_event<'q>(args: &mut AnyArguments<'q>, e: &'q UsageEvent) -> Result<(), BoxDynError> {
    args.add(e.id.as_str())?;
    args.add(e.user_id.as_str())?;
    args.add(e.key_id.as_str())?;
    args.add(e.model.as_str())?;
    args.add(e.endpoint)?;
    args.add(e.reasoning_effort.as_deref())?;
    args.add(i(e.input_tokens))?;
    args.add(i(e.output_tokens))?;
    args.add(i(e.input_tokens.saturating_add(e.output_tokens)))?;
    args.add(i(e.cached_tokens))?;
    args.add(i(e.quota_charged))?;
    args.add(e.status as i64)?;
    args.add(i(e.latency_ms))?;
    args.add(e.ttfb_ms.map(i))?;
    args.add(e.settlement)?;
    args.add(e.deployment.as_deref())?;
    args.add(e.error_code)?;
    args.add(e.created_at)?;
    Ok(())
}

/// The multi-row INSERT for `rows` events, built once per backend and chunk size (a power of
/// two up to [`INSERT_ROWS`], as [`statement_sized`] cuts them): a full statement's text is
/// 14 kB (SQLite) to 30 kB (Postgres), and it was rebuilt for every chunk. Any other count
/// gets a text of its own.
fn insert_sql(backend: Backend, rows: usize) -> Cow<'static, str> {
    static TEXTS: [[OnceLock<String>; INSERT_SIZES]; 2] =
        [const { [const { OnceLock::new() }; INSERT_SIZES] }; 2];
    if !rows.is_power_of_two() || rows > INSERT_ROWS {
        return Cow::Owned(build_insert_sql(backend, rows));
    }
    let slot = &TEXTS[backend as usize][rows.trailing_zeros() as usize];
    Cow::Borrowed(slot.get_or_init(|| build_insert_sql(backend, rows)))
}

/// SQLite gets anonymous `?` placeholders: it resolves each numbered `$n` by a linear search of
/// the statement's parameter names, quadratic in a statement this size.
fn build_insert_sql(backend: Backend, rows: usize) -> String {
    let mut sql = String::with_capacity(300 + rows * 110);
    sql.push_str(
        "INSERT INTO usage_events (id, user_id, key_id, model, endpoint, reasoning_effort, \
         input_tokens, output_tokens, total_tokens, cached_tokens, quota_charged, status, \
         latency_ms, ttfb_ms, settlement, deployment, error_code, created_at) VALUES ",
    );
    for row in 0..rows {
        sql.push_str(if row == 0 { "(" } else { ", (" });
        push_placeholders(&mut sql, backend, row * EVENT_COLUMNS, EVENT_COLUMNS);
        sql.push(')');
    }
    // Any key: the table's (user_id, created_at, id) or the id's own unique index (one event
    // per request id, migration 0014).
    sql.push_str(" ON CONFLICT DO NOTHING");
    sql
}

/// `count` comma-separated placeholders, numbered from `first + 1` for Postgres.
pub(super) fn push_placeholders(sql: &mut String, backend: Backend, first: usize, count: usize) {
    for n in 0..count {
        if n > 0 {
            sql.push_str(", ");
        }
        match backend {
            Backend::Sqlite => sql.push('?'),
            Backend::Postgres => {
                sql.push('$');
                sql.push_str(itoa::Buffer::new().format(first + n + 1));
            }
        }
    }
}

/// Looks up which of `rows` event ids are stored, through the id's unique index: an id stored
/// under another time (or account) counts, as the insert skips it too. Returns the stored ids.
fn stored_ids_sql(backend: Backend, rows: usize) -> String {
    let mut sql = String::from("SELECT id FROM usage_events WHERE id IN (");
    push_placeholders(&mut sql, backend, 0, rows);
    sql.push(')');
    sql
}

/// The statements built per batch size, at the smallest and largest size, for
/// `storage::check`: (name, text, columns read).
#[cfg(test)]
pub(crate) fn built_statements(
    backend: Backend,
) -> Vec<(String, String, Option<&'static [super::check::Column]>)> {
    use super::check::Shape;
    let mut out = Vec::new();
    for rows in [1, INSERT_ROWS] {
        out.push((
            format!("INSERT_EVENTS({rows})"),
            build_insert_sql(backend, rows),
            None,
        ));
        out.push((
            format!("STORED_IDS({rows})"),
            stored_ids_sql(backend, rows),
            Some(<String as Shape>::COLUMNS),
        ));
    }
    out
}

pub struct UsageStore<'a> {
    pub(super) db: &'a Db,
}

impl UsageStore<'_> {
    /// Inserts a batch in one transaction (one fsync for many requests) together with the
    /// settlements' quota breakdowns, the rollup counts of the events that were new (an id
    /// already stored is skipped, and so is its count, so a retried batch never counts twice)
    /// and each key's last use moved forward to its newest event.
    pub async fn insert_batch(&self, events: &[UsageEvent]) -> StoreResult<()> {
        match self.insert_new(events, &HashSet::new()).await {
            Err(StoreError::Conflict(_)) => {
                // Some ids are stored already (a retry after a commit whose answer was lost):
                // write only the others, in a fresh transaction.
                let stored = self.stored_ids(events).await?;
                self.insert_new(events, &stored).await
            }
            other => other,
        }
    }

    /// Inserts the events whose ids are not in `skip`, with their rollup counts, quota
    /// breakdowns and keys' last uses, in one transaction; `Conflict` (and nothing written)
    /// when an id turns out to be stored already.
    async fn insert_new(&self, events: &[UsageEvent], skip: &HashSet<String>) -> StoreResult<()> {
        let events: Vec<&UsageEvent> = events.iter().filter(|e| !skip.contains(&e.id)).collect();
        if events.is_empty() {
            return Ok(());
        }
        let mut rollup: BTreeMap<RollupKey, UsageTotals> = BTreeMap::new();
        let mut paid: Vec<&Breakdown> = Vec::new();
        let mut tx = self.db.pool.begin().await?;
        for chunk in statement_sized(&events) {
            let inserted = insert_events(&mut tx, self.db.backend, chunk).await?;
            if inserted != chunk.len() as u64 {
                return Err(StoreError::Conflict("usage event stored already".into()));
            }
            for e in chunk {
                let total = e.input_tokens.saturating_add(e.output_tokens);
                let key = (
                    e.user_id.as_str(),
                    e.created_at.div_euclid(HOUR_MS),
                    e.model.as_str(),
                );
                rollup.entry(key).or_default().add(&UsageTotals {
                    requests: 1,
                    input_tokens: e.input_tokens,
                    output_tokens: e.output_tokens,
                    total_tokens: total,
                    cached_tokens: e.cached_tokens,
                    quota_charged: e.quota_charged,
                });
                paid.extend(e.breakdown.as_ref());
            }
        }
        QuotaStore::apply_batch_tx(&mut tx, &paid).await?;
        // Sorted keys: concurrent writers (several instances on one Postgres) lock rollup rows
        // in the same order and cannot deadlock each other.
        for ((user_id, hour, model), t) in &rollup {
            sqlx::query(sql::ADD_ROLLUP)
                .bind(*user_id)
                .bind(*hour)
                .bind(*model)
                .bind(i(t.requests))
                .bind(i(t.input_tokens))
                .bind(i(t.output_tokens))
                .bind(i(t.total_tokens))
                .bind(i(t.cached_tokens))
                .bind(i(t.quota_charged))
                .execute(&mut *tx)
                .await?;
        }
        // Sorted by key id, after the rollup rows, as every writer locks them.
        let mut last_used: BTreeMap<&str, i64> = BTreeMap::new();
        for e in &events {
            let at = last_used.entry(e.key_id.as_str()).or_insert(e.created_at);
            *at = (*at).max(e.created_at);
        }
        KeyStore::touch_last_used_tx(&mut tx, &last_used).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Prepares every multi-row INSERT size on this handle's connection, for a handle that
    /// keeps one connection (`Db::dedicated`, the usage writer's). A size's first statement
    /// otherwise costs a parse and a plan in whichever batch first has that many events
    /// (for SQLite, a 256-row text takes longer to parse than to insert), so the writer's
    /// cost per event would depend on which sizes it had met; prepared here, it does not.
    /// Returns how many it prepared; on a failure the writer goes on (a statement not
    /// prepared here is prepared when first used). SQLite only: Postgres parses on the
    /// server, and a statement prepared without the arguments' types would take its
    /// parameters' types from the columns instead of from what is bound.
    pub async fn prepare_inserts(&self) -> StoreResult<usize> {
        if self.db.backend != Backend::Sqlite {
            return Ok(0);
        }
        for size in (0..INSERT_SIZES).map(|bit| 1usize << bit) {
            (&self.db.pool)
                .prepare(insert_sql(self.db.backend, size).as_ref())
                .await?;
        }
        Ok(INSERT_SIZES)
    }

    /// Which of these events' ids are stored already (see [`stored_ids_sql`]).
    pub(crate) async fn stored_ids(&self, events: &[UsageEvent]) -> StoreResult<HashSet<String>> {
        let mut stored = HashSet::new();
        for chunk in statement_sized(events) {
            let sql = stored_ids_sql(self.db.backend, chunk.len());
            let mut q = sqlx::query_scalar::<_, String>(&sql);
            for e in chunk {
                q = q.bind(e.id.as_str());
            }
            stored.extend(q.fetch_all(&self.db.pool).await?);
        }
        Ok(stored)
    }

    /// The account's usage from `from` to `now` (Unix ms) and its `recent_limit` newest events.
    ///
    /// Whole hours come from the rollup. The window's first hour is usually cut by `from`; its
    /// part is taken from the raw events of whichever side of the cut is shorter (added when
    /// the rollup starts after the cut, subtracted when it starts before), so at most half an
    /// hour of events is ever read one by one. The newest events walk the table's key
    /// (`user_id, created_at, id`) backwards and stop at the limit.
    pub async fn report(
        &self,
        user_id: &str,
        from: i64,
        now: i64,
        recent_limit: u32,
    ) -> StoreResult<UsageReport> {
        let first_hour = from.div_euclid(HOUR_MS);
        let cut_start = first_hour * HOUR_MS;
        let cut_end = cut_start + HOUR_MS;
        // (rollup from this hour, raw range, whether the raw range is added)
        let (rollup_from, edge) = if from == cut_start {
            (first_hour, None)
        } else if from - cut_start <= cut_end - from {
            (first_hour, Some((cut_start, from, false)))
        } else {
            (first_hour + 1, Some((from, cut_end, true)))
        };
        let last_hour = now.div_euclid(HOUR_MS);
        let by_hour = now - from <= HOURLY_MAX_SPAN_MS;
        let (buckets, by_model, edge_rows, recent, last_call) = tokio::try_join!(
            self.rollup_buckets(user_id, rollup_from, last_hour, by_hour),
            self.rollup_by_model(user_id, rollup_from, last_hour),
            self.edge_by_model(user_id, edge.map(|(a, b, _)| (a, b))),
            self.recent(user_id, from, recent_limit),
            self.last_call(user_id),
        )?;
        let (daily, hourly) = if by_hour {
            let mut daily = BTreeMap::new();
            for (hour, t) in &buckets {
                apply(&mut daily, hour.div_euclid(DAY_HOURS), t, true);
            }
            (daily, Some(buckets))
        } else {
            (buckets, None)
        };
        let mut report = UsageReport {
            daily,
            hourly,
            by_model,
            recent,
            last_call,
        };
        if let Some((_, _, add)) = edge {
            // The edge lies inside one hour, so inside one UTC day.
            let day = first_hour.div_euclid(DAY_HOURS);
            for (model, t) in edge_rows {
                apply(&mut report.daily, day, &t, add);
                if let Some(hourly) = report.hourly.as_mut() {
                    apply(hourly, first_hour, &t, add);
                }
                apply(&mut report.by_model, model, &t, add);
            }
        }
        report.daily.retain(|_, t| t.requests > 0);
        if let Some(hourly) = report.hourly.as_mut() {
            hourly.retain(|_, t| t.requests > 0);
        }
        report.by_model.retain(|_, t| t.requests > 0);
        Ok(report)
    }

    /// Rollup sums per UTC day (or, with `by_hour`, per hour) for hours `from_hour..=to_hour`,
    /// keyed by day or hour number. Two single-key groupings (this and `rollup_by_model`) cost
    /// SQLite a fraction of one grouping by day and model.
    async fn rollup_buckets(
        &self,
        user_id: &str,
        from_hour: i64,
        to_hour: i64,
        by_hour: bool,
    ) -> StoreResult<BTreeMap<i64, UsageTotals>> {
        let statement = if by_hour {
            sql::ROLLUP_BY_HOUR
        } else {
            sql::ROLLUP_BY_DAY
        };
        let rows = sqlx::query_as::<_, BucketRow>(statement)
            .bind(user_id)
            .bind(from_hour)
            .bind(to_hour)
            .fetch_all(&self.db.pool)
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let t = UsageTotals::from_sums([
                    r.requests,
                    r.input_tokens,
                    r.output_tokens,
                    r.total_tokens,
                    r.cached_tokens,
                    r.quota_charged,
                ]);
                (r.bucket, t)
            })
            .collect())
    }

    /// Rollup sums per model for hours `from_hour..=to_hour`.
    async fn rollup_by_model(
        &self,
        user_id: &str,
        from_hour: i64,
        to_hour: i64,
    ) -> StoreResult<BTreeMap<String, UsageTotals>> {
        let rows = sqlx::query_as::<_, ModelRow>(sql::ROLLUP_BY_MODEL)
            .bind(user_id)
            .bind(from_hour)
            .bind(to_hour)
            .fetch_all(&self.db.pool)
            .await?;
        Ok(rows.into_iter().map(ModelRow::into_pair).collect())
    }

    /// Raw event sums per model for `[from, to)`, or nothing when there is no range.
    async fn edge_by_model(
        &self,
        user_id: &str,
        range: Option<(i64, i64)>,
    ) -> StoreResult<Vec<(String, UsageTotals)>> {
        let Some((from, to)) = range else {
            return Ok(Vec::new());
        };
        let rows = sqlx::query_as::<_, ModelRow>(sql::EVENTS_BY_MODEL)
            .bind(user_id)
            .bind(from)
            .bind(to)
            .fetch_all(&self.db.pool)
            .await?;
        Ok(rows.into_iter().map(ModelRow::into_pair).collect())
    }

    /// The `limit` newest events at or after `from`, newest first.
    async fn recent(&self, user_id: &str, from: i64, limit: u32) -> StoreResult<Vec<RecentEvent>> {
        let rows = sqlx::query_as::<_, RecentRow>(sql::RECENT)
            .bind(user_id)
            .bind(from)
            .bind(i64::from(limit))
            .fetch_all(&self.db.pool)
            .await?;
        Ok(rows.into_iter().map(RecentEvent::from).collect())
    }

    /// When the account last called the developer API (newest event), if ever.
    async fn last_call(&self, user_id: &str) -> StoreResult<Option<i64>> {
        Ok(sqlx::query_scalar(sql::LAST_CALL)
            .bind(user_id)
            .fetch_optional(&self.db.pool)
            .await?)
    }

    pub async fn count_for_user(&self, user_id: &str) -> StoreResult<i64> {
        Ok(sqlx::query_scalar(sql::COUNT_FOR_USER)
            .bind(user_id)
            .fetch_one(&self.db.pool)
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_split_into_few_statement_sizes() {
        let mut sizes_seen = HashSet::new();
        for n in 0..=1000usize {
            let items: Vec<usize> = (0..n).collect();
            let chunks: Vec<&[usize]> = statement_sized(&items).collect();
            // Every item once, in order.
            assert_eq!(chunks.concat(), items);
            for c in &chunks {
                assert!(
                    c.len().is_power_of_two() && c.len() <= INSERT_ROWS,
                    "{n}: {}",
                    c.len()
                );
                sizes_seen.insert(c.len());
            }
            // Largest first, so a batch costs at most one statement per bit of its size
            // (plus full-size ones).
            assert!(chunks.windows(2).all(|w| w[0].len() >= w[1].len()));
            assert!(
                chunks.len() <= n / INSERT_ROWS + 9,
                "{n}: {} statements",
                chunks.len()
            );
        }
        assert_eq!(sizes_seen.len(), 9);
    }

    #[test]
    fn insert_texts_have_one_placeholder_per_value() {
        for backend in [Backend::Sqlite, Backend::Postgres] {
            for rows in (0..=INSERT_SIZES as u32)
                .map(|b| 1usize << b)
                .chain([3, 100, 300])
            {
                let sql = insert_sql(backend, rows);
                // A kept text is the text built for that count, and is kept once.
                assert_eq!(sql, build_insert_sql(backend, rows));
                let values = rows * EVENT_COLUMNS;
                match backend {
                    Backend::Sqlite => assert_eq!(sql.matches('?').count(), values),
                    Backend::Postgres => {
                        assert_eq!(sql.matches('$').count(), values);
                        assert!(sql.contains(&format!("${values})")));
                        assert!(!sql.contains(&format!("${}", values + 1)));
                    }
                }
            }
        }
        let kept = insert_sql(Backend::Sqlite, 64);
        assert!(matches!(kept, Cow::Borrowed(_)));
        assert!(std::ptr::eq(
            kept.as_ptr(),
            insert_sql(Backend::Sqlite, 64).as_ptr()
        ));
        assert!(matches!(insert_sql(Backend::Sqlite, 3), Cow::Owned(_)));
    }

    #[tokio::test]
    async fn every_insert_size_prepares_against_the_schema() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("p.db").display());
        let db = Db::connect(&url).await.expect("connect");
        let writer = db.dedicated().await;
        assert_eq!(
            writer.usage().prepare_inserts().await.expect("prepared"),
            INSERT_SIZES
        );
    }

    #[tokio::test]
    async fn the_writers_batch_moves_its_keys_last_use_forward() {
        use crate::domain::Tier;
        use crate::storage::NewKey;
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("u.db").display());
        let db = Db::connect(&url).await.expect("connect");
        let user = db
            .users()
            .create("u@example.com", Tier::ALL[0], false)
            .await
            .expect("user");
        let key = db
            .keys()
            .create(&NewKey::plain(&user.id, "k", "h"))
            .await
            .expect("key");
        let event = |id: &str, at: i64| UsageEvent {
            id: id.into(),
            user_id: user.id.clone(),
            key_id: key.id.clone(),
            model: "m".into(),
            endpoint: "chat_completions",
            status: 200,
            settlement: "provider:complete",
            created_at: at,
            ..UsageEvent::default()
        };
        let last_used = || async {
            let k = db.keys().get(&key.id).await.expect("get").expect("key");
            k.last_used_at
        };
        assert_eq!(last_used().await, None);
        db.usage()
            .insert_batch(&[event("evt_0", 5_000)])
            .await
            .expect("insert");
        assert_eq!(last_used().await, Some(5_000));
        db.usage()
            .insert_batch(&[event("evt_2", 9_000), event("evt_1", 7_000)])
            .await
            .expect("record");
        assert_eq!(last_used().await, Some(9_000));
        // A batch retried after its commit (an id stored) writes the rest; never moved back.
        db.usage()
            .insert_batch(&[event("evt_2", 9_000), event("evt_3", 8_000)])
            .await
            .expect("retried");
        assert_eq!(last_used().await, Some(9_000));
        let stored = db
            .usage()
            .stored_ids(&[0, 1, 2, 3].map(|n| event(&format!("evt_{n}"), 0)))
            .await
            .expect("stored");
        assert_eq!(stored.len(), 4);
    }
}
