//! `GET /usage?period=`: the account's usage report for a window (spec §8), with its quota.

use std::collections::BTreeMap;

use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::Value;

use super::{load_user, quota};
use crate::error::{Failing, SiteError};
use crate::extract::{Member, Session};
use crate::reply::Reply;
use crate::views::{self, iso_opt, LotView};
use gateway_core::state::SharedState;
use gateway_core::storage::usage::{RecentEvent, UsageReport, UsageTotals};
use gateway_core::util::{iso, now_ms};

/// `recentRequests` holds at most this many events.
pub const RECENT_LIMIT: u32 = 50;
const MS_PER_DAY: i64 = 86_400_000;
const MS_PER_HOUR: i64 = 3_600_000;

/// The report windows of spec §8; anything else is `7d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    Hour,
    Day,
    Week,
    Month,
}

impl Period {
    pub fn parse(raw: Option<&str>) -> Period {
        match raw {
            Some("1h") => Period::Hour,
            Some("24h") => Period::Day,
            Some("30d") => Period::Month,
            _ => Period::Week,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Period::Hour => "1h",
            Period::Day => "24h",
            Period::Week => "7d",
            Period::Month => "30d",
        }
    }

    pub fn millis(self) -> i64 {
        match self {
            Period::Hour => MS_PER_HOUR,
            Period::Day => 24 * MS_PER_HOUR,
            Period::Week => 7 * MS_PER_DAY,
            Period::Month => 30 * MS_PER_DAY,
        }
    }
}

/// The counters every row of the report carries.
#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct Totals {
    requests: u64,
    input_tokens: u64,
    output_tokens: u64,
    total_tokens: u64,
    /// The part of the input read from providers' caches.
    cached_tokens: u64,
    /// Quota tokens charged for these tokens at their models' weights.
    quota_charged: u64,
}

