//! The developer API as a client sees it: an answer's status and error code, authenticated
//! reads, and the token counts of a recorded usage event.

use serde_json::Value;

use super::{client, Gateway};

/// The status of `r` and the `error.code` of its body ("" when it has none or is not JSON).
pub async fn status_and_code(r: reqwest::Response) -> (u16, String) {
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    (
        status,
        v["error"]["code"].as_str().unwrap_or("").to_string(),
    )
}

/// Of `(status, error code)` answers: how many were served (200) and how many refused for want
/// of quota (429 `insufficient_quota`).
pub fn served_and_refused(results: &[(u16, String)]) -> (usize, usize) {
    let served = results.iter().filter(|(s, _)| *s == 200).count();
    let refused = results
        .iter()
        .filter(|(s, c)| *s == 429 && c == "insufficient_quota")
        .count();
    (served, refused)
}

/// Posts `body` to `path` with `key` in the style of the path's API: a bearer token, or for
/// Anthropic-style paths (`/v1/messages…`, `/alt…`) `x-api-key` and a version header, as the
/// Anthropic SDK sends them.
pub async fn post_in_style(gw: &Gateway, path: &str, key: &str, body: &Value) -> reqwest::Response {
    let req = client().post(gw.url(path)).json(body);
    let req = if path.starts_with("/v1/messages") || path.starts_with("/alt") {
        req.header("x-api-key", key)
            .header("anthropic-version", "2023-06-01")
    } else {
        req.bearer_auth(key)
    };
    req.send().await.expect("request")
}

/// `GET url` with `key` as its bearer token; the answer's JSON.
pub async fn get_json(url: String, key: &str) -> Value {
    client()
        .get(url)
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// `(input_tokens, output_tokens, cached_tokens)` of a usage event from
/// [`Gateway::usage_events`](super::Gateway::usage_events).
pub fn event_tokens(e: &Value) -> (i64, i64, i64) {
    (
        e["input_tokens"].as_i64().unwrap(),
        e["output_tokens"].as_i64().unwrap(),
        e["cached_tokens"].as_i64().unwrap(),
    )
}
