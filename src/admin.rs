//! The operator's read and repair commands (CONTRACT §1): list and show accounts, reset
//! two-factor, list and revoke keys, list lots, usage reports, and the warnings of
//! `config check`. `cli` parses the command line and finds the account; this module does the
//! work and shapes the answer. Everything goes straight to the database, like the other admin
//! commands, so it works whether or not a gateway is running.

use std::collections::BTreeMap;
use std::ffi::OsString;

use clap::{Args, ValueEnum};
use serde_json::{json, Value};

use gateway_core::config::{Config, Provider};
use gateway_core::quota::tiers;
use gateway_core::storage::reports::{GroupUsage, Grouping};
use gateway_core::storage::usage::UsageTotals;
use gateway_core::storage::{Db, StoreError, UserRecord};
use gateway_core::util::{iso_opt, now_ms};
use gateway_site::views::{key_json, lot_json, user_json};

/// What an admin command prints on stdout.
#[derive(Debug)]
pub enum Output {
    /// One JSON object on a line.
    Json(Value),
    /// Text as it is (CSV).
    Text(String),
}

/// A storage failure as an admin command reports it.
pub(crate) fn db_error(e: StoreError) -> String {
    format!("database error: {e}")
}

const MS_PER_DAY: i64 = 86_400_000;
/// Most accounts `user list` prints at once.
const MAX_LIST: u32 = 10_000;
/// Days a report covers when `--since` is not given (`--until` included).
const DEFAULT_REPORT_DAYS: i64 = 30;

fn status_str(u: &UserRecord) -> &'static str {
    if u.suspended {
        "suspended"
    } else {
        "active"
    }
}

/// `user list`: `{"users":[{id,email,status,quotaTier,quotaUnlimited,createdAt,lastLoginAt}]}`.
pub async fn user_list(db: &Db, status: Option<&str>, limit: u32) -> Result<Value, String> {
    if limit == 0 || limit > MAX_LIST {
        return Err(format!("--limit must be between 1 and {MAX_LIST}"));
    }
    let suspended = match status {
        None => None,
        Some("active") => Some(false),
        Some("suspended") => Some(true),
        Some(other) => {
            return Err(format!(
                "--status must be active or suspended, got {other:?}"
            ))
        }
    };
    let users = db
        .users()
        .list(suspended, i64::from(limit))
        .await
        .map_err(db_error)?;
    let users: Vec<Value> = users
        .iter()
        .map(|u| {
            json!({
                "id": u.id,
                "email": u.email,
                "status": status_str(u),
                "quotaTier": u.manual_tier.as_str(),
                "quotaUnlimited": u.unlimited,
                "createdAt": gateway_core::util::iso(u.created_at),
                "lastLoginAt": iso_opt(u.last_login_at),
            })
        })
        .collect();
    Ok(json!({ "users": users }))
}

/// `user show`: the profile (with `status`), every key, the unexpired lots and the quota object
/// the account API shows its owner.
pub async fn user_show(cfg: &Config, db: &Db, user: UserRecord) -> Result<Value, String> {
    let now = now_ms();
    let quota = db.quota();
    let key_store = db.keys();
    let (keys, lots, spend) = tokio::try_join!(
        key_store.list_for_user(&user.id),
        quota.lots(&user.id, now),
        quota.spend(&user.id, now),
    )
    .map_err(db_error)?;
    let status = tiers::status(&cfg.quota, &user, &spend, &lots, now);
    let mut profile = user_json(&user);
    if let Some(obj) = profile.as_object_mut() {
        obj.insert("status".into(), status_str(&user).into());
    }
    Ok(json!({
        "user": profile,
        "keys": keys.iter().map(key_json).collect::<Vec<_>>(),
        "lots": lots.iter().map(lot_json).collect::<Vec<_>>(),
        "quota": status.to_json(&cfg.quota),
    }))
}

/// `user reset-2fa`: two-factor off and its secret gone; the owner can enrol again from the
/// panel. Running gateways see the change through their change feed.
pub async fn reset_two_factor(db: &Db, user: &UserRecord) -> Result<Value, String> {
    db.auth()
        .set_two_factor(&user.id, None, now_ms())
        .await
        .map_err(db_error)?;
    Ok(json!({
        "id": user.id,
        "email": user.email,
        "twoFactorEnabled": false,
        "wasEnabled": user.two_factor_enabled,
    }))
}

/// `key list`: `{"keys":[…]}`, metadata only.
pub async fn key_list(db: &Db, user: &UserRecord) -> Result<Value, String> {
    let keys = db.keys().list_for_user(&user.id).await.map_err(db_error)?;
    Ok(json!({ "keys": keys.iter().map(key_json).collect::<Vec<_>>() }))
}

