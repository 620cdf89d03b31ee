//! Forwarding an admitted request to a provider and streaming the answer back.
//!
//! Failover happens only before the first byte reaches the client: a connect error, timeout,
//! 429 or 5xx moves on to the next deployment and cools the failing one down. Once the response
//! header is written, the body is relayed chunk by chunk (never buffered), usage is observed on
//! the way, and the client is watched so an abort is seen at once.

use bytes::Bytes;
use pingora_http::ResponseHeader;
use pingora_proxy::Session;
use serde_json::Value;

use crate::config::ProviderStyle;
use crate::error::ApiError;
use crate::proxy::pipeline::Admitted;
use crate::proxy::route::Endpoint;
use crate::proxy::routing::Target;
use crate::proxy::settle::{InFlight, Reason};
use crate::proxy::sse::{usage_from_body, EventVerdict, SseParser, StreamKind, StreamUsageTracker};
use crate::proxy::upstream::{Exchange, ProviderRequest};
use crate::state::SharedState;

/// Provider error bodies read while failing over are bounded.
const ERROR_BODY_LIMIT: usize = 1024 * 1024;
/// Copy of a non-streamed JSON body kept to read its usage.
const USAGE_COPY_LIMIT: usize = 16 * 1024 * 1024;

/// How a forwarded request ended, for settlement.
pub struct Outcome {
    pub status: u16,
    pub reason: Reason,
    pub error_code: Option<&'static str>,
}

/// Client headers worth passing on. Everything else (credentials, cookies, hop-by-hop,
/// encodings we could not parse) stays behind.
const PASS_REQUEST_HEADERS: [&str; 3] = ["accept", "user-agent", "openai-beta"];

/// Provider headers never shown to clients.
fn drop_response_header(name: &str) -> bool {
    matches!(
        name,
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "set-cookie"
            | "set-cookie2"
            | "content-length"
            | "x-request-id"
            | "openai-organization"
            | "openai-project"
            | "anthropic-organization-id"
            | "request-id"
    )
}

fn stream_kind(endpoint: Endpoint) -> Option<StreamKind> {
    match endpoint {
        Endpoint::ChatCompletions => Some(StreamKind::OpenAiChat),
        Endpoint::Responses => Some(StreamKind::OpenAiResponses),
        Endpoint::Messages => Some(StreamKind::Anthropic),
        _ => None,
    }
}

/// The body to send to one target: the client's bytes untouched unless the model is renamed or
/// a streaming chat request needs `stream_options.include_usage` (the gateway always wants the
/// provider's own count).
fn upstream_body(adm: &Admitted, target: &Target) -> Bytes {
    let Some(json) = &adm.json else {
        return adm.body.clone();
    };
    let rename = target
        .upstream_model
        .as_deref()
        .filter(|m| *m != adm.model_name);
    let want_usage = adm.stream
        && adm.endpoint == Endpoint::ChatCompletions
        && target.provider.style == ProviderStyle::OpenAi
        && !adm.client_wants_usage;
    if rename.is_none() && !want_usage {
        return adm.body.clone();
    }
    let mut j = json.clone();
    if let (Some(m), Some(obj)) = (rename, j.as_object_mut()) {
        obj.insert("model".into(), Value::String(m.to_string()));
    }
    if want_usage {
        if let Some(obj) = j.as_object_mut() {
            let opts = obj
                .entry("stream_options")
                .or_insert_with(|| Value::Object(Default::default()));
            if let Some(o) = opts.as_object_mut() {
                o.insert("include_usage".into(), Value::Bool(true));
            }
        }
    }
    Bytes::from(serde_json::to_vec(&j).unwrap_or_else(|_| adm.body.to_vec()))
}