impl From<&UsageTotals> for Totals {
    fn from(t: &UsageTotals) -> Totals {
        Totals {
            requests: t.requests,
            input_tokens: t.input_tokens,
            output_tokens: t.output_tokens,
            total_tokens: t.total_tokens,
            cached_tokens: t.cached_tokens,
            quota_charged: t.quota_charged,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Summary {
    #[serde(flatten)]
    totals: Totals,
    last_api_call: Option<String>,
}

#[derive(Serialize)]
struct Day {
    day: String,
    #[serde(flatten)]
    totals: Totals,
}

#[derive(Serialize)]
struct Hour {
    hour: String,
    #[serde(flatten)]
    totals: Totals,
}

#[derive(Serialize)]
struct ModelRow<'a> {
    model: &'a str,
    #[serde(flatten)]
    totals: Totals,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Recent<'a> {
    id: &'a str,
    model: &'a str,
    reasoning_effort: Option<&'a str>,
    input_tokens: u64,
    output_tokens: u64,
    total_tokens: u64,
    cached_tokens: u64,
    quota_charged: u64,
    created_at: String,
}

impl<'a> From<&'a RecentEvent> for Recent<'a> {
    fn from(e: &'a RecentEvent) -> Recent<'a> {
        Recent {
            id: &e.id,
            model: &e.model,
            reasoning_effort: e.reasoning_effort.as_deref(),
            input_tokens: e.input_tokens,
            output_tokens: e.output_tokens,
            total_tokens: e.total_tokens,
            cached_tokens: e.cached_tokens,
            quota_charged: e.quota_charged,
            created_at: iso(e.created_at),
        }
    }
}

/// The report part of the usage answer.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report<'a> {
    summary: Summary,
    daily: Vec<Day>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hourly: Option<Vec<Hour>>,
    recent_requests: Vec<Recent<'a>>,
    by_model: Vec<ModelRow<'a>>,
}

/// `YYYY-MM-DD` of a day number (days since the Unix epoch, UTC).
fn day_string(day: i64) -> String {
    iso(day.saturating_mul(MS_PER_DAY))
        .chars()
        .take(10)
        .collect()
}

/// `summary`, `daily` (every UTC day from the one `from` falls in to today, ascending, zeros
/// included so charts need no gap filling), `hourly` when the report has hours (every UTC hour
/// from the one `from` falls in to the current one, the same way; windows of a day or less),
/// `recentRequests`, `byModel` (most tokens first).
pub fn report_json(report: &UsageReport, from: i64, now: i64) -> Report<'_> {
    let mut days: BTreeMap<i64, UsageTotals> = (from.div_euclid(MS_PER_DAY)
        ..=now.div_euclid(MS_PER_DAY))
        .map(|d| (d, UsageTotals::default()))
        .collect();
    for (day, t) in &report.daily {
        days.entry(*day).or_default().add(t);
    }
    let daily = days
        .iter()
        .map(|(day, t)| Day {
            day: day_string(*day),
            totals: t.into(),
        })
        .collect();
    let hourly = report.hourly.as_ref().map(|stored| {
        (from.div_euclid(MS_PER_HOUR)..=now.div_euclid(MS_PER_HOUR))
            .map(|hour| Hour {
                hour: iso(hour.saturating_mul(MS_PER_HOUR)),
                totals: stored.get(&hour).map(Totals::from).unwrap_or_default(),
            })
            .collect()
    });
    let mut by_model: Vec<(&str, &UsageTotals)> = report
        .by_model
        .iter()
        .map(|(m, t)| (m.as_str(), t))
        .collect();
    by_model.sort_by(|a, b| {
        b.1.quota_charged
            .cmp(&a.1.quota_charged)
            .then(b.1.total_tokens.cmp(&a.1.total_tokens))
            .then(b.1.requests.cmp(&a.1.requests))
            .then(a.0.cmp(b.0))
    });
    Report {
        summary: Summary {
            totals: (&report.summary()).into(),
            last_api_call: iso_opt(report.last_call),
        },
        daily,
        hourly,
        recent_requests: views::all(&report.recent),
        by_model: by_model
            .into_iter()
            .map(|(model, t)| ModelRow {
                model,
                totals: t.into(),
            })
            .collect(),
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct UsageAnswer<'a> {
    ok: bool,
    period: &'static str,
    starts_at: String,
    quota: Value,
    quota_lots: Vec<LotView<'a>>,
    #[serde(flatten)]
    report: Report<'a>,
    models: Vec<ModelWeights<'a>>,
}

/// A configured model's quota weights (quota tokens per input, output and cached input
/// token), in file order: the usage page's price list.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ModelWeights<'a> {
    id: &'a str,
    input_weight: f64,
    output_weight: f64,
    cached_input_weight: f64,
}

