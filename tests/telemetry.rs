//! OpenTelemetry traces through the real server, received by a real OTLP receiver (HTTP, and
//! gRPC) that decodes the wire format with the official protobuf definitions: the span tree of a plain, a
//! streamed, a translated, a failed-over and a refused request, a client's `traceparent`
//! carried to the provider, a site request's span, live reload of the sample ratio, and an
//! unreachable collector that slows and fails nothing (its spans counted as dropped).

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use serde_json::{json, Value};

/// One received span, flattened.
#[derive(Debug, Clone)]
struct Rec {
    trace_id: String,
    span_id: String,
    parent: String,
    name: String,
    kind: i32,
    attrs: BTreeMap<String, String>,
    events: Vec<String>,
    /// 2: error (the OTLP status code).
    status: i32,
    service: String,
}

impl Rec {
    fn attr(&self, k: &str) -> Option<&str> {
        self.attrs.get(k).map(String::as_str)
    }
}

/// An OTLP receiver on a loopback port: over HTTP, `POST /v1/traces` with a protobuf body; or
/// the OTLP/gRPC trace service.
struct Receiver {
    url: String,
    spans: Arc<Mutex<Vec<Rec>>>,
    /// One line per export request received: over HTTP its content type and `x-tenant` header
    /// (after `refused` when it was answered 503), over gRPC its `x-tenant` metadata.
    per_export: Arc<Mutex<Vec<String>>>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn any_text(v: &Option<Any>) -> String {
    match v {
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::IntValue(i)) => i.to_string(),
        Some(Any::BoolValue(b)) => b.to_string(),
        Some(Any::DoubleValue(d)) => d.to_string(),
        Some(Any::ArrayValue(a)) => a
            .values
            .iter()
            .map(|v| any_text(&v.value))
            .collect::<Vec<_>>()
            .join(","),
        other => format!("{other:?}"),
    }
}

/// The spans of one export request, flattened into `out`.
fn record(req: ExportTraceServiceRequest, out: &Mutex<Vec<Rec>>) {
    let mut out = out.lock().unwrap();
    for rs in req.resource_spans {
        let service = rs
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .map(|kv| any_text(&kv.value.as_ref().and_then(|v| v.value.clone())))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for sp in ss.spans {
                out.push(Rec {
                    trace_id: hex(&sp.trace_id),
                    span_id: hex(&sp.span_id),
                    parent: hex(&sp.parent_span_id),
                    name: sp.name.clone(),
                    kind: sp.kind,
                    attrs: sp
                        .attributes
                        .iter()
                        .map(|kv| {
                            let value = kv.value.as_ref().and_then(|v| v.value.clone());
                            (kv.key.clone(), any_text(&value))
                        })
                        .collect(),
                    events: sp.events.iter().map(|e| e.name.clone()).collect(),
                    status: sp.status.map(|s| s.code).unwrap_or(0),
                    service: service.clone(),
                });
            }
        }
    }
}

/// The OTLP/gRPC trace service: records what it receives, and each call's `x-tenant` metadata.
struct GrpcSink {
    spans: Arc<Mutex<Vec<Rec>>>,
    tenants: Arc<Mutex<Vec<String>>>,
}