/// `key revoke`: the key's metadata with `status: "revoked"`. Gateways on this database drop it
/// from their caches at their change feed's next poll (every 250 ms).
pub async fn key_revoke(db: &Db, id: &str) -> Result<Value, String> {
    let key = db
        .keys()
        .revoke_any(id.trim())
        .await
        .map_err(db_error)?
        .ok_or_else(|| format!("no key with id {id:?}"))?;
    Ok(key_json(&key))
}

/// `lot list`: the account's lots, soonest expiry first; expired ones only with `all`.
pub async fn lot_list(db: &Db, user: &UserRecord, all: bool) -> Result<Value, String> {
    let since = if all { i64::MIN } else { now_ms() };
    let lots = db.quota().lots(&user.id, since).await.map_err(db_error)?;
    Ok(json!({ "lots": lots.iter().map(lot_json).collect::<Vec<_>>() }))
}

/// The rows of `usage report`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum By {
    Day,
    Model,
    User,
}

impl By {
    /// The name of the grouping column, in JSON and in the CSV header.
    fn column(self) -> &'static str {
        match self {
            By::Day => "day",
            By::Model => "model",
            By::User => "user",
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Csv,
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Only this account's usage.
    #[arg(long)]
    pub email: Option<String>,
    /// First UTC day, YYYY-MM-DD (default: 29 days before --until).
    #[arg(long)]
    pub since: Option<String>,
    /// Last UTC day, included, YYYY-MM-DD (default: today).
    #[arg(long)]
    pub until: Option<String>,
    /// One row per day (`day`: YYYY-MM-DD), per model (`model`) or per account (`user`: the email).
    #[arg(long, value_enum, default_value_t = By::Day)]
    pub by: By,
    /// `json`: {"rows":[…]}; `csv`: a header line, then one line per row.
    #[arg(long, value_enum, default_value_t = Format::Json)]
    pub format: Format,
}

/// Days since the Unix epoch of a `YYYY-MM-DD` flag value.
fn parse_day(flag: &str, raw: &str) -> Result<i64, String> {
    let format = time::macros::format_description!("[year]-[month]-[day]");
    let date = time::Date::parse(raw.trim(), format)
        .map_err(|_| format!("{flag} must be a date like 2026-01-31, got {raw:?}"))?;
    Ok(date
        .midnight()
        .assume_utc()
        .unix_timestamp()
        .div_euclid(86_400))
}

/// `YYYY-MM-DD` of a day number.
fn day_text(day: i64) -> String {
    gateway_core::util::iso(day.saturating_mul(MS_PER_DAY))
        .chars()
        .take(10)
        .collect()
}

/// One row of `usage report`: a day, model or account's usage, what it was charged in quota,
/// and what its tokens cost at the providers' prices.
#[derive(Debug, Clone, Default, PartialEq)]
struct ReportRow {
    key: String,
    totals: UsageTotals,
    /// At the `[models.price]` of each model that has one.
    provider_cost: f64,
    /// Tokens of models without a price: not in `provider_cost`.
    unpriced_tokens: u64,
}

/// Sums the store's per-model rows into one row per group, pricing each model's tokens at
/// its provider price in the config as it is now (a model no longer configured is unpriced).
fn price_groups(cfg: &Config, rows: Vec<GroupUsage>) -> Vec<ReportRow> {
    let mut groups: BTreeMap<String, ReportRow> = BTreeMap::new();
    for r in rows {
        let row = groups.entry(r.group.clone()).or_insert_with(|| ReportRow {
            key: r.group.clone(),
            ..ReportRow::default()
        });
        row.totals.add(&r.totals);
        let t = &r.totals;
        match cfg.models_by_id.get(&r.model).and_then(|m| m.price) {
            Some(price) => {
                row.provider_cost += price.cost(t.input_tokens, t.cached_tokens, t.output_tokens)
            }
            None => row.unpriced_tokens += t.total_tokens,
        }
    }
    groups.into_values().collect()
}

/// `usage report`: requests, tokens, charged quota and provider cost per day (ascending), model
/// or account (most quota first) over whole UTC days, as `{"rows":[…]}` or CSV with the same
/// columns.
pub async fn usage_report(
    cfg: &Config,
    db: &Db,
    user: Option<&UserRecord>,
    args: &ReportArgs,
) -> Result<Output, String> {
    let until = match &args.until {
        Some(raw) => parse_day("--until", raw)?,
        None => now_ms().div_euclid(MS_PER_DAY),
    };
    let since = match &args.since {
        Some(raw) => parse_day("--since", raw)?,
        None => until - (DEFAULT_REPORT_DAYS - 1),
    };
    if since > until {
        return Err(format!(
            "--since {} is after --until {}",
            day_text(since),
            day_text(until)
        ));
    }
    let grouping = match args.by {
        By::Day => Grouping::Day,
        By::Model => Grouping::Model,
        By::User => Grouping::User,
    };
    let groups = db
        .reports()
        .usage(
            grouping,
            since * 24,
            (until + 1) * 24,
            user.map(|u| u.id.as_str()),
        )
        .await
        .map_err(db_error)?;
    let mut rows = price_groups(cfg, groups);
    if args.by == By::Day {
        for row in &mut rows {
            row.key = row
                .key
                .parse::<i64>()
                .map(day_text)
                .map_err(|e| format!("database returned a bad day: {e}"))?;
        }
        // YYYY-MM-DD sorts as text.
        rows.sort_by(|a, b| a.key.cmp(&b.key));
    } else {
        rows.sort_by(|a, b| {
            b.totals
                .quota_charged
                .cmp(&a.totals.quota_charged)
                .then(b.totals.total_tokens.cmp(&a.totals.total_tokens))
                .then(b.totals.requests.cmp(&a.totals.requests))
                .then(a.key.cmp(&b.key))
        });
    }
    match args.format {
        Format::Json => Ok(Output::Json(report_json(args.by, &rows))),
        Format::Csv => report_csv(args.by, &rows).map(Output::Text),
    }
}

/// The report's columns after the grouping column, with each row's values.
const REPORT_COLUMNS: [&str; 8] = [
    "requests",
    "inputTokens",
    "cachedInputTokens",
    "outputTokens",
    "totalTokens",
    "quotaCharged",
    "providerCost",
    "unpricedTokens",
];

fn report_values(r: &ReportRow) -> [Value; 8] {
    let t = &r.totals;
    [
        t.requests.into(),
        t.input_tokens.into(),
        t.cached_tokens.into(),
        t.output_tokens.into(),
        t.total_tokens.into(),
        t.quota_charged.into(),
        // Cost in the prices' own unit, to a millionth (no float noise in the report).
        ((r.provider_cost * 1e6).round() / 1e6).into(),
        r.unpriced_tokens.into(),
    ]
}

fn report_json(by: By, rows: &[ReportRow]) -> Value {
    let rows: Vec<Value> = rows
        .iter()
        .map(|r| {
            let mut m = serde_json::Map::new();
            m.insert(by.column().into(), r.key.clone().into());
            for (name, value) in REPORT_COLUMNS.iter().zip(report_values(r)) {
                m.insert((*name).into(), value);
            }
            Value::Object(m)
        })
        .collect();
    json!({ "rows": rows })
}

fn report_csv(by: By, rows: &[ReportRow]) -> Result<String, String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let fail = |e: csv::Error| format!("cannot write CSV: {e}");
    w.write_record(std::iter::once(by.column()).chain(REPORT_COLUMNS))
        .map_err(fail)?;
    for r in rows {
        let values = report_values(r).map(|v| v.to_string());
        w.write_record(std::iter::once(r.key.as_str()).chain(values.iter().map(String::as_str)))
            .map_err(fail)?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| format!("cannot write CSV: {e}"))?;
    String::from_utf8(bytes).map_err(|e| format!("cannot write CSV: {e}"))
}

