//! The Responses API on every kind of model: the harness's mock as a chat-only OpenAI-style
//! provider beside the standard ones, and readers of what the client and the mock saw.

use serde_json::Value;

use super::{Mock, Options};

/// A chat-only OpenAI-style provider (no `/v1/responses`), and models that make the mock fail.
pub const EXTRA: &str = r#"
[[providers]]
name = "mock-chat-only"
style = "openai"
base_url = "MOCK_URL"
api_key_env = "MOCK_OPENAI_KEY"
endpoints = ["chat"]

[[models]]
id = "gpt-chat-only"
provider = "mock-chat-only"
default_output_tokens = 256

[[models]]
id = "gpt-chat-tools"
provider = "mock-chat-only"
upstream_model = "tools"

[[models]]
id = "gpt-chat-bad"
provider = "mock-chat-only"
upstream_model = "fail400"

[[models]]
id = "claude-bad"
provider = "mock-anthropic"
upstream_model = "fail400"

[[models]]
id = "claude-big"
provider = "mock-anthropic"

[[models]]
id = "claude-cut"
provider = "mock-anthropic"
upstream_model = "cut"

[[models]]
id = "claude-think-tools"
provider = "mock-anthropic"
upstream_model = "think-tools"
"#;

/// The harness options with [`EXTRA`] (its `MOCK_URL` the mock's) and `extra` appended.
pub fn options(mock: &Mock, extra: &str) -> Options {
    Options {
        extra_toml: format!("{}{extra}", EXTRA.replace("MOCK_URL", &mock.url())),
        ..Options::default()
    }
}

/// The mock's record of the last request it served: path and JSON body.
pub async fn last_upstream(mock: &Mock) -> (String, Value) {
    let seen = mock.requests().await;
    let last = seen.last().expect("the mock saw a request").clone();
    let body = serde_json::from_str(last["body"].as_str().unwrap_or("null")).expect("body JSON");
    (last["path"].as_str().unwrap_or("").to_string(), body)
}

/// The Responses events of a stream, checking every frame's `event:` line matches its type and
/// that the sequence numbers count up from zero.
pub fn responses_events(text: &str) -> Vec<Value> {
    let events: Vec<Value> = text
        .split("\n\n")
        .filter(|f| !f.is_empty())
        .map(|f| {
            let mut lines = f.lines();
            let event = lines
                .next()
                .and_then(|l| l.strip_prefix("event: "))
                .expect("event line");
            let data = lines
                .next()
                .and_then(|l| l.strip_prefix("data: "))
                .expect("data line");
            let v: Value = serde_json::from_str(data).expect("event JSON");
            assert_eq!(v["type"], event, "{text}");
            v
        })
        .collect();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{text}");
    }
    events
}

/// The `type` of each event.
pub fn types(events: &[Value]) -> Vec<&str> {
    events.iter().filter_map(|e| e["type"].as_str()).collect()
}