#[tonic::async_trait]
impl TraceService for GrpcSink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let tenant = request
            .metadata()
            .get("x-tenant")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        self.tenants.lock().unwrap().push(tenant);
        record(request.into_inner(), &self.spans);
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Receiver {
    /// An OTLP/gRPC receiver (tonic, HTTP/2 without TLS).
    async fn start_grpc() -> Receiver {
        let spans: Arc<Mutex<Vec<Rec>>> = Arc::default();
        let tenants: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = GrpcSink {
            spans: spans.clone(),
            tenants: tenants.clone(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            let incoming = Box::pin(futures::stream::unfold(listener, |l| async move {
                let next = l.accept().await.map(|(socket, _)| socket);
                Some((next, l))
            }));
            let _ = tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(sink))
                .serve_with_incoming(incoming)
                .await;
        });
        Receiver {
            url,
            spans,
            per_export: tenants,
        }
    }

    async fn start() -> Receiver {
        Self::start_refusing(0, None).await
    }

    /// An OTLP/HTTP receiver that answers its first `busy` export requests with 503 (taking
    /// nothing from them), as a collector under load does, with `retry_after` when given.
    async fn start_refusing(busy: usize, retry_after: Option<&'static str>) -> Receiver {
        let spans: Arc<Mutex<Vec<Rec>>> = Arc::default();
        let per_export: Arc<Mutex<Vec<String>>> = Arc::default();
        let busy = Arc::new(std::sync::atomic::AtomicUsize::new(busy));
        let (s, c) = (spans.clone(), per_export.clone());
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let (s, c, busy) = (s.clone(), c.clone(), busy.clone());
                    async move {
                        let header = |name: &str| {
                            headers
                                .get(name)
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                                .to_string()
                        };
                        let refused = busy
                            .fetch_update(
                                std::sync::atomic::Ordering::AcqRel,
                                std::sync::atomic::Ordering::Acquire,
                                |n| n.checked_sub(1),
                            )
                            .is_ok();
                        let line = format!("{} {}", header("content-type"), header("x-tenant"));
                        c.lock().unwrap().push(if refused {
                            format!("refused {line}")
                        } else {
                            line
                        });
                        if refused {
                            let mut h = axum::http::HeaderMap::new();
                            if let Some(after) = retry_after {
                                h.insert("retry-after", after.parse().unwrap());
                            }
                            return (axum::http::StatusCode::SERVICE_UNAVAILABLE, h);
                        }
                        let req = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                        record(req, &s);
                        let mut h = axum::http::HeaderMap::new();
                        h.insert("content-type", "application/x-protobuf".parse().unwrap());
                        (axum::http::StatusCode::OK, h)
                    }
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver {
            url,
            spans,
            per_export,
        }
    }

    /// The spans of trace `trace_id` once `n` of them have arrived (fails after 15 s).
    async fn trace(&self, trace_id: &str, n: usize) -> Vec<Rec> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let got: Vec<Rec> = self
                .spans
                .lock()
                .unwrap()
                .iter()
                .filter(|s| s.trace_id == trace_id)
                .cloned()
                .collect();
            if got.len() >= n {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "trace {trace_id}: {} of {n} spans arrived: {got:#?}",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn all(&self) -> Vec<Rec> {
        self.spans.lock().unwrap().clone()
    }
}

const EXTRA: &str = r#"
[[providers]]
name = "mock-b"
style = "openai"
base_url = "MOCK_URL"
api_key_env = "MOCK_OPENAI_KEY"
cooldown_seconds = 1

[[models]]
id = "pair"
deployments = [
  { provider = "mock", upstream_model = "mock-gpt", weight = 1 },
  { provider = "mock-b", upstream_model = "mock-gpt", weight = 1 },
]
"#;

fn telemetry_toml(endpoint: &str, ratio: f64) -> String {
    format!(
        "\n[telemetry]\notlp_endpoint = \"{endpoint}\"\nsample_ratio = {ratio}\n\
         service_name = \"gateway-under-test\"\ncapture_sizes = true\n"
    )
}

fn start(mock: &Mock, endpoint: &str, ratio: f64) -> Gateway {
    let extra = format!(
        "{}{}",
        EXTRA.replace("MOCK_URL", &mock.url()),
        telemetry_toml(endpoint, ratio)
    );
    Gateway::start(
        mock,
        Options {
            extra_toml: extra,
            admin: true,
            redis_url: std::env::var("GATEWAY_TEST_REDIS").ok(),
            ..Options::default()
        },
    )
}

/// A gateway on `extra_toml`, with the collector's headers (`x-tenant: team a`) in the
/// environment variable the config names.
fn start_with_collector_headers(mock: &Mock, extra_toml: String) -> Gateway {
    Gateway::start(
        mock,
        Options {
            extra_toml,
            admin: true,
            redis_url: std::env::var("GATEWAY_TEST_REDIS").ok(),
            env: vec![("GATEWAY_OTLP_HEADERS".into(), "x-tenant=team%20a".into())],
            ..Options::default()
        },
    )
}

fn chat(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream,
           "messages": [{"role": "user", "content": "the secret prompt"}]})
}

/// Sends one request (whole answer read); returns status, the `x-request-id` and the body.
async fn send(
    gw: &Gateway,
    path: &str,
    key: &str,
    body: &Value,
    extra: &[(&str, &str)],
) -> (u16, String, String) {
    let mut r = client().post(gw.url(path)).bearer_auth(key).json(body);
    for (k, v) in extra {
        r = r.header(*k, *v);
    }
    let r = r.send().await.expect("request");
    let status = r.status().as_u16();
    let id = r
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    (status, id, r.text().await.expect("body"))
}

