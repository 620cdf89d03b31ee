//! The client libraries people build on, driven against the gateway: the Vercel AI SDK
//! (`tests/clients/vercel.mjs`), LangChain, the OpenAI Agents SDK and LiteLLM as a library
//! (`tests/clients/*_client.py`), each against an Anthropic-style model, an OpenAI-style model
//! and a chat-only OpenAI-style model (`endpoints = ["chat"]`), all behind the mock provider.
//!
//! Each library runs as one child process that answers one case per line (see
//! `tests/clients/caseloop.py`); after each case the test checks the client's result (the mock's
//! text, streamed text equal to the whole text, the mock's usage) and what the mock received
//! (the route the gateway chose, the conversation carried, the tool's result on the next
//! request). Versions are pinned in `tests/clients/package-lock.json` and
//! `tests/clients/requirements.txt`; `scripts/setup` installs them. Without them the test
//! fails under `scripts/test` and CI, and is skipped with a message elsewhere.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// Model options added to every model of the suite: clients' large default output budgets
/// (`@ai-sdk/anthropic` and LiteLLM send `max_tokens: 128000` for ids they do not know) are
/// clamped to the model's limit, as an operator serving such clients configures it.
const CLAMP: &str = "clamp_output_tokens = true";

const ANSWER: &str = "Hello from the mock provider.";
/// What the mock streams with `--chunks 3`.
const STREAMED: &str = "tok0 tok1 tok2 ";
/// What the clients' `get_weather` tool returns for the mock's call.
const TOOL_RESULT: &str = "sunny, 21 C in Paris";
const CASE_TIMEOUT: Duration = Duration::from_secs(90);

/// The kinds of gateway model every client meets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Anthropic,
    OpenAi,
    ChatOnly,
}

const KINDS: [Kind; 3] = [Kind::Anthropic, Kind::OpenAi, Kind::ChatOnly];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Anthropic => "anthropic",
            Kind::OpenAi => "openai",
            Kind::ChatOnly => "chat-only",
        }
    }

    /// The gateway model: the `tools` ones make the mock call `get_weather` until it sees the
    /// tool's result.
    fn model(self, tools: bool) -> &'static str {
        match (self, tools) {
            (Kind::Anthropic, false) => "claude-compat",
            (Kind::Anthropic, true) => "claude-compat-tools",
            (Kind::OpenAi, false) => "gpt-compat",
            (Kind::OpenAi, true) => "gpt-compat-tools",
            (Kind::ChatOnly, false) => "gpt-chat-only",
            (Kind::ChatOnly, true) => "gpt-chat-only-tools",
        }
    }

    /// Input tokens a client should report for one mock answer: Anthropic-style providers count
    /// the 5 cache reads beside their 25, OpenAI-style ones inside.
    fn input_tokens(self) -> u64 {
        match self {
            Kind::Anthropic => 30,
            Kind::OpenAi | Kind::ChatOnly => 25,
        }
    }

    /// The provider path the gateway should use for a client speaking `protocol`.
    fn upstream_path(self, protocol: Protocol) -> &'static str {
        match (self, protocol) {
            (Kind::Anthropic, _) => "/v1/messages",
            (Kind::OpenAi, Protocol::Responses) => "/v1/responses",
            _ => "/v1/chat/completions",
        }
    }
}

/// The API a client speaks to the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    Chat,
    Responses,
    Messages,
}

/// What a case does, and so what its result must show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// One whole answer.
    Whole,
    /// One streamed answer.
    Stream,
    /// Two turns, the second carrying the first.
    TwoTurns,
    /// A tool call, the tool's result sent back, then the answer.
    ToolLoop,
}

/// One client library: how to start it and what it is asked.
struct Library {
    name: &'static str,
    runtime: Runtime,
    script: &'static str,
    /// (client name in the script, the protocol it speaks)
    clients: &'static [(&'static str, Protocol)],
    /// (op name in the script, what it does)
    ops: &'static [(&'static str, Op)],
}

#[derive(Clone, Copy)]
enum Runtime {
    Node,
    Python,
}