pub(super) async fn usage(
    State(state): State<SharedState>,
    Member(Session(session)): Member<Session>,
    RawQuery(query): RawQuery,
) -> Result<Response, SiteError> {
    let cfg = state.config();
    let period = form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "period")
        .map(|(_, v)| v.into_owned());
    let period = Period::parse(period.as_deref());
    let now = now_ms();
    let from = now - period.millis();
    let failure = SiteError::UsageQueryFailed;
    let user = load_user(&state, &session.user_id, failure).await?;
    let ((quota, lots), report) =
        tokio::try_join!(quota(&state, &cfg, &user, now, failure), async {
            state
                .db
                .usage()
                .report(&user.id, from, now, RECENT_LIMIT)
                .await
                .or_fail(failure)
        },)?;
    Ok(Reply(UsageAnswer {
        ok: true,
        period: period.as_str(),
        starts_at: iso(from),
        quota,
        quota_lots: views::all(&lots),
        report: report_json(&report, from, now),
        models: cfg
            .models
            .iter()
            .map(|m| {
                let (input_weight, output_weight, cached_input_weight) = m.weights.as_f64();
                ModelWeights {
                    id: &m.id,
                    input_weight,
                    output_weight,
                    cached_input_weight,
                }
            })
            .collect(),
    })
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn periods_default_to_a_week() {
        assert_eq!(Period::parse(Some("1h")), Period::Hour);
        assert_eq!(Period::parse(Some("24h")), Period::Day);
        assert_eq!(Period::parse(Some("30d")), Period::Month);
        assert_eq!(Period::parse(Some("7d")), Period::Week);
        assert_eq!(Period::parse(Some("90d")), Period::Week);
        assert_eq!(Period::parse(None), Period::Week);
        assert_eq!(Period::Month.millis(), 30 * MS_PER_DAY);
    }

    fn value(report: &UsageReport, from: i64, now: i64) -> Value {
        serde_json::to_value(report_json(report, from, now)).expect("json")
    }

    #[test]
    fn report_fills_days_and_ranks_models() {
        let day = 20_000i64;
        let from = day * MS_PER_DAY + 5 * 3_600_000;
        let now = (day + 2) * MS_PER_DAY + 60_000;
        let t = |r, i, o| UsageTotals {
            requests: r,
            input_tokens: i,
            output_tokens: o,
            total_tokens: i + o,
            cached_tokens: 0,
            quota_charged: 2 * (i + o),
        };
        let mut report = UsageReport::default();
        report.daily.insert(day, t(2, 11, 6));
        report.daily.insert(day + 2, t(2, 30, 11));
        report.by_model.insert("a".into(), t(2, 11, 6));
        report.by_model.insert("b".into(), t(2, 30, 11));
        report.recent.push(RecentEvent {
            id: "evt_1".into(),
            model: "b".into(),
            reasoning_effort: Some("low".into()),
            input_tokens: 15,
            output_tokens: 5,
            total_tokens: 20,
            cached_tokens: 3,
            quota_charged: 41,
            created_at: now - 1,
        });
        report.last_call = Some(now - 1);
        let v = value(&report, from, now);
        assert_eq!(
            v["summary"],
            json!({"requests": 4, "inputTokens": 41, "outputTokens": 17, "totalTokens": 58,
                   "cachedTokens": 0, "quotaCharged": 116, "lastApiCall": iso(now - 1)})
        );
        let days: Vec<&str> = v["daily"]
            .as_array()
            .expect("daily")
            .iter()
            .map(|d| d["day"].as_str().expect("day"))
            .collect();
        assert_eq!(days, vec!["2024-10-04", "2024-10-05", "2024-10-06"]);
        assert_eq!(v["daily"][1]["requests"], json!(0));
        assert_eq!(v["daily"][2]["totalTokens"], json!(41));
        assert_eq!(v["byModel"][0]["model"], json!("b"));
        assert_eq!(v["byModel"][1]["requests"], json!(2));
        assert_eq!(v["recentRequests"][0]["reasoningEffort"], json!("low"));
        assert!(
            v.get("hourly").is_none(),
            "no hours in a report without them"
        );

        // A day's window: one bucket per hour, the cut first hour included, zeros filled.
        let from = day * MS_PER_DAY + 5 * MS_PER_HOUR + 60_000;
        let now = from + MS_PER_DAY;
        let first = from.div_euclid(MS_PER_HOUR);
        report.hourly = Some(
            [(first, t(1, 5, 2)), (first + 24, t(3, 7, 1))]
                .into_iter()
                .collect(),
        );
        let v = value(&report, from, now);
        let hourly = v["hourly"].as_array().expect("hourly");
        assert_eq!(hourly.len(), 25);
        assert_eq!(hourly[0]["hour"], json!("2024-10-04T05:00:00.000Z"));
        assert_eq!(hourly[0]["requests"], json!(1));
        assert_eq!(hourly[1]["requests"], json!(0));
        assert_eq!(hourly[24]["hour"], json!("2024-10-05T05:00:00.000Z"));
        assert_eq!(hourly[24]["totalTokens"], json!(8));
    }
}