/// Sends one plain (non-streamed) chat request, which must succeed; returns its trace id.
async fn plain_chat(gw: &Gateway, key: &str) -> String {
    let id = answered_chat(gw, key).await;
    logged_trace_id(gw, &id).await
}

/// Sends a plain chat completion that must be answered (200); its request id.
async fn answered_chat(gw: &Gateway, key: &str) -> String {
    let (status, id, _) = send(
        gw,
        "/v1/chat/completions",
        key,
        &chat("mock-gpt", false),
        &[],
    )
    .await;
    assert_eq!(status, 200);
    id
}

/// The trace id the access line of `request_id` carries.
async fn logged_trace_id(gw: &Gateway, request_id: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let line = gw
            .log()
            .lines()
            .filter(|l| l.contains("\"kind\":\"access\""))
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["request_id"] == request_id);
        if let Some(v) = line {
            return v["trace_id"]
                .as_str()
                .expect("trace_id in access line")
                .to_string();
        }
        assert!(Instant::now() < deadline, "no access line for {request_id}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn one<'a>(spans: &'a [Rec], name: &str) -> &'a Rec {
    let found: Vec<&Rec> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "one {name:?} span in {spans:#?}");
    found[0]
}

fn server(spans: &[Rec]) -> &Rec {
    let found: Vec<&Rec> = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Server as i32)
        .collect();
    assert_eq!(found.len(), 1, "one server span in {spans:#?}");
    found[0]
}

fn clients(spans: &[Rec]) -> Vec<&Rec> {
    spans
        .iter()
        .filter(|s| s.kind == SpanKind::Client as i32)
        .collect()
}

/// The phases hang under the server span; no attribute holds the key or the prompt.
fn check_tree(spans: &[Rec], key: &str) {
    let root = server(spans);
    for s in spans {
        if s.span_id != root.span_id {
            assert_eq!(
                s.parent, root.span_id,
                "{} is a child of the server span",
                s.name
            );
        }
        for v in s.attrs.values() {
            assert!(!v.contains(key), "a key in {}: {v}", s.name);
            assert!(
                !v.contains("secret prompt"),
                "the prompt in {}: {v}",
                s.name
            );
        }
        assert_eq!(s.service, "gateway-under-test");
    }
    // Admission is one span, the reservation an event on it; settlement an event on the root.
    let admission = one(spans, "gateway.admission");
    assert!(
        admission
            .events
            .contains(&"gateway.quota.reserve".to_string()),
        "{admission:#?}"
    );
    assert!(
        root.events.contains(&"gateway.settle".to_string()),
        "{root:#?}"
    );
}

/// The mock's recorded `traceparent` of its `n`-th model request (0-based).
async fn provider_traceparent(mock: &Mock, n: usize) -> (String, String) {
    let reqs = mock.requests().await;
    let r = &reqs[n];
    let tp = r["headers"]["traceparent"]
        .as_str()
        .unwrap_or_else(|| panic!("no traceparent at the provider: {r}"))
        .to_string();
    let parts: Vec<&str> = tp.split('-').collect();
    assert_eq!(parts.len(), 4, "{tp}");
    (parts[1].to_string(), parts[2].to_string())
}