/// Why a request lot just granted to `user` may never be drawn: the account's effective tier
/// (the lot granted included) caps no weekly requests, so its requests are not metered.
pub async fn request_lot_warning(
    cfg: &Config,
    db: &Db,
    user: &UserRecord,
) -> Result<Option<String>, String> {
    let now = now_ms();
    let quota = db.quota();
    let (lots, spend) = tokio::try_join!(quota.lots(&user.id, now), quota.spend(&user.id, now))
        .map_err(db_error)?;
    let status = tiers::status(&cfg.quota, user, &spend, &lots, now);
    if status.unlimited {
        return Ok(Some(format!(
            "{} is unlimited: its requests are not metered, so this request lot is never drawn",
            user.email
        )));
    }
    if status.limits.weekly_requests > 0 {
        return Ok(None);
    }
    let tier = status.effective.as_str();
    Ok(Some(format!(
        "{}'s tier {tier} has no weekly request cap (quota.tiers.{tier}.weekly_requests = 0): \
         its requests are not metered, so this request lot is never drawn while it stays on \
         that tier",
        user.email
    )))
}

/// What `config check` warns about: secrets the environment does not provide (and
/// `[secrets] dev_generate` will not generate), providers whose key variable is unset and a
/// request price no tier's cap makes worth paying, each with what stops working. `env` reads a variable (the process environment outside tests).
pub fn config_warnings(cfg: &Config, env: impl Fn(&str) -> Option<OsString>) -> Vec<String> {
    use gateway_core::secrets::{
        CAPTCHA_SECRET_ENV, KEY_PEPPER_ENV, SESSION_SECRET_ENV, WEBHOOK_SECRET_ENV,
    };
    let set = |name: &str| env(name).is_some_and(|v| !v.is_empty());
    let mut out = Vec::new();
    if !cfg.secrets.dev_generate {
        for (name, affects) in [
            (
                KEY_PEPPER_ENV,
                "the developer API answers 503 key_secret_not_configured and `key create` fails",
            ),
            (
                SESSION_SECRET_ENV,
                "sign-in and the account API answer auth_not_configured",
            ),
            (
                WEBHOOK_SECRET_ENV,
                "payment webhooks are refused, so no order is ever marked paid",
            ),
        ] {
            if !set(name) {
                out.push(format!("{name} is not set: {affects}"));
            }
        }
    }
    if cfg.auth.captcha_required {
        if !set(CAPTCHA_SECRET_ENV) {
            out.push(format!(
                "{CAPTCHA_SECRET_ENV} is not set but auth.captcha_required = true: \
                 sign-in code requests answer captcha_not_configured"
            ));
        }
        if cfg.auth.captcha_verify_url.is_empty() {
            out.push(
                "auth.captcha_verify_url is empty but auth.captcha_required = true: \
                 sign-in code requests answer captcha_not_configured"
                    .into(),
            );
        }
    }
    if cfg
        .payment
        .request_price_vnd_per_thousand
        .is_some_and(|p| p > 0)
        && !cfg.quota.meters_requests()
    {
        out.push(
            "payment.request_price_vnd_per_thousand is set but no tier sets weekly_requests: \
             requests are not metered, so request lots are not sold (the panel offers none and \
             orders with quotaType \"request\" answer invalid_quota_type)"
                .into(),
        );
    }
    for p in cfg.providers.values() {
        if p.style == gateway_core::domain::ProviderStyle::Bedrock && p.lacks_credential() {
            out.push(format!(
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set: provider {} is never \
                 tried until they are ({})",
                p.name,
                served_by(cfg, p)
            ));
            continue;
        }
        let Some(var) = &p.api_key_env else { continue };
        if set(var) {
            continue;
        }
        out.push(format!(
            "{var} is not set: provider {} is never tried until it is ({})",
            p.name,
            served_by(cfg, p)
        ));
    }
    out
}