const VERCEL: Library = Library {
    name: "vercel",
    runtime: Runtime::Node,
    script: "vercel.mjs",
    clients: &[
        ("responses", Protocol::Responses),
        ("chat", Protocol::Chat),
        ("anthropic", Protocol::Messages),
    ],
    ops: &[
        ("generate", Op::Whole),
        ("stream", Op::Stream),
        ("chat2", Op::TwoTurns),
        ("tools", Op::ToolLoop),
    ],
};

const LANGCHAIN: Library = Library {
    name: "langchain",
    runtime: Runtime::Python,
    script: "langchain_client.py",
    clients: &[
        ("chat", Protocol::Chat),
        ("responses", Protocol::Responses),
        ("anthropic", Protocol::Messages),
    ],
    ops: &[
        ("invoke", Op::Whole),
        ("stream", Op::Stream),
        ("tools", Op::ToolLoop),
    ],
};

const AGENTS: Library = Library {
    name: "agents",
    runtime: Runtime::Python,
    script: "agents_client.py",
    clients: &[("chat", Protocol::Chat), ("responses", Protocol::Responses)],
    ops: &[("run", Op::ToolLoop)],
};

const LITELLM: Library = Library {
    name: "litellm",
    runtime: Runtime::Python,
    script: "litellm_client.py",
    clients: &[
        ("openai", Protocol::Chat),
        ("anthropic", Protocol::Messages),
    ],
    ops: &[("complete", Op::Whole), ("stream", Op::Stream)],
};

#[tokio::test]
async fn vercel_ai_sdk() {
    run_library(&VERCEL).await;
}

#[tokio::test]
async fn langchain() {
    run_library(&LANGCHAIN).await;
}

#[tokio::test]
async fn openai_agents_sdk() {
    run_library(&AGENTS).await;
}

#[tokio::test]
async fn litellm_as_a_library() {
    run_library(&LITELLM).await;
}

/// The versions the manual lists are the ones pinned: every library of `package.json` and
/// the clients of `requirements.txt` appear with their version in the manual's table.
#[test]
fn documented_versions_are_the_pinned_ones() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &str| std::fs::read_to_string(root.join(path)).expect(path);
    let docs = read("docs/developer-api.md");
    let section = docs
        .split("\n## Client libraries\n")
        .nth(1)
        .expect("a Client libraries section in docs/developer-api.md");
    let package: Value = serde_json::from_str(&read("tests/clients/package.json")).unwrap();
    let mut pinned: Vec<(String, String)> = package["dependencies"]
        .as_object()
        .expect("dependencies")
        .iter()
        .filter(|(name, _)| name.as_str() != "zod")
        .map(|(name, version)| (name.clone(), version.as_str().unwrap_or("").to_string()))
        .collect();
    let clients = [
        "openai",
        "anthropic",
        "langchain-openai",
        "langchain-anthropic",
        "langchain-core",
        "openai-agents",
        "litellm",
    ];
    for line in read("tests/clients/requirements.txt").lines() {
        if let Some((name, version)) = line.split_once("==") {
            if clients.contains(&name) {
                pinned.push((name.to_string(), version.to_string()));
            }
        }
    }
    assert_eq!(pinned.len(), 3 + clients.len(), "{pinned:?}");
    for (name, version) in pinned {
        let row = section
            .lines()
            .find(|l| l.contains(&format!("`{name}`")))
            .unwrap_or_else(|| panic!("{name} is not in the manual's table"));
        assert!(
            row.contains(&version),
            "the manual lists {name} without its pinned version {version}: {row}"
        );
    }
}

/// One case of a library's matrix.
struct Case {
    id: String,
    client: &'static str,
    protocol: Protocol,
    op_name: &'static str,
    op: Op,
    kind: Kind,
}

impl Case {
    fn model(&self) -> &'static str {
        self.kind.model(self.op == Op::ToolLoop)
    }
}

fn cases(library: &Library) -> Vec<Case> {
    let mut out = Vec::new();
    for &(client, protocol) in library.clients {
        for &(op_name, op) in library.ops {
            for kind in KINDS {
                out.push(Case {
                    id: format!("{}/{client}/{op_name}/{}", library.name, kind.name()),
                    client,
                    protocol,
                    op_name,
                    op,
                    kind,
                });
            }
        }
    }
    out
}