#[tokio::test]
async fn plain_streamed_and_translated_requests_have_their_span_trees() {
    let rx = Receiver::start().await;
    let mock = Mock::start(&[]);
    let gw = start(&mock, &rx.url, 1.0);
    let (user, key) = gw.user_and_key("spans@example.com");

    // Plain.
    let id = answered_chat(&gw, &key).await;
    let trace_id = logged_trace_id(&gw, &id).await;
    assert_eq!(trace_id.len(), 32);
    let spans = rx.trace(&trace_id, 3).await;
    check_tree(&spans, &key);
    let root = server(&spans);
    assert_eq!(root.name, "chat mock-gpt");
    assert_eq!(
        root.parent, "",
        "no client trace: the server span is the root"
    );
    for (k, v) in [
        ("gen_ai.operation.name", "chat"),
        ("gen_ai.request.model", "mock-gpt"),
        ("gen_ai.response.model", "mock-gpt"),
        ("gen_ai.provider.name", "openai"),
        ("http.request.method", "POST"),
        ("http.route", "/v1/chat/completions"),
        ("http.response.status_code", "200"),
        ("gateway.stream", "false"),
        ("gateway.request_id", id.as_str()),
        ("gateway.account.id", user.as_str()),
        ("gateway.deployment", "mock/mock-gpt"),
        ("gen_ai.response.finish_reasons", "stop"),
    ] {
        assert_eq!(root.attr(k), Some(v), "{k} in {root:#?}");
    }
    assert!(root.attr("gateway.key.id").unwrap().starts_with("key_"));
    let input: u64 = root
        .attr("gen_ai.usage.input_tokens")
        .unwrap()
        .parse()
        .unwrap();
    let output: u64 = root
        .attr("gen_ai.usage.output_tokens")
        .unwrap()
        .parse()
        .unwrap();
    assert!(input > 0 && output > 0, "{root:#?}");
    assert!(root.attr("gen_ai.usage.cache_read.input_tokens").is_some());
    assert!(
        root.attr("http.request.body.size").is_some(),
        "capture_sizes is on"
    );
    assert!(
        root.events.contains(&"gateway.first_byte".to_string()),
        "{root:#?}"
    );
    assert_eq!(root.status, 0, "not an error");
    let attempts = clients(&spans);
    assert_eq!(attempts.len(), 1);
    let a = attempts[0];
    assert_eq!(a.attr("gateway.attempt.outcome"), Some("complete"));
    assert_eq!(a.attr("gateway.deployment"), Some("mock/mock-gpt"));
    assert_eq!(a.attr("http.response.status_code"), Some("200"));
    assert_eq!(a.name, "chat mock-gpt");
    assert_eq!(a.attr("gen_ai.provider.name"), Some("openai"));
    assert_eq!(a.attr("gen_ai.request.model"), Some("mock-gpt"));
    assert_eq!(a.attr("server.address"), Some("127.0.0.1"));
    assert_eq!(a.attr("gateway.attempt"), Some("1"));
    assert!(a.attr("server.port").is_some_and(|p| p != "0"), "{a:#?}");
    // The provider's request carries the attempt's context.
    let (tid, parent) = provider_traceparent(&mock, 0).await;
    assert_eq!(tid, trace_id);
    assert_eq!(parent, a.span_id);
    assert_eq!(rx.per_export.lock().unwrap()[0], "application/x-protobuf ");

    // Streamed.
    mock.clear().await;
    let (status, id, body) = send(
        &gw,
        "/v1/chat/completions",
        &key,
        &chat("mock-gpt", true),
        &[],
    )
    .await;
    assert_eq!(status, 200);
    assert!(body.contains("data:"), "{body}");
    let spans = rx.trace(&logged_trace_id(&gw, &id).await, 3).await;
    check_tree(&spans, &key);
    let root = server(&spans);
    assert_eq!(root.attr("gateway.stream"), Some("true"));
    assert_eq!(root.attr("gen_ai.response.finish_reasons"), Some("stop"));
    assert!(root
        .attr("gen_ai.usage.output_tokens")
        .is_some_and(|v| v != "0"));
    assert!(root.events.contains(&"gateway.first_byte".to_string()));
    assert_eq!(clients(&spans).len(), 1);

    // Translated: an Anthropic-style call to an OpenAI-style model.
    mock.clear().await;
    let messages = json!({"model": "mock-gpt", "max_tokens": 64,
                          "messages": [{"role": "user", "content": "the secret prompt"}]});
    let (status, id, _) = send(&gw, "/v1/messages", &key, &messages, &[]).await;
    assert_eq!(status, 200);
    let spans = rx.trace(&logged_trace_id(&gw, &id).await, 3).await;
    check_tree(&spans, &key);
    let root = server(&spans);
    assert_eq!(root.attr("http.route"), Some("/v1/messages"));
    assert_eq!(root.attr("gen_ai.provider.name"), Some("openai"));
    // As the provider stated it (an OpenAI-style answer), before translation.
    assert_eq!(root.attr("gen_ai.response.finish_reasons"), Some("stop"));
    let attempts = clients(&spans);
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].attr("gen_ai.provider.name"), Some("openai"));
    assert_eq!(mock.requests().await[0]["path"], "/v1/chat/completions");

    // A site request gets a span of its own, with its route.
    let r = client()
        .get(gw.site_url("/api/auth/session"))
        .send()
        .await
        .expect("site");
    assert_eq!(r.status(), 200);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let site: Vec<Rec> = rx
            .all()
            .into_iter()
            .filter(|s| s.attr("http.route") == Some("/api/auth/session"))
            .collect();
        if let Some(s) = site.first() {
            assert_eq!(s.name, "GET /api/auth/session");
            assert_eq!(s.kind, SpanKind::Server as i32);
            assert_eq!(s.attr("gateway.outcome"), Some("ok"));
            assert_eq!(s.attr("http.response.status_code"), Some("200"));
            break;
        }
        assert!(Instant::now() < deadline, "no site span");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn failover_refusal_and_client_trace_context() {
    let rx = Receiver::start().await;
    let mock = Mock::start(&[]);
    let gw = start(&mock, &rx.url, 1.0);
    let (_, key) = gw.user_and_key("failover@example.com");

    // The first deployment tried answers 500: two client spans, the first failed over.
    let r = client()
        .post(format!("{}/__mock/fail", mock.url()))
        .json(&json!({"status": 500, "count": 1}))
        .send()
        .await
        .expect("script the mock");
    assert_eq!(r.status(), 200);
    let (status, id, _) = send(&gw, "/v1/chat/completions", &key, &chat("pair", false), &[]).await;
    assert_eq!(status, 200);
    let trace_id = logged_trace_id(&gw, &id).await;
    let spans = rx.trace(&trace_id, 4).await;
    check_tree(&spans, &key);
    let mut attempts = clients(&spans);
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    attempts.sort_by_key(|a| a.attr("gateway.attempt").unwrap_or("").to_string());
    assert_eq!(attempts[0].attr("gateway.attempt"), Some("1"));
    assert_eq!(
        attempts[0].attr("gateway.attempt.outcome"),
        Some("server_error")
    );
    assert_eq!(attempts[0].attr("http.response.status_code"), Some("500"));
    assert_eq!(attempts[0].status, 2, "a failed attempt is an error");
    assert_eq!(
        attempts[1].attr("gateway.attempt.outcome"),
        Some("complete")
    );
    assert_ne!(
        attempts[0].attr("gateway.deployment"),
        attempts[1].attr("gateway.deployment")
    );
    assert_eq!(server(&spans).status, 0, "the request itself succeeded");
    // Each attempt's request carried its own span as the parent.
    let reqs = mock.requests().await;
    assert_eq!(reqs.len(), 2);
    for (n, a) in attempts.iter().enumerate() {
        let (tid, parent) = provider_traceparent(&mock, n).await;
        assert_eq!(tid, trace_id);
        assert_eq!(parent, a.span_id);
    }

    // Refused: an unknown key. The server span says why; nothing was attempted.
    mock.clear().await;
    let (status, id, _) = send(
        &gw,
        "/v1/chat/completions",
        "sk-not-a-real-key-0000000000000000",
        &chat("mock-gpt", false),
        &[],
    )
    .await;
    assert_eq!(status, 401);
    let spans = rx.trace(&logged_trace_id(&gw, &id).await, 2).await;
    let root = server(&spans);
    assert_eq!(root.attr("gateway.error_code"), Some("invalid_api_key"));
    assert_eq!(root.attr("error.type"), Some("invalid_api_key"));
    assert_eq!(root.attr("http.response.status_code"), Some("401"));
    assert_eq!(root.status, 2);
    let admission = one(&spans, "gateway.admission");
    assert_eq!(admission.attr("error.type"), Some("invalid_api_key"));
    assert!(clients(&spans).is_empty());
    assert!(mock.requests().await.is_empty());

    // A client's trace context: the gateway joins the client's trace, and the provider's
    // request is part of it; the client's own span is not what the provider sees as parent.
    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let traceparent = format!("00-{client_trace}-{client_span}-01");
    let (status, id, _) = send(
        &gw,
        "/v1/chat/completions",
        &key,
        &chat("mock-gpt", false),
        &[("traceparent", &traceparent), ("tracestate", "vendor=abc")],
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(logged_trace_id(&gw, &id).await, client_trace);
    let spans = rx.trace(client_trace, 3).await;
    let root = server(&spans);
    assert_eq!(root.parent, client_span);
    let (tid, parent) = provider_traceparent(&mock, 0).await;
    assert_eq!(tid, client_trace);
    assert_eq!(parent, clients(&spans)[0].span_id);
    let recorded = &mock.requests().await[0]["headers"];
    assert_eq!(recorded["tracestate"], "vendor=abc");
    // The client's credentials still never reach the provider.
    assert_ne!(recorded["authorization"], format!("Bearer {key}"));
}

#[tokio::test]
async fn sample_ratio_is_parent_based_and_reloads_live() {
    let rx = Receiver::start().await;
    let mock = Mock::start(&[]);
    let gw = start(&mock, &rx.url, 0.0);
    let (_, key) = gw.user_and_key("ratio@example.com");

    // Ratio 0: a trace started here is not sampled, but the provider still gets the context
    // (unsampled) so its own spans are not orphaned.
    let unsampled = plain_chat(&gw, &key).await;
    let tp = mock.requests().await[0]["headers"]["traceparent"]
        .as_str()
        .expect("traceparent")
        .to_string();
    assert!(tp.contains(&unsampled) && tp.ends_with("-00"), "{tp}");
    // A client's sampled decision is followed even at ratio 0.
    let parent_trace = "0af7651916cd43dd8448eb211c80319c";
    let (status, _, _) = send(
        &gw,
        "/v1/chat/completions",
        &key,
        &chat("mock-gpt", false),
        &[(
            "traceparent",
            &format!("00-{parent_trace}-b7ad6b7169203331-01"),
        )],
    )
    .await;
    assert_eq!(status, 200);
    rx.trace(parent_trace, 3).await;

    // Ratio 1 by reload: the next request is sampled.
    let text = std::fs::read_to_string(&gw.config_path).expect("config");
    std::fs::write(
        &gw.config_path,
        text.replace("sample_ratio = 0", "sample_ratio = 1.0"),
    )
    .expect("rewrite config");
    let deadline = Instant::now() + Duration::from_secs(20);
    let sampled = loop {
        let trace_id = plain_chat(&gw, &key).await;
        let tp = mock.requests().await.last().expect("recorded")["headers"]["traceparent"]
            .as_str()
            .unwrap_or("")
            .to_string();
        if tp.ends_with("-01") {
            break trace_id;
        }
        assert!(Instant::now() < deadline, "the new ratio never applied");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    rx.trace(&sampled, 3).await;
    // Spans end in order: by the time the sampled trace arrived, an unsampled one would have.
    assert!(rx.all().iter().all(|s| s.trace_id != unsampled));
}

#[tokio::test]
async fn an_unreachable_collector_fails_nothing_and_drops_are_counted() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = dead.local_addr().expect("addr").port();
    drop(dead);
    let mock = Mock::start(&[]);
    let gw = start(&mock, &format!("http://127.0.0.1:{port}"), 1.0);
    let (_, key) = gw.user_and_key("dead-collector@example.com");
    for _ in 0..20 {
        answered_chat(&gw, &key).await;
    }
    export_failures(&gw, 60.0, 30, "spans of 20 requests").await;
}

/// Waits (at most `secs`) until at least `n` spans are counted as failed exports.
async fn export_failures(gw: &Gateway, n: f64, secs: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let dropped = gw
            .metric("gateway_telemetry_spans_dropped_total{reason=\"export_failed\"}")
            .await;
        if dropped >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} not counted as dropped: {dropped}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A collector that asks to be left alone for longer than the gateway waits gets no early
/// retry: that batch is dropped (and counted), the next one is sent as usual.
#[tokio::test]
async fn a_long_retry_after_drops_the_batch_instead_of_asking_early() {
    let rx = Receiver::start_refusing(1, Some("30")).await;
    let mock = Mock::start(&[]);
    let gw = start(&mock, &rx.url, 1.0);
    let (_, key) = gw.user_and_key("retry-after@example.com");
    plain_chat(&gw, &key).await;
    // The refused first export holds at least the readiness probes' spans (the API's and the
    // site's `/health`); the chat's three ride with them only when the export thread has not
    // woken in between (a slow machine's account set-up takes longer than its second).
    export_failures(&gw, 2.0, 15, "the refused batch").await;
    let trace_id = plain_chat(&gw, &key).await;
    rx.trace(&trace_id, 3).await;
    let lines = rx.per_export.lock().unwrap().clone();
    assert!(lines[0].starts_with("refused"), "{lines:?}");
    assert!(
        lines[1..].iter().all(|l| !l.starts_with("refused")),
        "{lines:?}"
    );
}

/// A collector that takes the connection and never answers: requests are neither slowed nor
/// failed, and the export gives up at its deadline, its spans counted as dropped.
#[tokio::test]
async fn a_collector_that_never_answers_slows_nothing() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = silent.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            held.push(conn);
        }
    });
    let mock = Mock::start(&[]);
    let gw = start(&mock, &format!("http://127.0.0.1:{port}"), 1.0);
    let (_, key) = gw.user_and_key("silent-collector@example.com");
    for _ in 0..10 {
        let started = Instant::now();
        answered_chat(&gw, &key).await;
        assert!(started.elapsed() < Duration::from_secs(2));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    export_failures(&gw, 3.0, 40, "spans sent to a silent collector").await;
}

