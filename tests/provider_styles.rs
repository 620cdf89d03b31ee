//! The cloud provider styles through the real server: Azure OpenAI, Anthropic on AWS Bedrock
//! and on Google Vertex AI, and the Gemini API, each against the bundled mock speaking that
//! cloud. For each: plain and streamed answers and both client styles across, billed exactly the
//! usage the provider reported (the recorded answers under `tests/fixtures/providers/`); the
//! request as the cloud wants it (paths, query strings the gateway writes itself, body fields);
//! the credentials checked by the mock as the cloud checks them (the `api-key`, the SigV4
//! signature recomputed from the request, the OAuth token it issued against an assertion signed
//! with a key made for the test); and each cloud's errors in the client's style and in the
//! deployment's health.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine;
use common::api::{event_tokens, post_in_style};
use common::*;
use serde_json::{json, Value};

const AZURE_KEY: &str = "azure-test-key-5f1c9a7e2b84";
const GEMINI_KEY: &str = "AIzaSyGatewayTestKey0123456789abcdef";
const AWS_ID: &str = "AKIAGATEWAYTEST00001";
const AWS_SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYGATEWAYKEY";
const AWS_TOKEN: &str = "IQoJb3JpZ2luX2VjEGatewayTestSessionToken==";
const AWS_REGION: &str = "eu-central-1";
const SA_EMAIL: &str = "gateway@gateway-test.iam.gserviceaccount.com";

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/providers")
}

/// The body of a recorded answer, as the provider sent it.
fn fixture_body(name: &str) -> Vec<u8> {
    let raw = std::fs::read(fixture_dir().join(format!("{name}.http"))).expect("fixture");
    let at = raw.windows(2).position(|w| w == b"\n\n").expect("head");
    raw[at + 2..].to_vec()
}

/// A service account made for the test: an RSA key (`openssl`), its key file as Google writes
/// them, and its public half for the mock. Returns (key file, public key).
fn service_account(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let private = dir.join(format!("{name}.pem"));
    let public = dir.join(format!("{name}.pub.pem"));
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .output()
            .expect("openssl");
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    run(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        private.to_str().unwrap(),
    ]);
    run(&[
        "pkey",
        "-in",
        private.to_str().unwrap(),
        "-pubout",
        "-out",
        public.to_str().unwrap(),
    ]);
    let file = dir.join(format!("{name}.json"));
    let key = json!({
        "type": "service_account",
        "project_id": "gateway-test",
        "private_key_id": format!("{name}-key-id"),
        "private_key": std::fs::read_to_string(&private).unwrap(),
        "client_email": SA_EMAIL,
        "client_id": "104000000000000000001",
        "token_uri": "https://oauth2.googleapis.com/token",
    });
    std::fs::write(&file, key.to_string()).unwrap();
    (file, public)
}

/// The mock speaking every cloud with the test's credentials, and a gateway with a provider of
/// each style on it (and ones holding wrong credentials), plus `models`.
struct Clouds {
    mock: Mock,
    gw: Gateway,
    key: String,
    _keys: tempfile::TempDir,
}

fn start(models: &str, mock_extra: &[&str], gateway_aws_secret: &str) -> Clouds {
    let keys = tempfile::tempdir().unwrap();
    let (account, public) = service_account(keys.path(), "sa");
    let (stranger, _) = service_account(keys.path(), "stranger");
    let fixtures = fixture_dir();
    let mut args = vec![
        "--fixtures",
        fixtures.to_str().unwrap(),
        "--azure-key",
        AZURE_KEY,
        "--gemini-key",
        GEMINI_KEY,
        "--aws-access-key-id",
        AWS_ID,
        "--aws-secret-access-key",
        AWS_SECRET,
        "--aws-session-token",
        AWS_TOKEN,
        "--aws-region",
        AWS_REGION,
        "--gcp-public-key",
        public.to_str().unwrap(),
        "--gcp-client-email",
        SA_EMAIL,
    ];
    args.extend_from_slice(mock_extra);
    let mock = Mock::start(&args);
    let url = mock.url();
    let toml = format!(
        r#"
[[providers]]
name = "azure"
style = "azure"
base_url = "{url}"
api_key_env = "AZURE_TEST_KEY"
api_version = "2024-10-21"

[[providers]]
name = "azure-v1"
style = "azure"
base_url = "{url}"
api_key_env = "AZURE_TEST_KEY"
api_version = "v1"

[[providers]]
name = "azure-wrong-key"
style = "azure"
base_url = "{url}"
api_key_env = "AZURE_WRONG_KEY"
api_version = "2024-10-21"

[[providers]]
name = "bedrock"
style = "bedrock"
base_url = "{url}"
region = "{AWS_REGION}"
eject_after_failures = 1

[[providers]]
name = "vertex"
style = "vertex-anthropic"
base_url = "{url}"
region = "us-east5"
project = "gateway-test"
credentials_file = "{account}"
token_url = "{url}/token"

[[providers]]
name = "vertex-stranger"
style = "vertex-anthropic"
base_url = "{url}"
region = "us-east5"
credentials_file = "{stranger}"
token_url = "{url}/token"

[[providers]]
name = "gemini"
style = "gemini"
base_url = "{url}"
api_key_env = "GEMINI_TEST_KEY"

[[providers]]
name = "gemini-wrong-key"
style = "gemini"
base_url = "{url}"
api_key_env = "GEMINI_WRONG_KEY"
{models}"#,
        account = account.display(),
        stranger = stranger.display(),
    );
    let env = [
        ("AZURE_TEST_KEY", AZURE_KEY),
        ("AZURE_WRONG_KEY", "azure-key-of-another-resource"),
        ("GEMINI_TEST_KEY", GEMINI_KEY),
        ("GEMINI_WRONG_KEY", "AIzaSyNotTheKeyOfThisProject000000"),
        ("AWS_ACCESS_KEY_ID", AWS_ID),
        ("AWS_SECRET_ACCESS_KEY", gateway_aws_secret),
        ("AWS_SESSION_TOKEN", AWS_TOKEN),
    ];
    let opts = Options {
        extra_toml: toml,
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Options::default()
    }
    .on_test_redis();
    let gw = Gateway::start(&mock, opts);
    let key = gw.user_with_key(
        "clouds@example.com",
        &["--rpm", "9000", "--itpm", "90000000", "--otpm", "90000000"],
    );
    Clouds {
        mock,
        gw,
        key,
        _keys: keys,
    }
}