/// The suite's models: per kind, one that answers with text and one that calls tools, each
/// with an output limit as a real model has.
fn gateway_toml(mock: &Mock) -> String {
    let mut toml = format!(
        r#"
[[providers]]
name = "mock-chat-only"
style = "openai"
base_url = "{}"
api_key_env = "MOCK_OPENAI_KEY"
endpoints = ["chat"]
"#,
        mock.url()
    );
    for kind in KINDS {
        let (provider, limit) = match kind {
            Kind::Anthropic => ("mock-anthropic", 8192),
            Kind::OpenAi => ("mock", 16384),
            Kind::ChatOnly => ("mock-chat-only", 16384),
        };
        for tools in [false, true] {
            let upstream = if tools {
                "upstream_model = \"tools\"\n"
            } else {
                ""
            };
            toml.push_str(&format!(
                "\n[[models]]\nid = \"{}\"\nprovider = \"{provider}\"\n{upstream}\
                 context_window = 128000\nmax_output_tokens = {limit}\ndefault_output_tokens = 256\n{CLAMP}\n",
                kind.model(tools)
            ));
        }
    }
    // Room for every case: no per-minute caps, a large weekly allowance.
    toml.push_str(&config::uncapped_tier("beginner", 1_000_000_000, 1_000_000));
    toml
}

/// Runs every case of `library` against a fresh mock and gateway and fails on any outcome that
/// is not the expected one.
async fn run_library(library: &Library) {
    let Some(command) = prerequisites(library) else {
        return;
    };
    let mock = Mock::start(&["--chunks", "3"]);
    let gw = Gateway::start(&mock, Options::with_toml(gateway_toml(&mock)));
    let key = gw.user_with_key(&format!("{}@example.com", library.name), &[]);
    let stderr_path = gw.dir.path().join(format!("{}.stderr", library.name));
    let mut client = ClientProcess::start(&command, &gw.api, &key, &stderr_path);

    let mut outcomes = Vec::new();
    for case in cases(library) {
        mock.clear().await;
        let outcome = match client.ask(&case).await {
            Ok(answer) => check(&case, &answer, &mock.requests().await),
            Err(e) => Err(format!("{e}; client stderr:\n{}", tail(&stderr_path))),
        };
        outcomes.push((case.id, outcome));
    }
    client.finish().await;

    let mut report = String::new();
    let mut wrong = Vec::new();
    for (id, outcome) in &outcomes {
        let line = match outcome {
            Ok(()) => format!("pass {id}"),
            Err(e) => {
                wrong.push(id.clone());
                format!("FAIL {id}: {e}")
            }
        };
        report.push_str(&line);
        report.push('\n');
    }
    eprintln!("{} cases:\n{report}", library.name);
    assert!(
        wrong.is_empty(),
        "{} of {} {} cases failed: {wrong:?}\n{report}",
        wrong.len(),
        outcomes.len(),
        library.name
    );
}

/// The command that runs the library's script, or `None` after saying why the test is skipped.
/// Under `scripts/test` (`GATEWAY_TEST_REQUIRE_CLIENTS`) and in CI (`CI`) a missing runtime or
/// package fails the test instead.
fn prerequisites(library: &Library) -> Option<Vec<String>> {
    let dir = clients_dir();
    let script = dir.join(library.script).display().to_string();
    let missing = match library.runtime {
        Runtime::Node => {
            let node_ok = std::process::Command::new("node")
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success());
            if !node_ok {
                Some("node is not installed".to_string())
            } else if !dir.join("node_modules/ai/package.json").exists()
                || !dir
                    .join("node_modules/@ai-sdk/anthropic/package.json")
                    .exists()
            {
                Some("tests/clients/node_modules is missing (npm ci --prefix tests/clients)".into())
            } else {
                None
            }
        }
        Runtime::Python => {
            let python = python_path();
            let modules = "import langchain_openai, langchain_anthropic, agents, litellm";
            let ok = std::process::Command::new(&python)
                .args(["-c", modules])
                .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
                .output()
                .is_ok_and(|o| o.status.success());
            (!ok).then(|| {
                format!("{python} cannot import the clients (pip install -r tests/clients/requirements.txt)")
            })
        }
    };
    if let Some(why) = missing {
        let required = std::env::var_os("CI").is_some()
            || std::env::var_os("GATEWAY_TEST_REQUIRE_CLIENTS").is_some();
        assert!(
            !required,
            "{}: {why}; scripts/setup installs it",
            library.name
        );
        eprintln!("SKIPPED {}: {why}; run scripts/setup", library.name);
        return None;
    }
    Some(match library.runtime {
        Runtime::Node => vec!["node".into(), script],
        Runtime::Python => vec![python_path(), script],
    })
}

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