/// `protocol = "grpc"`: the same span tree reaches an OTLP/gRPC receiver, with the collector's
/// headers from the environment as gRPC metadata.
#[tokio::test]
async fn grpc_export_carries_the_same_span_tree() {
    let rx = Receiver::start_grpc().await;
    let mock = Mock::start(&[]);
    let extra = format!(
        "{}{}protocol = \"grpc\"\n",
        EXTRA.replace("MOCK_URL", &mock.url()),
        telemetry_toml(&rx.url, 1.0)
    );
    let gw = start_with_collector_headers(&mock, extra);
    let (_, key) = gw.user_and_key("grpc@example.com");
    let trace_id = plain_chat(&gw, &key).await;
    let spans = rx.trace(&trace_id, 3).await;
    check_tree(&spans, &key);
    assert_eq!(
        server(&spans).attr("gen_ai.request.model"),
        Some("mock-gpt")
    );
    let (tid, parent) = provider_traceparent(&mock, 0).await;
    assert_eq!(tid, trace_id);
    assert_eq!(parent, clients(&spans)[0].span_id);
    let tenants = rx.per_export.lock().unwrap().clone();
    assert!(
        !tenants.is_empty() && tenants.iter().all(|t| t == "team a"),
        "collector metadata: {tenants:?}"
    );
}

