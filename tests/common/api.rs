//! The developer API as a client sees it: an answer's status and error code, authenticated
//! reads, and the token counts of a recorded usage event.

use serde_json::Value;

use super::client;

/// The status of `r` and the `error.code` of its body ("" when it has none or is not JSON).
pub async fn status_and_code(r: reqwest::Response) -> (u16, String) {
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    (
        status,
        v["error"]["code"].as_str().unwrap_or("").to_string(),
    )
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