/// `GATEWAY_TEST_PYTHON` (set by `scripts/test`), else the repository's `.venv`.
fn python_path() -> String {
    std::env::var("GATEWAY_TEST_PYTHON")
        .unwrap_or_else(|_| format!("{}/.venv/bin/python", env!("CARGO_MANIFEST_DIR")))
}

/// A library's script, answering cases on its stdout.
struct ClientProcess {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl ClientProcess {
    fn start(command: &[String], base_url: &str, key: &str, stderr: &Path) -> ClientProcess {
        let mut child = tokio::process::Command::new(&command[0])
            .args(&command[1..])
            .current_dir(clients_dir())
            .env("GATEWAY_BASE_URL", base_url)
            .env("GATEWAY_API_KEY", key)
            // Nothing may reach real providers: the clients' own keys and URLs are unset.
            .env_remove("OPENAI_API_KEY")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("ANTHROPIC_BASE_URL")
            .env_remove("LANGSMITH_TRACING")
            .env_remove("LANGCHAIN_TRACING_V2")
            .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(stderr).expect("client stderr file"))
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start {command:?}: {e}"));
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        ClientProcess {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// Sends the case and waits for its answer; lines that are not answers are skipped.
    async fn ask(&mut self, case: &Case) -> Result<Value, String> {
        let request = json!({
            "id": case.id, "client": case.client, "op": case.op_name, "model": case.model()
        });
        let line = format!("{request}\n");
        self.stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|e| format!("client process gone: {e}"))?;
        self.stdin.flush().await.map_err(|e| e.to_string())?;
        let wait = async {
            loop {
                match self.lines.next_line().await {
                    Ok(Some(line)) => {
                        let Ok(answer) = serde_json::from_str::<Value>(&line) else {
                            continue;
                        };
                        if answer["id"] == case.id.as_str() {
                            return Ok(answer);
                        }
                    }
                    Ok(None) => return Err("client process exited".to_string()),
                    Err(e) => return Err(format!("reading the client: {e}")),
                }
            }
        };
        match tokio::time::timeout(CASE_TIMEOUT, wait).await {
            Ok(answer) => answer,
            Err(_) => Err(format!("no answer in {CASE_TIMEOUT:?}")),
        }
    }