/// OTLP/HTTP: a collector that answers 503 is asked again (the spans arrive once, not lost and
/// not twice), and the collector's headers from the environment go with every request.
#[tokio::test]
async fn http_export_retries_a_busy_collector_with_its_headers() {
    let rx = Receiver::start_refusing(1, None).await;
    let mock = Mock::start(&[]);
    let gw = start_with_collector_headers(&mock, telemetry_toml(&rx.url, 1.0));
    let (_, key) = gw.user_and_key("busy-collector@example.com");
    let trace_id = plain_chat(&gw, &key).await;
    let spans = rx.trace(&trace_id, 3).await;
    check_tree(&spans, &key);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let again = rx
        .all()
        .into_iter()
        .filter(|s| s.trace_id == trace_id)
        .count();
    assert_eq!(again, 3, "each span once");
    let lines = rx.per_export.lock().unwrap().clone();
    assert_eq!(
        lines[0], "refused application/x-protobuf team a",
        "{lines:?}"
    );
    assert!(
        lines[1..]
            .iter()
            .all(|l| l == "application/x-protobuf team a"),
        "{lines:?}"
    );
    assert_eq!(
        gw.metric("gateway_telemetry_spans_dropped_total{reason=\"export_failed\"}")
            .await,
        0.0
    );
}

/// The shipped config leaves telemetry off; an unknown protocol is refused with a clear error.
#[test]
fn shipped_config_is_off_and_an_unknown_protocol_is_refused() {
    let shipped = gateway_core::config::Config::load(std::path::Path::new("conf/gateway.toml"))
        .expect("shipped config");
    assert_eq!(shipped.telemetry.endpoint, None);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gw.toml");
    std::fs::write(
        &path,
        "[telemetry]\notlp_endpoint = \"http://127.0.0.1:4317\"\nprotocol = \"thrift\"\n",
    )
    .expect("write");
    let e = gateway_core::config::Config::from_str(&path, &std::fs::read_to_string(&path).unwrap())
        .unwrap_err();
    assert_eq!(e.key, "telemetry.protocol");
    assert!(e.message.contains("grpc"), "{e}");
}