fn upstream_headers(
    session: &Session,
    target: &Target,
    adm: &Admitted,
) -> Vec<(&'static str, String)> {
    let req = session.req_header();
    let get = |n: &str| {
        req.headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let mut h: Vec<(&'static str, String)> = Vec::with_capacity(8);
    if !adm.endpoint.is_get() {
        h.push(("content-type", "application/json".into()));
    }
    for name in PASS_REQUEST_HEADERS {
        if let Some(v) = get(name) {
            h.push((name, v));
        }
    }
    h.push(("accept-encoding", "identity".into()));
    let p = &target.provider;
    match p.style {
        ProviderStyle::OpenAi => {
            if let Some(k) = &p.api_key {
                h.push(("authorization", format!("Bearer {k}")));
            }
        }
        ProviderStyle::Anthropic => {
            if let Some(k) = &p.api_key {
                h.push(("x-api-key", k.clone()));
            }
            let version = get("anthropic-version")
                .or_else(|| get("compat-version"))
                .unwrap_or_else(|| "2023-06-01".into());
            h.push(("anthropic-version", version));
            if let Some(beta) = get("anthropic-beta") {
                h.push(("anthropic-beta", beta));
            }
        }
    }
    h
}

/// Tries the targets in order until one answers with something other than a retryable failure.
async fn connect(
    state: &SharedState,
    session: &Session,
    adm: &Admitted,
    targets: &[Target],
) -> Result<(Exchange, Target), ApiError> {
    let mut last_failure: Option<ApiError> = None;
    for (i, target) in targets.iter().enumerate() {
        let is_last = i + 1 == targets.len();
        let path = format!("{}{}", target.provider.base_path, adm.endpoint.path());
        let req = ProviderRequest {
            provider: &target.provider,
            method: if adm.endpoint.is_get() { "GET" } else { "POST" },
            path: &path,
            headers: upstream_headers(session, target, adm),
            body: upstream_body(adm, target),
        };
        match state.upstreams.start(&req).await {
            Ok(mut ex) => {
                let status = ex.status();
                if (status == 429 || status >= 500) && !is_last {
                    log::warn!(
                        "deployment {} answered {status}; failing over",
                        target.label()
                    );
                    state.routing.cool_down(target);
                    let _ = ex.read_all(ERROR_BODY_LIMIT).await;
                    state.upstreams.finish(ex).await;
                    continue;
                }
                if status == 429 || status >= 500 {
                    state.routing.cool_down(target);
                }
                return Ok((ex, target.clone()));
            }
            Err(e) => {
                log::warn!("deployment {} failed: {e}", target.label());
                state.routing.cool_down(target);
                last_failure = Some(ApiError::RoutingUnavailable);
            }
        }
    }
    Err(last_failure.unwrap_or(ApiError::RoutingUnavailable))
}

fn client_header(
    ex: &Exchange,
    request_id: &str,
    extra: &[(String, String)],
) -> Option<Box<ResponseHeader>> {
    let up = ex.header()?;
    let mut h = ResponseHeader::build(up.status, Some(up.headers.len() + 4)).ok()?;
    for (name, value) in up.headers.iter() {
        if !drop_response_header(name.as_str()) {
            h.append_header(name.clone(), value.clone()).ok()?;
        }
    }
    h.insert_header("x-request-id", request_id).ok()?;
    for (k, v) in extra {
        h.insert_header(k.clone(), v.as_str()).ok()?;
    }
    Some(Box::new(h))
}

fn is_event_stream(ex: &Exchange) -> bool {
    ex.header()
        .and_then(|h| h.headers.get(http::header::CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

fn is_json(ex: &Exchange) -> bool {
    ex.header()
        .and_then(|h| h.headers.get(http::header::CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("json"))
}

/// An SSE error event in the client's style, sent when the provider fails mid-stream so the
/// client sees an error rather than a silently short answer.
fn stream_error_frame(style_b: bool) -> Bytes {
    if style_b {
        Bytes::from_static(
            b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"The upstream stream was interrupted.\"}}\n\n",
        )
    } else {
        Bytes::from_static(
            b"data: {\"error\":{\"message\":\"The upstream stream was interrupted.\",\"type\":\"server_error\",\"code\":\"upstream_error\"}}\n\n",
        )
    }
}

/// How the answer to the client is dressed: its request id, its error style, extra headers
/// (rate-limit information).
pub struct Reply<'a> {
    pub request_id: &'a str,
    pub style_b: bool,
    pub extra_headers: &'a [(String, String)],
}

/// Forwards `adm` to the first target that answers and relays the response.
pub async fn forward(
    state: &SharedState,
    session: &mut Session,
    adm: &Admitted,
    targets: &[Target],
    flight: &mut InFlight,
    reply: &Reply<'_>,
) -> Result<Outcome, ApiError> {
    if targets.is_empty() {
        return Err(ApiError::RoutingUnavailable);
    }
    let (mut ex, target) = connect(state, session, adm, targets).await?;
    flight.event.deployment = Some(target.label());
    let status = ex.status();
    let Some(header) = client_header(&ex, reply.request_id, reply.extra_headers) else {
        state.upstreams.abort(ex).await;
        return Err(ApiError::ServerError);
    };
    let sse = is_event_stream(&ex);
    let kind = stream_kind(adm.endpoint);
    let drop_usage_only = sse
        && adm.endpoint == Endpoint::ChatCompletions
        && target.provider.style == ProviderStyle::OpenAi
        && !adm.client_wants_usage;
    let mut parser = if sse { Some(SseParser::new()) } else { None };
    if let (true, Some(k)) = (sse, kind) {
        flight.tracker = Some(StreamUsageTracker::new(k));
    }
    let keep_json_copy = !sse && is_json(&ex) && status < 400;
    let mut json_copy: Vec<u8> = Vec::new();

    session.as_downstream_mut().set_abort_on_close(true);
    if session.write_response_header(header, false).await.is_err() {
        state.upstreams.abort(ex).await;
        return Ok(Outcome {
            status,
            reason: Reason::ClientDisconnect,
            error_code: None,
        });
    }
    flight.mark_first_byte();

    let reason = loop {
        tokio::select! {
            chunk = ex.next_chunk() => match chunk {
                Ok(Some(bytes)) => {
                    let out = match parser.as_mut() {
                        Some(p) => {
                            let events = p.feed(&bytes);
                            if drop_usage_only {
                                let mut keep = bytes::BytesMut::with_capacity(bytes.len());
                                for ev in &events {
                                    let verdict = flight
                                        .tracker
                                        .as_mut()
                                        .map(|t| t.observe(ev))
                                        .unwrap_or(EventVerdict::Forward);
                                    if verdict == EventVerdict::Forward {
                                        keep.extend_from_slice(&ev.raw);
                                    }
                                }
                                keep.freeze()
                            } else {
                                if let Some(t) = flight.tracker.as_mut() {
                                    for ev in &events {
                                        t.observe(ev);
                                    }
                                }
                                bytes
                            }
                        }
                        None => {
                            if keep_json_copy && json_copy.len() + bytes.len() <= USAGE_COPY_LIMIT {
                                json_copy.extend_from_slice(&bytes);
                            }
                            bytes
                        }
                    };
                    if !out.is_empty() {
                        flight.output_started = true;
                        if session.write_response_body(Some(out), false).await.is_err() {
                            break Reason::ClientDisconnect;
                        }
                    }
                }
                Ok(None) => break Reason::Complete,
                Err(e) => {
                    log::warn!("deployment {} failed mid-response: {e}", target.label());
                    break Reason::UpstreamError;
                }
            },
            gone = session.as_downstream_mut().read_body_or_idle(true) => {
                if gone.is_err() {
                    break Reason::ClientDisconnect;
                }
            }
        }
    };

    // A stream that ended without a final blank line still owes the client its last bytes.
    if let Some(ev) = parser.as_mut().and_then(|p| p.finish()) {
        let verdict = flight
            .tracker
            .as_mut()
            .map(|t| t.observe(&ev))
            .unwrap_or(EventVerdict::Forward);
        let forward_tail = drop_usage_only && verdict == EventVerdict::Forward;
        if reason == Reason::Complete && forward_tail {
            let _ = session
                .write_response_body(Some(ev.raw.clone()), false)
                .await;
        }
    }
    if let Some(t) = &flight.tracker {
        if let Some(u) = t.usage() {
            flight.provider_usage = Some(u);
        }
    } else if keep_json_copy {
        flight.provider_usage = usage_from_body(kind.unwrap_or(StreamKind::OpenAiChat), &json_copy);
        if flight.provider_usage.is_none() && adm.endpoint.generates() {
            // No usage in the body: count the answer's text as delivered output.
            let text = String::from_utf8_lossy(&json_copy);
            flight.counted_output = Some(state.tokens.count(&text));
        }
    }

    let (reason, error_code) = match reason {
        Reason::Complete => {
            state.upstreams.finish(ex).await;
            let _ = session.write_response_body(None, true).await;
            if status >= 400 {
                (Reason::ProviderError, Some("provider_error"))
            } else {
                (Reason::Complete, None)
            }
        }
        Reason::UpstreamError => {
            state.upstreams.abort(ex).await;
            state.routing.cool_down(&target);
            if sse {
                let _ = session
                    .write_response_body(Some(stream_error_frame(reply.style_b)), false)
                    .await;
                let _ = session.write_response_body(None, true).await;
            } else {
                // A cut plain body cannot be marked as failed in-band: close the connection so
                // the client sees the truncation.
                session.as_downstream_mut().shutdown().await;
            }
            (Reason::UpstreamError, Some("upstream_error"))
        }
        other => {
            state.upstreams.abort(ex).await;
            (other, Some("client_disconnect"))
        }
    };
    if status >= 400 && reason == Reason::ProviderError {
        // The provider refused before generating: nothing to charge beyond what it reported.
        flight.charge_input_estimate = false;
    }
    Ok(Outcome {
        status,
        reason,
        error_code,
    })
}