    /// Closes stdin (the script ends its loop) and waits for the process.
    async fn finish(mut self) {
        drop(self.stdin);
        if tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Checks a client's answer and what the mock received for it.
fn check(case: &Case, answer: &Value, seen: &[Value]) -> Result<(), String> {
    if answer["ok"] != true {
        return Err(format!(
            "client error: {}",
            answer["error"].as_str().unwrap_or("?")
        ));
    }
    let r = &answer["result"];
    let want_path = case.kind.upstream_path(case.protocol);
    let requests: Vec<(&str, Value)> = seen
        .iter()
        .map(|s| {
            let body = s["body"].as_str().unwrap_or("null");
            (
                s["path"].as_str().unwrap_or(""),
                serde_json::from_str(body).unwrap_or(Value::Null),
            )
        })
        .collect();
    let expect = |ok: bool, what: String| if ok { Ok(()) } else { Err(what) };
    let steps = match case.op {
        Op::Whole | Op::Stream => 1,
        Op::TwoTurns | Op::ToolLoop => 2,
    };
    expect(
        requests.len() == steps && requests.iter().all(|(p, _)| *p == want_path),
        format!(
            "the mock should have served {steps} request(s) on {want_path}, it saw {:?}",
            requests.iter().map(|(p, _)| *p).collect::<Vec<_>>()
        ),
    )?;
    // Usage is the mock's: per answer 25 (OpenAI-style) or 25 + 5 (Anthropic-style) input
    // tokens, 5 of them cache reads, and 24 output tokens; a tool loop sums two answers.
    let answers = if case.op == Op::ToolLoop { 2 } else { 1 };
    let usage = json!({
        "input": case.kind.input_tokens() * answers,
        "output": 24 * answers,
        "cached": 5 * answers,
    });
    expect(
        r["usage"] == usage,
        format!("usage {} (want {usage})", r["usage"]),
    )?;
    match case.op {
        Op::Whole => expect(r["text"] == ANSWER, format!("text {}", r["text"])),
        Op::Stream => {
            expect(
                r["text"] == STREAMED && r["final_text"] == STREAMED,
                format!(
                    "streamed text {} and whole text {} (want {STREAMED:?})",
                    r["text"], r["final_text"]
                ),
            )?;
            expect(
                requests[0].1["stream"] == true,
                "the provider was not asked to stream".into(),
            )
        }
        Op::TwoTurns => {
            expect(
                r["texts"] == json!([ANSWER, ANSWER]),
                format!("texts {}", r["texts"]),
            )?;
            carries_first_turn(want_path, &requests[1].1)
        }
        Op::ToolLoop => {
            expect(
                r["text"] == ANSWER,
                format!("final text {} (want {ANSWER:?})", r["text"]),
            )?;
            expect(
                r["tool_calls"] == json!([{"name": "get_weather", "args": {"city": "Paris"}}]),
                format!("tool calls {}", r["tool_calls"]),
            )?;
            expect(
                r["tool_results"] == json!([TOOL_RESULT]),
                format!("tool results {}", r["tool_results"]),
            )?;
            expect(
                requests[0].1.to_string().contains("get_weather"),
                "the first request offers no get_weather tool".into(),
            )?;
            tool_result_round_trip(want_path, &requests[1].1)
        }
    }
}

/// The second turn carries the first question, its answer and then the new question. On the
/// Responses API itself the answer may be an `item_reference` (the provider stores its items).
fn carries_first_turn(path: &str, body: &Value) -> Result<(), String> {
    let text = body.to_string();
    let at = |needle: &str| text.find(needle);
    let answer = at(ANSWER).or_else(|| {
        (path == "/v1/responses")
            .then(|| at("\"item_reference\""))
            .flatten()
    });
    match (at("Hello, who are you?"), answer, at("Tell me more.")) {
        (Some(a), Some(b), Some(c)) if a < b && b < c => Ok(()),
        _ => Err(format!("the second turn does not carry the first: {body}")),
    }
}

/// The tool's result reached the mock on the next request, after the call it answers, in the
/// shape of the provider's API and with the id the mock gave the call.
fn tool_result_round_trip(path: &str, body: &Value) -> Result<(), String> {
    let content_has = |v: &Value| v.to_string().contains(TOOL_RESULT);
    let ok = match path {
        "/v1/chat/completions" => {
            let msgs = body["messages"].as_array().cloned().unwrap_or_default();
            let last = msgs.last().cloned().unwrap_or(Value::Null);
            let call = msgs
                .iter()
                .any(|m| m["role"] == "assistant" && m["tool_calls"][0]["id"] == "call_mock");
            call && last["role"] == "tool"
                && last["tool_call_id"] == "call_mock"
                && content_has(&last["content"])
        }
        "/v1/messages" => {
            let msgs = body["messages"].as_array().cloned().unwrap_or_default();
            let last = msgs.last().cloned().unwrap_or(Value::Null);
            let block = last["content"]
                .as_array()
                .and_then(|b| b.last())
                .cloned()
                .unwrap_or(Value::Null);
            let call = msgs.iter().any(|m| {
                m["role"] == "assistant"
                    && m["content"].as_array().is_some_and(|blocks| {
                        blocks
                            .iter()
                            .any(|b| b["type"] == "tool_use" && b["id"] == "toolu_mock")
                    })
            });
            call && last["role"] == "user"
                && block["type"] == "tool_result"
                && block["tool_use_id"] == "toolu_mock"
                && content_has(&block["content"])
        }
        _ => {
            let items = body["input"].as_array().cloned().unwrap_or_default();
            let last = items.last().cloned().unwrap_or(Value::Null);
            let call = items.iter().any(|i| {
                (i["type"] == "function_call" && i["call_id"] == "call_mock")
                    || (i["type"] == "item_reference"
                        && i["id"].as_str().is_some_and(|id| id.starts_with("fc_mock")))
            });
            call && last["type"] == "function_call_output"
                && last["call_id"] == "call_mock"
                && content_has(&last["output"])
        }
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "the tool's result did not come back after its call: {body}"
        ))
    }
}