/// A `[[models]]` block.
fn model(id: &str, provider: &str, upstream: &str) -> String {
    format!(
        "\n[[models]]\nid = \"{id}\"\nprovider = \"{provider}\"\nupstream_model = \"{upstream}\"\nmax_output_tokens = 64000\n"
    )
}

/// The client's view of one answer.
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.text()))
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Clouds {
    /// POSTs `body` with `model` to `path`, in the path's client style.
    async fn call(&self, path: &str, model: &str, mut body: Value) -> Answer {
        body["model"] = json!(model);
        let r = post_in_style(&self.gw, path, &self.key, &body).await;
        Answer {
            status: r.status().as_u16(),
            headers: r.headers().clone(),
            body: r.bytes().await.expect("body").to_vec(),
        }
    }

    /// (input, output, cached) of the usage event of `model`.
    async fn usage(&self, model: &str) -> (i64, i64, i64) {
        for _ in 0..200 {
            let events = self.gw.usage_events().await;
            if let Some(e) = events.iter().find(|e| e["model"] == model) {
                return event_tokens(e);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("no usage event for {model}");
    }

    /// The usage event of `model` whole.
    async fn event(&self, model: &str) -> Value {
        self.usage(model).await;
        let events = self.gw.usage_events().await;
        events.into_iter().find(|e| e["model"] == model).unwrap()
    }

    /// The requests the mock received whose path contains `needle`.
    async fn received(&self, needle: &str) -> Vec<Value> {
        self.mock
            .requests()
            .await
            .into_iter()
            .filter(|r| r["path"].as_str().unwrap_or("").contains(needle))
            .collect()
    }

    async fn stats(&self) -> Value {
        reqwest::get(format!("{}/__mock/stats", self.mock.url()))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

fn chat(stream: bool) -> Value {
    json!({"messages": [{"role": "system", "content": "Antworte auf Deutsch."},
                        {"role": "user", "content": "Grüß dich"}],
           "stream": stream,
           "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null }})
}

fn messages(stream: bool) -> Value {
    json!({"max_tokens": 1024, "system": "Antworte auf Deutsch.",
           "messages": [{"role": "user", "content": "Grüß dich"}], "stream": stream})
}

/// The events of an SSE body: (event name, data).
fn events(text: &str) -> Vec<(Option<String>, String)> {
    text.replace("\r\n", "\n")
        .split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|block| {
            let mut name = None;
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push(d);
                }
            }
            (name, data.join("\n"))
        })
        .collect()
}

fn json_events(text: &str) -> Vec<Value> {
    events(text)
        .into_iter()
        .filter(|(_, d)| d != "[DONE]")
        .map(|(_, d)| serde_json::from_str(&d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

/// What a chat stream says: its text, reasoning, tool calls (name, arguments), finish reason,
/// usage chunk and error.
#[derive(Default, Debug)]
struct ChatRead {
    content: String,
    reasoning: String,
    calls: Vec<(String, String, String)>,
    finish: Option<String>,
    usage: Option<Value>,
    error: Option<Value>,
}

fn read_chat(text: &str) -> ChatRead {
    let evs = events(text);
    assert_eq!(
        evs.last().map(|e| e.1.as_str()),
        Some("[DONE]"),
        "chat streams end with [DONE]: {text}"
    );
    let mut out = ChatRead::default();
    for v in json_events(text) {
        if let Some(e) = v.get("error") {
            out.error = Some(e.clone());
            continue;
        }
        if v["usage"].is_object() {
            out.usage = Some(v["usage"].clone());
        }
        let Some(choice) = v["choices"].get(0) else {
            continue;
        };
        let delta = &choice["delta"];
        out.content += delta["content"].as_str().unwrap_or("");
        out.reasoning += delta["reasoning_content"].as_str().unwrap_or("");
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = call["index"].as_u64().unwrap() as usize;
            if out.calls.len() <= i {
                out.calls.push((
                    call["id"].as_str().unwrap_or("").into(),
                    call["function"]["name"].as_str().unwrap_or("").into(),
                    String::new(),
                ));
            }
            out.calls[i].2 += call["function"]["arguments"].as_str().unwrap_or("");
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            out.finish = Some(f.into());
        }
    }
    out
}

/// What an Anthropic stream says: its text, tool uses (name, input JSON text), stop reason and
/// error; checks the event names match the types.
#[derive(Default, Debug)]
struct MessagesRead {
    text: String,
    tools: Vec<(String, String)>,
    stop: Option<String>,
    error: Option<Value>,
}

fn read_messages(text: &str) -> MessagesRead {
    let mut out = MessagesRead::default();
    for (name, data) in events(text) {
        let v: Value = serde_json::from_str(&data).unwrap_or_else(|e| panic!("{e}: {data}"));
        assert_eq!(name.as_deref(), v["type"].as_str(), "{data}");
        match v["type"].as_str().unwrap() {
            "content_block_start" if v["content_block"]["type"] == "tool_use" => out.tools.push((
                v["content_block"]["name"].as_str().unwrap().into(),
                String::new(),
            )),
            "content_block_delta" => match v["delta"]["type"].as_str().unwrap() {
                "text_delta" => out.text += v["delta"]["text"].as_str().unwrap(),
                "input_json_delta" => {
                    out.tools.last_mut().unwrap().1 += v["delta"]["partial_json"].as_str().unwrap()
                }
                _ => {}
            },
            "message_delta" => out.stop = v["delta"]["stop_reason"].as_str().map(String::from),
            "error" => out.error = Some(v["error"].clone()),
            _ => {}
        }
    }
    out
}

#[tokio::test]
async fn azure_serves_both_styles_at_its_deployment_and_v1_paths() {
    let mut toml = String::new();
    for (id, provider, upstream) in [
        ("az-stream", "azure", "replay:azure/chat_stream@awkward#1"),
        ("az-whole", "azure", "replay:azure/chat_completion#2"),
        (
            "az-msg-stream",
            "azure",
            "replay:azure/chat_stream@every-7#3",
        ),
        ("az-msg-whole", "azure", "replay:azure/chat_completion#4"),
        ("az-resp-stream", "azure", "replay:azure/chat_stream#5"),
        ("az-v1", "azure-v1", "gpt-4o-mini-prod"),
        ("az-embed", "azure", "text-embedding-3-small"),
        (
            "az-filter",
            "azure",
            "replay:azure/error_400_content_filter#6",
        ),
        (
            "az-filter-b",
            "azure",
            "replay:azure/error_400_content_filter#7",
        ),
        ("az-429", "azure", "replay:azure/error_429#8"),
        ("az-wrong-key", "azure-wrong-key", "gpt-4o"),
    ] {
        toml.push_str(&model(id, provider, upstream));
    }
    let c = start(&toml, &[], AWS_SECRET);

    // Chat, streamed: Azure's own stream (its prompt filter results first, the usage chunk
    // last) passes through byte for byte; exactly its usage is billed.
    let a = c
        .call("/v1/chat/completions", "az-stream", chat(true))
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.body, fixture_body("azure/chat_stream"), "{}", a.text());
    assert_eq!(c.usage("az-stream").await, (1520, 12, 1280));
    // Whole: as Azure answered it, usage with cached and reasoning tokens.
    let a = c
        .call("/v1/chat/completions", "az-whole", chat(false))
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.body, fixture_body("azure/chat_completion"));
    assert_eq!(c.usage("az-whole").await, (2048, 64, 1024));

    // Style B on Azure: translated both ways, billed the same usage.
    let a = c
        .call("/v1/messages", "az-msg-stream", messages(true))
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let read = read_messages(&a.text());
    assert_eq!(read.text, "Grüß dich! Schön, dass du da bist.");
    assert_eq!(read.stop.as_deref(), Some("end_turn"));
    assert_eq!(c.usage("az-msg-stream").await, (1520, 12, 1280));
    let a = c
        .call("/v1/messages", "az-msg-whole", messages(false))
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let v = a.json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["content"][0]["text"], "Grüß dich! Wie kann ich helfen?");
    assert_eq!(c.usage("az-msg-whole").await, (2048, 64, 1024));
    // Responses on a deployment without /responses: through chat completions.
    let a = c
        .call(
            "/v1/responses",
            "az-resp-stream",
            json!({"input": "Grüß dich", "stream": true}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert!(a.text().contains("response.completed"), "{}", a.text());
    assert_eq!(c.usage("az-resp-stream").await, (1520, 12, 1280));

    // The requests as Azure wants them: the deployment in the path, `api-version` the gateway
    // writes (the client's query string is never passed on), the key as `api-key` only.
    let sent = c.received("/openai/deployments/").await;
    let first = sent
        .iter()
        .find(|r| {
            r["path"]
                == "/openai/deployments/replay%3Aazure%2Fchat_stream%40awkward%231/chat/completions"
        })
        .expect("the deployment path");
    assert_eq!(first["query"], "api-version=2024-10-21");
    assert_eq!(first["headers"]["api-key"], AZURE_KEY);
    assert!(first["headers"].get("authorization").is_none());
    let body: Value = serde_json::from_str(first["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["stream_options"]["include_usage"], true);
    let msg = sent
        .iter()
        .find(|r| r["path"].as_str().unwrap().contains("every-7"))
        .unwrap();
    let body: Value = serde_json::from_str(msg["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["messages"][0]["role"], "system", "{body}");

    // A client's query string stays behind; v1 names the deployment in the body.
    let r = client()
        .post(c.gw.url("/v1/chat/completions?api-version=1999-01-01&x=1"))
        .bearer_auth(&c.key)
        .json(&json!({"model": "az-v1", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v1 = c.received("/openai/v1/chat/completions").await;
    assert_eq!(v1.len(), 1);
    assert_eq!(v1[0]["query"], Value::Null);
    assert_eq!(v1[0]["headers"]["api-key"], AZURE_KEY);
    let body: Value = serde_json::from_str(v1[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["model"], "gpt-4o-mini-prod");
    assert_eq!(c.usage("az-v1").await, (25, 24, 5));
    // Embeddings at their deployment path.
    let r = post_in_style(
        &c.gw,
        "/v1/embeddings",
        &c.key,
        &json!({"model": "az-embed", "input": "hello"}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let e = c
        .received("/openai/deployments/text-embedding-3-small/embeddings")
        .await;
    assert_eq!(e[0]["query"], "api-version=2024-10-21");

    // Azure's content filter: a 400 in each client's style, with its code for style A.
    let a = c
        .call("/v1/chat/completions", "az-filter", chat(false))
        .await;
    assert_eq!(a.status, 400);
    assert_eq!(a.json()["error"]["code"], "content_filter");
    let a = c.call("/v1/messages", "az-filter-b", messages(false)).await;
    assert_eq!(a.status, 400);
    let v = a.json();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("content management policy"));
    // Throttled: 429 with its wait, and the deployment sits it out.
    let a = c.call("/v1/chat/completions", "az-429", chat(false)).await;
    assert_eq!(a.status, 429);
    assert_eq!(a.header("retry-after"), Some("2"));
    // A key Azure does not know: the mock refuses it, the client hears it is the operator's.
    let a = c
        .call("/v1/chat/completions", "az-wrong-key", chat(false))
        .await;
    assert_eq!(
        (a.status, a.json()["error"]["code"].clone()),
        (502, json!("provider_auth_failed"))
    );
    let refused = c.received("/openai/deployments/gpt-4o/").await;
    assert_eq!(
        refused[0]["headers"]["api-key"],
        "azure-key-of-another-resource"
    );
    let log = c.gw.log();
    assert!(
        log.contains("deployment azure/replay:azure/error_429#8 ejected for 2.0 s"),
        "{log}"
    );
}

/// The Anthropic events in a Bedrock stream fixture, as Anthropic would have sent them.
fn bedrock_events(name: &str) -> Vec<Value> {
    let body = String::from_utf8(fixture_body(name)).unwrap();
    let lines: Vec<&str> = body.lines().filter(|l| !l.trim().is_empty()).collect();
    lines
        .chunks(2)
        .filter_map(|pair| {
            let payload: Value = serde_json::from_str(pair[1]).ok()?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(payload["bytes"].as_str()?)
                .ok()?;
            let mut v: Value = serde_json::from_slice(&bytes).ok()?;
            v.as_object_mut()?
                .remove("amazon-bedrock-invocationMetrics");
            Some(v)
        })
        .collect()
}

#[tokio::test]
async fn bedrock_signs_its_requests_and_streams_are_reframed_as_sse() {
    let mut toml = String::new();
    for (id, upstream) in [
        ("br-stream", "replay:bedrock/invoke_stream@awkward#1"),
        ("br-whole", "replay:bedrock/invoke#2"),
        (
            "br-chat-tools",
            "replay:bedrock/invoke_stream_tools@every-5#3",
        ),
        ("br-chat-whole", "replay:bedrock/invoke#4"),
        (
            "br-throttled-stream",
            "replay:bedrock/invoke_stream_throttled@awkward#5",
        ),
        ("br-429", "replay:bedrock/error_429_throttling#6"),
        ("br-synthetic", "anthropic.claude-sonnet-4-20250514-v1:0"),
    ] {
        toml.push_str(&model(id, "bedrock", upstream));
    }
    toml.push_str(&model(
        "br-quota",
        "bedrock",
        "replay:bedrock/error_400_quota#7",
    ));
    toml.push_str(&model(
        "br-invalid",
        "bedrock",
        "replay:bedrock/error_400_validation#9",
    ));
    let c = start(&toml, &[], AWS_SECRET);

    // Style B, streamed: Bedrock's binary event stream, cut inside its frames, reaches the
    // client as Anthropic's SSE (the invocation metrics left out), billed its usage.
    let a = c.call("/v1/messages", "br-stream", messages(true)).await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert!(a
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    assert_eq!(
        json_events(&a.text()),
        bedrock_events("bedrock/invoke_stream")
    );
    assert_eq!(c.usage("br-stream").await, (14 + 512 + 1024, 11, 1024));
    // Whole: as Bedrock answered it.
    let a = c.call("/v1/messages", "br-whole", messages(false)).await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.body, fixture_body("bedrock/invoke"));
    assert_eq!(
        a.header("x-provider-request-id"),
        Some("3f0e2c8a-7d41-4b9e-a6c3-5b8d9e1f2a7c")
    );
    assert!(a.header("x-amzn-bedrock-input-token-count").is_none());
    assert_eq!(c.usage("br-whole").await, (22 + 1600, 48, 1600));

    // Style A on Bedrock: a tool call streamed across, and a whole answer.
    let a = c
        .call("/v1/chat/completions", "br-chat-tools", chat(true))
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let read = read_chat(&a.text());
    assert_eq!(read.content, "Ich sehe nach.");
    assert_eq!(read.calls.len(), 1);
    assert_eq!(read.calls[0].1, "get_weather");
    assert_eq!(
        serde_json::from_str::<Value>(&read.calls[0].2).unwrap(),
        json!({"city": "München"})
    );
    assert_eq!(read.finish.as_deref(), Some("tool_calls"));
    assert_eq!(read.usage.unwrap()["prompt_tokens"], 391);
    assert_eq!(c.usage("br-chat-tools").await, (391, 57, 0));
    let a = c
        .call("/v1/chat/completions", "br-chat-whole", chat(false))
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert!(a.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .starts_with("Grüß dich!"));
    assert_eq!(c.usage("br-chat-whole").await, (1622, 48, 1600));

    // The requests the mock accepted carried a SigV4 signature it recomputed; they went to
    // InvokeModel paths with Bedrock's body (no model, no stream, its anthropic_version).
    let r = client()
        .post(c.gw.url("/v1/messages"))
        .header("x-api-key", &c.key)
        .header("anthropic-version", "2023-06-01")
        .header(
            "anthropic-beta",
            "context-1m-2025-08-07, token-efficient-tools-2025-02-19",
        )
        .json(
            &json!({"model": "br-synthetic", "max_tokens": 100, "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(read_messages(&text).text.starts_with("tok0 "), "{text}");
    assert_eq!(c.usage("br-synthetic").await, (30, 24, 5));
    let sent = c
        .received("/model/anthropic.claude-sonnet-4-20250514-v1%3A0/invoke-with-response-stream")
        .await;
    assert_eq!(sent.len(), 1);
    let h = &sent[0]["headers"];
    let auth = h["authorization"].as_str().unwrap();
    assert!(
        auth.starts_with(&format!("AWS4-HMAC-SHA256 Credential={AWS_ID}/")),
        "{auth}"
    );
    assert!(
        auth.contains(&format!("/{AWS_REGION}/bedrock/aws4_request")),
        "{auth}"
    );
    assert_eq!(h["x-amz-security-token"], AWS_TOKEN);
    assert!(h.get("x-api-key").is_none() && h.get("anthropic-version").is_none());
    let body: Value = serde_json::from_str(sent[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["anthropic_version"], "bedrock-2023-05-31");
    assert!(
        body.get("model").is_none() && body.get("stream").is_none(),
        "{body}"
    );
    assert_eq!(
        body["anthropic_beta"],
        json!(["context-1m-2025-08-07", "token-efficient-tools-2025-02-19"])
    );
    assert!(c.received("/invoke").await.len() >= 4);

    // An exception mid-stream reaches the client as Anthropic's error event.
    let a = c
        .call("/v1/messages", "br-throttled-stream", messages(true))
        .await;
    assert_eq!(a.status, 200);
    let read = read_messages(&a.text());
    assert_eq!(read.text, "Grüß");
    assert_eq!(read.error.unwrap()["type"], "rate_limit_error");
    let e = c.event("br-throttled-stream").await;
    assert_eq!(e["settlement"], "provider:upstream_error", "{e}");
    assert_eq!(e["error_code"], "rate_limit_error", "{e}");

    // Throttling: 429 in each style, and the deployment is ejected.
    let a = c.call("/v1/messages", "br-429", messages(false)).await;
    assert_eq!(a.status, 429);
    let v = a.json();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert_eq!(
        v["error"]["message"],
        "Too many requests, please wait before trying again."
    );
    // A quota refusal is answered 400 but named ServiceQuotaExceededException: a rate limit,
    // which ejects the deployment (the provider ejects after one failure). A validation error,
    // 400 too, is the request's: nothing is ejected.
    let a = c.call("/v1/messages", "br-quota", messages(false)).await;
    assert_eq!(a.status, 400, "{}", a.text());
    assert_eq!(a.json()["error"]["type"], "rate_limit_error");
    let a = c.call("/v1/messages", "br-invalid", messages(false)).await;
    assert_eq!(
        a.status,
        400,
        "a validation error is the request's: {}",
        a.text()
    );
    assert_eq!(a.json()["error"]["type"], "invalid_request_error");
    let log = c.gw.log();
    assert!(
        log.contains("deployment bedrock/replay:bedrock/error_400_quota#7 ejected"),
        "{log}"
    );
    assert!(!log.contains("error_400_validation#9 ejected"), "{log}");
    assert!(
        log.contains("deployment bedrock/replay:bedrock/error_429_throttling#6 ejected"),
        "{log}"
    );
}

#[tokio::test]
async fn bedrock_signatures_are_checked_by_the_mock() {
    let toml = model("br", "bedrock", "anthropic.claude-3-5-haiku-20241022-v1:0");
    // The gateway signs with a secret the mock does not know.
    let c = start(&toml, &[], "wJalrXUtnFEMI/K7MDENG/bPxRfiCYWRONGSECRET");
    let a = c.call("/v1/messages", "br", messages(false)).await;
    assert_eq!(a.status, 502, "{}", a.text());
    assert_eq!(a.json()["error"]["code"], "provider_auth_failed");
    let log = c.gw.log();
    assert!(
        log.contains("The request signature we calculated does not match"),
        "{log}"
    );
    assert!(
        !log.contains("WRONGSECRET"),
        "the secret is never logged: {log}"
    );
}

#[tokio::test]
async fn vertex_mints_and_reuses_tokens_and_speaks_anthropic() {
    let mut toml = String::new();
    for (id, provider, upstream) in [
        ("vx-stream", "vertex", "replay:vertex/stream@awkward#1"),
        ("vx-whole", "vertex", "replay:vertex/message#2"),
        ("vx-chat-stream", "vertex", "replay:vertex/stream@every-9#3"),
        ("vx-chat-whole", "vertex", "replay:vertex/message#4"),
        ("vx-429", "vertex", "replay:vertex/error_429#5"),
        ("vx-429-a", "vertex", "replay:vertex/error_429#6"),
        ("vx-400", "vertex", "replay:vertex/error_400#7"),
        ("vx-403", "vertex", "replay:vertex/error_403#8"),
        ("vx-synthetic", "vertex", "claude-sonnet-4@20250514"),
        ("vx-stranger", "vertex-stranger", "claude-sonnet-4@20250514"),
        ("vx-401", "vertex", "replay:vertex/error_401#11"),
        ("vx-after-401", "vertex", "replay:vertex/message#12"),
    ] {
        toml.push_str(&model(id, provider, upstream));
    }
    // Tokens live 4 s here: from 2 s on, a request refreshes in the background.
    let c = start(&toml, &["--gcp-token-seconds", "4"], AWS_SECRET);

    // Style B: Vertex's SSE passes through byte for byte, whole answers as they came.
    let a = c.call("/v1/messages", "vx-stream", messages(true)).await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.body, fixture_body("vertex/stream"), "{}", a.text());
    assert_eq!(c.usage("vx-stream").await, (2057, 14, 2048));
    let a = c.call("/v1/messages", "vx-whole", messages(false)).await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.body, fixture_body("vertex/message"));
    assert_eq!(c.usage("vx-whole").await, (31, 17, 0));
    // Style A across.
    let a = c
        .call("/v1/chat/completions", "vx-chat-stream", chat(true))
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let read = read_chat(&a.text());
    assert_eq!(read.content, "Grüß dich! Was führt dich her?");
    assert_eq!(
        read.usage.unwrap()["prompt_tokens_details"]["cached_tokens"],
        2048
    );
    assert_eq!(c.usage("vx-chat-stream").await, (2057, 14, 2048));
    let a = c
        .call("/v1/chat/completions", "vx-chat-whole", chat(false))
        .await;
    assert_eq!(a.status, 200);
    assert_eq!(
        a.json()["choices"][0]["message"]["content"],
        "Grüß dich! Wie kann ich dir heute helfen?"
    );
    assert_eq!(c.usage("vx-chat-whole").await, (31, 17, 0));

    // One token served all of them: minted once from an assertion the mock verified with the
    // account's public key, then reused.
    assert_eq!(c.stats().await["google_tokens_issued"], 1);
    let grants = c.received("/token").await;
    assert_eq!(grants.len(), 1);
    let form = grants[0]["body"].as_str().unwrap();
    assert!(
        form.starts_with(
            "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion="
        ),
        "{form}"
    );
    let sent = c
        .received(
            "/v1/projects/gateway-test/locations/us-east5/publishers/anthropic/models/replay%3Avertex%2Fmessage%232:rawPredict",
        )
        .await;
    assert_eq!(sent.len(), 1);
    let token = sent[0]["headers"]["authorization"].as_str().unwrap();
    assert!(token.starts_with("Bearer ya29.mock-"), "{token}");
    let body: Value = serde_json::from_str(sent[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["anthropic_version"], "vertex-2023-10-16");
    assert!(body.get("model").is_none(), "{body}");
    assert!(!c.gw.log().contains(token.trim_start_matches("Bearer ")));

    // Vertex refusing the token (revoked, expired early) drops it: the next request mints anew.
    let a = c.call("/v1/messages", "vx-401", messages(false)).await;
    assert_eq!(a.status, 502);
    assert_eq!(a.json()["error"]["code"], "provider_auth_failed");
    let a = c
        .call("/v1/messages", "vx-after-401", messages(false))
        .await;
    assert_eq!(a.status, 200);
    assert_eq!(c.stats().await["google_tokens_issued"], 2);

    // Past half the token's life a request still uses it and a refresh runs behind it; the
    // new token serves once the old one is gone.
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let r = post_in_style(
        &c.gw,
        "/v1/messages",
        &c.key,
        &json!({"model": "vx-synthetic", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(r.status(), 200);
    for _ in 0..100 {
        if c.stats().await["google_tokens_issued"] == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(c.stats().await["google_tokens_issued"], 3);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let r = post_in_style(
        &c.gw,
        "/v1/chat/completions",
        &c.key,
        &json!({"model": "vx-synthetic", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(r.status(), 200, "the refreshed token is accepted");
    let path = "/models/claude-sonnet-4@20250514:rawPredict";
    assert_eq!(c.received(path).await.len(), 2);
    assert!(
        c.gw.log().contains("check its credentials_file"),
        "{}",
        c.gw.log()
    );

    // Google's errors in each client's style: RESOURCE_EXHAUSTED is a rate limit.
    let a = c.call("/v1/messages", "vx-429", messages(false)).await;
    assert_eq!(a.status, 429);
    let v = a.json();
    assert_eq!(
        (v["type"].clone(), v["error"]["type"].clone()),
        (json!("error"), json!("rate_limit_error"))
    );
    let a = c
        .call("/v1/chat/completions", "vx-429-a", chat(false))
        .await;
    assert_eq!(a.status, 429);
    assert_eq!(a.json()["error"]["code"], "rate_limit_exceeded");
    // The model's own errors are Anthropic's already.
    let a = c.call("/v1/messages", "vx-400", messages(false)).await;
    assert_eq!(a.status, 400);
    assert_eq!(a.body, fixture_body("vertex/error_400"));
    // PERMISSION_DENIED is the operator's credential.
    let a = c.call("/v1/messages", "vx-403", messages(false)).await;
    assert_eq!(a.status, 502);
    assert_eq!(a.json()["error"]["code"], "provider_auth_failed");
    // A key the token endpoint does not know: no token, the operator's problem.
    let a = c.call("/v1/messages", "vx-stranger", messages(false)).await;
    assert_eq!(a.status, 502, "{}", a.text());
    assert_eq!(a.json()["error"]["code"], "provider_auth_failed");
    assert!(
        c.gw.log().contains("Invalid JWT Signature"),
        "{}",
        c.gw.log()
    );
}

#[tokio::test]
async fn gemini_is_translated_for_both_client_styles() {
    let mut toml = String::new();
    for (id, provider, upstream) in [
        ("gm-stream", "gemini", "replay:gemini/stream@awkward#1"),
        ("gm-whole", "gemini", "replay:gemini/generate#2"),
        (
            "gm-msg-tools",
            "gemini",
            "replay:gemini/stream_tools@every-11#3",
        ),
        ("gm-msg-whole", "gemini", "replay:gemini/generate#4"),
        ("gm-resp", "gemini", "replay:gemini/stream#5"),
        ("gm-tools", "gemini", "tools"),
        ("gm-429", "gemini", "replay:gemini/error_429#6"),
        ("gm-429-b", "gemini", "replay:gemini/error_429#7"),
        ("gm-key", "gemini", "replay:gemini/error_400_api_key#8"),
        ("gm-400", "gemini", "replay:gemini/error_400#9"),
        ("gm-cut", "gemini", "replay:gemini/stream_error@awkward#10"),
        ("gm-wrong-key", "gemini-wrong-key", "gemini-2.5-flash"),
    ] {
        toml.push_str(&model(id, provider, upstream));
    }
    let c = start(&toml, &[], AWS_SECRET);

    // Chat, streamed: thoughts as reasoning, text, the finish, Gemini's usage as chat usage
    // (thinking inside the completion, cached tokens inside the prompt), billed exactly.
    let a = c
        .call("/v1/chat/completions", "gm-stream", chat(true))
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let read = read_chat(&a.text());
    assert_eq!(
        read.content,
        "Grüß dich! Schön, dass du da bist. Wie kann ich helfen? ✨"
    );
    assert!(read.reasoning.starts_with("**Greeting the user**"));
    assert_eq!(read.finish.as_deref(), Some("stop"));
    assert_eq!(
        read.usage.unwrap(),
        json!({"prompt_tokens": 4120, "completion_tokens": 117, "total_tokens": 4237,
               "prompt_tokens_details": {"cached_tokens": 4096},
               "completion_tokens_details": {"reasoning_tokens": 96}})
    );
    assert_eq!(c.usage("gm-stream").await, (4120, 117, 4096));
    let a = c
        .call("/v1/chat/completions", "gm-whole", chat(false))
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let v = a.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "gm-whole");
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "Grüß dich! Wie kann ich dir heute helfen? 😊"
    );
    assert_eq!(c.usage("gm-whole").await, (1200, 352, 1024));

    // Style B: a signed function call streamed as a tool_use block, and a whole answer.
    let a = c.call("/v1/messages", "gm-msg-tools", messages(true)).await;
    assert_eq!(a.status, 200, "{}", a.text());
    let read = read_messages(&a.text());
    assert_eq!(read.text, "Ich sehe nach.");
    assert_eq!(read.tools.len(), 1);
    assert_eq!(read.tools[0].0, "get_weather");
    assert_eq!(
        serde_json::from_str::<Value>(&read.tools[0].1).unwrap(),
        json!({"city": "München"})
    );
    assert_eq!(read.stop.as_deref(), Some("tool_use"));
    assert_eq!(c.usage("gm-msg-tools").await, (88, 55, 0));
    let a = c
        .call("/v1/messages", "gm-msg-whole", messages(false))
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let v = a.json();
    assert_eq!(v["type"], "message");
    assert_eq!(
        v["content"][0]["text"],
        "Grüß dich! Wie kann ich dir heute helfen? 😊"
    );
    assert_eq!(v["usage"]["cache_read_input_tokens"], 1024);
    assert_eq!(c.usage("gm-msg-whole").await, (1200, 352, 1024));
    // Responses through chat.
    let a = c
        .call(
            "/v1/responses",
            "gm-resp",
            json!({"input": "Grüß dich", "stream": true}),
        )
        .await;
    assert_eq!(a.status, 200);
    assert!(a.text().contains("response.completed"), "{}", a.text());
    assert_eq!(c.usage("gm-resp").await, (4120, 117, 4096));

    // The requests as Gemini wants them: the model in the path, `alt=sse` written by the
    // gateway, the key as `x-goog-api-key`, the system prompt as `systemInstruction`.
    let sent = c
        .received("/v1beta/models/replay%3Agemini%2Fstream%40awkward%231:streamGenerateContent")
        .await;
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["query"], "alt=sse");
    assert_eq!(sent[0]["headers"]["x-goog-api-key"], GEMINI_KEY);
    assert!(sent[0]["headers"].get("authorization").is_none());
    let body: Value = serde_json::from_str(sent[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(
        body,
        json!({"contents": [{"role": "user", "parts": [{"text": "Grüß dich"}]}],
               "systemInstruction": {"parts": [{"text": "Antworte auf Deutsch."}]}})
    );
    let whole = c
        .received("replay%3Agemini%2Fgenerate%232:generateContent")
        .await;
    assert_eq!(whole[0]["query"], Value::Null);

    // A tool loop: the call's signature goes back with it, the result answers it by name.
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let first = c
        .call(
            "/v1/chat/completions",
            "gm-tools",
            json!({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": tools}),
        )
        .await;
    assert_eq!(first.status, 200, "{}", first.text());
    let message = first.json()["choices"][0]["message"].clone();
    assert_eq!(first.json()["choices"][0]["finish_reason"], "tool_calls");
    let call_id = message["tool_calls"][0]["id"].as_str().unwrap().to_string();
    let second = c
        .call(
            "/v1/chat/completions",
            "gm-tools",
            json!({"messages": [{"role": "user", "content": "Weather in Paris?"}, message,
                                {"role": "tool", "tool_call_id": call_id, "content": "21 °C"}],
                   "tools": tools}),
        )
        .await;
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(
        second.json()["choices"][0]["message"]["content"],
        "Hello from the mock provider."
    );
    let loops = c.received("/v1beta/models/tools:generateContent").await;
    let body: Value = serde_json::from_str(loops[1]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["contents"][1]["role"], "model");
    assert_eq!(
        body["contents"][1]["parts"][1],
        json!({"functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
               "thoughtSignature": "bW9jay1zaWduYXR1cmU="})
    );
    assert_eq!(
        body["contents"][2]["parts"][0],
        json!({"functionResponse": {"name": "get_weather", "response": {"content": "21 °C"}}})
    );

    // Errors: RESOURCE_EXHAUSTED in each style; a key Gemini refuses (400 API_KEY_INVALID, and
    // the mock's own check of a wrong key) is the operator's; other 400s are the request's.
    let a = c.call("/v1/chat/completions", "gm-429", chat(false)).await;
    assert_eq!(a.status, 429);
    assert_eq!(a.json()["error"]["code"], "rate_limit_exceeded");
    let a = c.call("/v1/messages", "gm-429-b", messages(false)).await;
    assert_eq!(a.status, 429);
    assert_eq!(a.json()["error"]["type"], "rate_limit_error");
    for id in ["gm-key", "gm-wrong-key"] {
        let a = c.call("/v1/chat/completions", id, chat(false)).await;
        assert_eq!(
            status_and_code_of(&a),
            (502, "provider_auth_failed".into()),
            "{id}: {}",
            a.text()
        );
    }
    let a = c.call("/v1/chat/completions", "gm-400", chat(false)).await;
    assert_eq!(a.status, 400);
    assert_eq!(a.json()["error"]["type"], "invalid_request_error");
    // An error event mid-stream reaches the chat client as an error chunk.
    let a = c.call("/v1/chat/completions", "gm-cut", chat(true)).await;
    assert_eq!(a.status, 200);
    let read = read_chat(&a.text());
    assert_eq!(read.content, "Grüß");
    assert_eq!(read.error.unwrap()["code"], "overloaded");
}

fn status_and_code_of(a: &Answer) -> (u16, String) {
    (
        a.status,
        a.json()["error"]["code"].as_str().unwrap_or("").to_string(),
    )
}