/// What a provider serves, for a warning: its models and tools.
fn served_by(cfg: &Config, p: &Provider) -> String {
    let mut what: Vec<String> = cfg
        .models
        .iter()
        .filter(|m| m.deployments.iter().any(|d| d.provider.name == p.name))
        .map(|m| format!("model {}", m.id))
        .collect();
    for (tool, provider) in [
        ("POST /v1/search", &cfg.tools.search),
        ("POST /v1/web/fetch", &cfg.tools.web_fetch),
    ] {
        if provider.as_ref().is_some_and(|t| t.name == p.name) {
            what.push(tool.to_string());
        }
    }
    if what.is_empty() {
        "nothing routes to it".into()
    } else {
        what.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_parse_and_print_as_utc_dates() {
        let d = parse_day("--since", "2026-11-25").expect("date");
        assert_eq!(day_text(d), "2026-11-25");
        assert_eq!(parse_day("--since", "1970-01-02"), Ok(1));
        let err = parse_day("--until", "25/11/2026").expect_err("bad");
        assert!(
            err.contains("--until") && err.contains("25/11/2026"),
            "{err}"
        );
    }

    #[test]
    fn csv_quotes_what_needs_quoting() {
        let row = ReportRow {
            key: "a,\"b\"".into(),
            totals: UsageTotals {
                requests: 2,
                input_tokens: 10,
                output_tokens: 5,
                total_tokens: 15,
                cached_tokens: 4,
                quota_charged: 31,
            },
            provider_cost: 0.25,
            unpriced_tokens: 0,
        };
        let text = report_csv(By::Model, &[row]).expect("csv");
        assert_eq!(
            text,
            "model,requests,inputTokens,cachedInputTokens,outputTokens,totalTokens,\
             quotaCharged,providerCost,unpricedTokens\n\"a,\"\"b\"\"\",2,10,4,5,15,31,0.25,0\n"
        );
    }
}
