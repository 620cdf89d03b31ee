//! Forwarding an admitted request to a provider and streaming the answer back.
//!
//! Failover happens only before the first byte reaches the client: a connect error, TLS error,
//! timeout, 401, 429 or 5xx moves on to the next deployment, and every attempt is scored for its
//! deployment's health ([`crate::routing`]). Once the response
//! header is written, the body is relayed chunk by chunk through a [`Shaper`] (which passes it
//! through or translates it into the client's style), usage is observed on the way, and the
//! client is watched so an abort is seen at once. Only a translated non-stream answer and a
//! provider error are held until complete: the one has to be parsed whole to be translated, the
//! other is checked for an echo of the provider credential ([`sanitize`]). A provider 401/403 is
//! not relayed at all.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use crate::Session;
use bytes::{Bytes, BytesMut};
use http::HeaderName;
use pingora_http::ResponseHeader;
use serde_json::Value;

use crate::cloud::{self, ClientHeaders, NotSent};
use crate::error::ApiError;
use crate::pipeline::Admitted;
use crate::respond;
use crate::route::Endpoint;
use crate::routing::{retry_after, Failure, Outstanding, Target, Verdict};
use crate::sanitize;
use crate::settle::{InFlight, Reason};
use crate::shape::{ClientSide, Crossing, Shaper, Translated};
use crate::state::SharedApiState;
use crate::upstream::{Exchange, ProviderRequest, UpstreamError};
use crate::usage::{StreamKind, StreamUsageTracker};
use gateway_core::config::StyleAccess;
use gateway_core::domain::{ProviderStyle, Wire};
use gateway_core::response_items::Issued;

/// Provider error bodies read while failing over are bounded.
const ERROR_BODY_LIMIT: usize = 1024 * 1024;

/// Where an admitted request may go: the deployments to try in order and, when some of them
/// speak the other style, the request already translated for those (see
/// [`crate::shape::translate_request`]).
pub struct Attempts {
    pub targets: Vec<Target>,
    pub translated: Translated,
    /// `routing.failover_deadline_ms`: no attempt starts later than this after the first.
    pub deadline: Duration,
}

/// How a forwarded request ended, for settlement.
pub struct Outcome {
    pub status: u16,
    pub reason: Reason,
    pub error_code: Option<&'static str>,
}

/// Client headers worth passing on. Everything else (credentials, cookies, hop-by-hop,
/// encodings we could not parse) stays behind. Names built at compile time: a `&str` name is
/// parsed on every lookup, and these are looked up for every request.
static PASS_REQUEST_HEADERS: [HeaderName; 3] = [
    http::header::ACCEPT,
    http::header::USER_AGENT,
    HeaderName::from_static("openai-beta"),
];
static ANTHROPIC_VERSION: HeaderName = HeaderName::from_static("anthropic-version");
static COMPAT_VERSION: HeaderName = HeaderName::from_static("compat-version");
static ANTHROPIC_BETA: HeaderName = HeaderName::from_static("anthropic-beta");

/// The body to send to one target. Same style: the client's bytes untouched unless the model is
/// renamed, a streaming chat request needs `stream_options.include_usage` (the gateway always
/// wants the provider's own count) or its output is clamped to the model's limit. Other style:
/// the translated body (which asks for usage itself) with this deployment's model name and any
/// clamp.
pub(crate) fn upstream_body(
    adm: &Admitted,
    target: &Target,
    crossing: Crossing,
    translated: &Translated,
) -> Result<Bytes, ApiError> {
    if crossing != Crossing::Native {
        let Some(mut j) = translated.get(crossing).cloned() else {
            log::error!("no translated body for {}", target.label());
            return Err(ApiError::ServerError);
        };
        let model = target.upstream_model.as_deref().unwrap_or(&adm.model_name);
        if let Some(obj) = j.as_object_mut() {
            obj.insert("model".into(), Value::String(model.to_string()));
        }
        if let Some(limit) = adm.output_clamp {
            crate::tokens::clamp_output(&mut j, limit);
        }
        return serde_json::to_vec(&j)
            .map(Bytes::from)
            .map_err(|_| ApiError::ServerError);
    }
    if adm.endpoint.is_get() {
        return Ok(adm.body.clone());
    }
    let rename = target
        .upstream_model
        .as_deref()
        .filter(|m| *m != adm.model_name);
    let want_usage = adm.stream
        && adm.endpoint == Endpoint::ChatCompletions
        && target.provider.style.wire() == Wire::OpenAi
        && !adm.client_wants_usage;
    if rename.is_none() && !want_usage && adm.output_clamp.is_none() {
        return Ok(adm.body.clone());
    }
    let mut j = adm.tree_for_rewrite()?.into_owned();
    if let Some(limit) = adm.output_clamp {
        crate::tokens::clamp_output(&mut j, limit);
    }
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
    Ok(Bytes::from(
        serde_json::to_vec(&j).unwrap_or_else(|_| adm.body.to_vec()),
    ))
}

/// The client headers a cloud request carries on ([`cloud::prepare`]).
fn client_headers(session: &Session) -> ClientHeaders<'_> {
    let req = session.req_header();
    let get = |n: &HeaderName| req.headers.get(n).and_then(|v| v.to_str().ok());
    ClientHeaders {
        user_agent: get(&http::header::USER_AGENT),
        anthropic_beta: get(&ANTHROPIC_BETA),
    }
}

/// The headers sent to a provider, borrowed from the client's request and the provider's
/// configuration where they can be (this runs for every request).
fn upstream_headers<'a>(
    session: &'a Session,
    target: &'a Target,
    adm: &Admitted,
) -> Vec<(&'static str, Cow<'a, str>)> {
    let req = session.req_header();
    let get = |n: &HeaderName| req.headers.get(n).and_then(|v| v.to_str().ok());
    let mut h: Vec<(&'static str, Cow<'a, str>)> = Vec::with_capacity(8);
    if !adm.endpoint.is_get() {
        h.push(("content-type", Cow::Borrowed("application/json")));
    }
    for name in &PASS_REQUEST_HEADERS {
        if let Some(v) = get(name) {
            h.push((name.as_str(), Cow::Borrowed(v)));
        }
    }
    h.push(("accept-encoding", Cow::Borrowed("identity")));
    let p = &target.provider;
    match p.style {
        ProviderStyle::OpenAi => {
            if let Some(k) = &p.api_key {
                h.push(("authorization", Cow::Owned(format!("Bearer {k}"))));
            }
        }
        ProviderStyle::Anthropic => {
            if let Some(k) = &p.api_key {
                h.push(("x-api-key", Cow::Borrowed(k.as_str())));
            }
            let version = get(&ANTHROPIC_VERSION)
                .or_else(|| get(&COMPAT_VERSION))
                .unwrap_or("2023-06-01");
            h.push(("anthropic-version", Cow::Borrowed(version)));
            if let Some(beta) = get(&ANTHROPIC_BETA) {
                h.push(("anthropic-beta", Cow::Borrowed(beta)));
            }
        }
        // Cloud styles build their own requests (`cloud::prepare`).
        ProviderStyle::Azure
        | ProviderStyle::Bedrock
        | ProviderStyle::VertexAnthropic
        | ProviderStyle::Gemini => {}
    }
    h
}

/// The answer under way: the exchange, where it came from, how the request crossed to it, and
/// whether it still counts for the deployment's health (a failure passed on as the last resort
/// was already scored).
struct Answer {
    ex: Exchange,
    target: Target,
    crossing: Crossing,
    scores: bool,
    /// The provider refused the operator's credential (401/403, or what a cloud's error says).
    refused: bool,
    /// The body, when it was read to judge the answer ([`cloud::judge`]).
    prefetched: Option<Bytes>,
    /// Holds the deployment's outstanding count until the answer is relayed.
    _outstanding: Outstanding,
    /// The attempt's client span, when telemetry is on; ended once the relay ends.
    attempt: Option<crate::trace::Attempt>,
}

/// Tries the targets in order until one answers with something other than a failure of the
/// deployment, scoring every attempt. The attempts are bounded twice: the plan holds at most
/// `routing.max_attempts` targets, and none is started after `routing.failover_deadline_ms`.
/// The last one's failing answer (5xx, 429) is passed on in the client's style; when no
/// provider answered at all, the request gets 502 `routing_unavailable` saying why.
async fn connect(
    state: &SharedApiState,
    session: &Session,
    adm: &Admitted,
    attempts: &Attempts,
    request_id: &str,
    trace: Option<&crate::trace::RequestTrace>,
) -> Result<Answer, ApiError> {
    let started = Instant::now();
    let mut last_failure: Option<Failure> = None;
    let targets = &attempts.targets;
    for (i, target) in targets.iter().enumerate() {
        if i > 0 && started.elapsed() >= attempts.deadline {
            log::warn!(
                "request {request_id}: failover deadline reached after {i} attempts; not trying {}",
                target.label()
            );
            break;
        }
        let Some(crossing) = Crossing::of(adm.endpoint, &target.provider) else {
            continue;
        };
        let endpoint = crossing.provider_endpoint(adm.endpoint);
        let direct = target.provider.style.is_direct();
        let attempt = trace.map(|t| t.attempt(target, i, adm));
        let mut req = if direct {
            ProviderRequest {
                provider: &target.provider,
                method: if endpoint.is_get() { "GET" } else { "POST" },
                path: Cow::Owned([target.provider.base_path.as_str(), endpoint.path()].concat()),
                headers: upstream_headers(session, target, adm),
                body: upstream_body(adm, target, crossing, &attempts.translated)?,
            }
        } else {
            let client = client_headers(session);
            match cloud::prepare(state, &client, target, adm, crossing, &attempts.translated).await
            {
                Ok(p) => ProviderRequest {
                    provider: &target.provider,
                    method: "POST",
                    path: Cow::Owned(p.path),
                    headers: p.headers,
                    body: p.body,
                },
                Err(NotSent::Request(e)) => return Err(e),
                Err(NotSent::Deployment(failure, why)) => {
                    if let Some(a) = attempt {
                        a.end(failure.label(), None);
                    }
                    log::warn!(
                        "deployment {} cannot be used: {why} (request {request_id})",
                        target.label()
                    );
                    state.routing.attempted(target, Verdict::Failed(failure));
                    state.routing.failed(target, failure, None, request_id);
                    last_failure = Some(failure);
                    continue;
                }
            }
        };
        if let Some(a) = &attempt {
            // The provider's work joins the trace; the client's own trace headers never pass.
            req.headers.extend(a.headers());
        }
        let outstanding = target.health.begin();
        match Box::pin(state.upstreams.start(&req)).await {
            Ok(mut ex) => {
                let status = ex.status();
                let (verdict, prefetched) = if direct {
                    (Verdict::of_status(status), None)
                } else {
                    cloud::judge(target.provider.style, &mut ex).await
                };
                state.routing.attempted(target, verdict);
                let refused = verdict == Verdict::Failed(Failure::Credential);
                if status == 401 {
                    // A token refused before its end (revoked): the next request mints anew.
                    if let StyleAccess::Vertex(access) = &target.provider.access {
                        state.google_tokens.forget(access);
                    }
                }
                let Verdict::Failed(failure) = verdict else {
                    if let Some(t) = trace {
                        t.answered_by(target);
                    }
                    return Ok(Answer {
                        ex,
                        target: target.clone(),
                        crossing,
                        scores: true,
                        refused,
                        prefetched,
                        _outstanding: outstanding,
                        attempt,
                    });
                };
                let wait = retry_after(status, ex.header());
                state.routing.failed(target, failure, wait, request_id);
                let last = i + 1 == targets.len() || started.elapsed() >= attempts.deadline;
                if !last {
                    if prefetched.is_none() {
                        let _ = ex.read_all(ERROR_BODY_LIMIT).await;
                    }
                    state.upstreams.finish(ex).await;
                    if let Some(a) = attempt {
                        a.end(failure.label(), Some(status));
                    }
                    last_failure = Some(failure);
                    log::warn!(
                        "deployment {} answered {status}; failing over (request {request_id})",
                        target.label()
                    );
                    continue;
                }
                // The last one's answer is passed on (a refused credential becomes
                // `provider_auth_failed` in `forward`).
                if let Some(t) = trace {
                    t.answered_by(target);
                }
                return Ok(Answer {
                    ex,
                    target: target.clone(),
                    crossing,
                    scores: false,
                    refused,
                    prefetched,
                    _outstanding: outstanding,
                    attempt,
                });
            }
            Err(e) => {
                let Some(failure) = Failure::of_error(&e) else {
                    if let Some(a) = attempt {
                        a.end("request_error", None);
                    }
                    log::error!("request {request_id} cannot be sent upstream: {e}");
                    return Err(ApiError::ServerError);
                };
                if let Some(a) = attempt {
                    a.end(failure.label(), None);
                }
                log::warn!(
                    "deployment {} failed: {e} (request {request_id})",
                    target.label()
                );
                state.routing.attempted(target, Verdict::Failed(failure));
                state.routing.failed(target, failure, None, request_id);
                last_failure = Some(failure);
            }
        }
    }
    Err(match last_failure {
        // No answer to pass on (a cloud's token could not be had): the operator's credential.
        Some(Failure::Credential) => ApiError::ProviderAuthFailed,
        Some(f) => ApiError::RouteFailed(f.describe().into()),
        None => ApiError::RoutingUnavailable,
    })
}

/// The client's response header: the provider's headers that pass
/// [`sanitize::client_header_name`], the gateway's request id and rate-limit headers. A
/// translated answer gets `content_type` (and, when held whole, `content_length`) in place of
/// the provider's, whose body it no longer describes.
///
/// Built as a plain `http` header map and handed to Pingora whole: Pingora's own
/// `insert_header`/`append_header` turn every name into a title-cased copy and parse it back,
/// two allocations per header that is not a standard one (all 13 of the gateway's own). Without
/// a case map Pingora writes the names as they are, as it did for `build_no_case`.
fn client_header(
    up: &crate::http1::Fields,
    status: u16,
    content_type: Option<&str>,
    content_length: Option<usize>,
    reply: &Reply<'_>,
) -> Option<Box<ResponseHeader>> {
    use http::header::{CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING};
    let (mut parts, ()) = http::Response::new(()).into_parts();
    parts.status = http::StatusCode::from_u16(status).ok()?;
    // The rate-limit headers first: the map comes with their names already hashed.
    parts.headers = crate::rate_headers::map(reply.rate);
    let headers = &mut parts.headers;
    for (name, value) in up.iter() {
        let replaced = content_type.is_some() && name.eq_ignore_ascii_case(b"content-type");
        if let Some(name) = sanitize::client_header_name(name).filter(|_| !replaced) {
            if let Some(value) = up.header_value(value) {
                headers.append(name, value);
            }
        }
    }
    if let Some(ct) = content_type {
        headers.insert(CONTENT_TYPE, http::HeaderValue::from_str(ct).ok()?);
    }
    match content_length {
        Some(n) => {
            headers.insert(CONTENT_LENGTH, respond::content_length(n));
        }
        // Relayed as it arrives: chunked, so the connection stays reusable (without a length
        // or chunking, HTTP/1.1 can only end the body by closing the connection).
        None if !matches!(status, 204 | 304) => {
            headers.insert(TRANSFER_ENCODING, http::HeaderValue::from_static("chunked"));
        }
        None => {}
    }
    headers.insert(
        respond::X_REQUEST_ID,
        http::HeaderValue::from_str(reply.request_id).ok()?,
    );
    if reply.style_b {
        respond::add_style_b(headers, reply.rate, reply.request_id);
    }
    Some(Box::new(ResponseHeader::from(parts)))
}

/// Most bytes merged into one write to the client.
const COALESCE_LIMIT: usize = 64 * 1024;
/// Most pieces of the provider's answer read for one write to the client.
const COALESCE_READS: usize = 256;

/// What followed the chunks [`coalesce`] merged.
enum After {
    /// The provider's body goes on.
    Open,
    /// The provider's body ended.
    End,
    /// Reading the provider's body failed.
    Failed(UpstreamError),
}

/// The client's bytes for `first` and for every further provider chunk that has already
/// arrived (up to [`COALESCE_LIMIT`]), so they go out in one write: a provider typically sends
/// each stream event as its own HTTP chunk, and Pingora flushes every chunk written, which cost
/// a `send` (and a wake-up of the client) per event. Only data already received is merged:
/// nothing waits, so streaming latency is unchanged.
fn coalesce(
    ex: &mut Exchange,
    shaper: &mut Shaper,
    mut tracker: Option<&mut StreamUsageTracker>,
    first: Bytes,
) -> (Bytes, After) {
    let out = shaper.feed(first, tracker.as_deref_mut());
    let mut merged: Option<BytesMut> = None;
    let mut after = After::Open;
    let mut reads = 0;
    // Bounded in reads too: pieces that shape to nothing (comments, keep-alives) would
    // otherwise keep this loop, which never yields, going as long as the provider sends.
    while merged.as_ref().map_or(out.len(), BytesMut::len) < COALESCE_LIMIT
        && reads < COALESCE_READS
    {
        reads += 1;
        match ex.ready_chunk() {
            None => break,
            Some(Ok(Some(more))) => {
                let shaped = shaper.feed(more, tracker.as_deref_mut());
                if !shaped.is_empty() {
                    merged
                        .get_or_insert_with(|| BytesMut::from(&out[..]))
                        .extend_from_slice(&shaped);
                }
            }
            Some(Ok(None)) => {
                after = After::End;
                break;
            }
            Some(Err(e)) => {
                after = After::Failed(e);
                break;
            }
        }
    }
    (merged.map_or(out, BytesMut::freeze), after)
}

/// The next write is the last before the chunked answer's terminator, which `forward` writes
/// without waiting on anything else: its bytes wait in the client's write buffer and leave with
/// the terminator, one send instead of two ([`crate::affinity::hold_next_flush`]).
fn end_follows(session: &Session) {
    if let Some(stream) = session.stream() {
        crate::affinity::hold_next_flush(stream);
    }
}

/// The provider's `content-length`, when its body is length-delimited (not chunked).
fn relayed_length(ex: &Exchange) -> Option<usize> {
    let h = ex.header();
    if h.contains_key("transfer-encoding") {
        return None;
    }
    h.get("content-length")?.to_str().ok()?.trim().parse().ok()
}

fn content_type(ex: &Exchange) -> Option<&str> {
    ex.header()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
}

/// How the answer to the client is dressed: its request id, its error style, extra headers
/// (rate-limit information).
pub struct Reply<'a> {
    pub request_id: &'a str,
    pub style_b: bool,
    pub rate: &'a gateway_core::quota::RateView,
    /// The request's spans, when telemetry is on.
    pub trace: Option<&'a crate::trace::RequestTrace>,
}

/// Forwards `adm` to the first target that answers and relays the response. The steps: find a
/// deployment that answers ([`connect`]), turn away a refused credential, send the client's
/// header unless the answer is held, relay the body, hand over what the client is still owed,
/// then close both sides and say how it ended.
pub async fn forward(
    state: &SharedApiState,
    session: &mut Session,
    adm: &Admitted,
    attempts: &Attempts,
    flight: &mut InFlight,
    reply: &Reply<'_>,
) -> Result<Outcome, ApiError> {
    if attempts.targets.is_empty() {
        return Err(ApiError::RoutingUnavailable);
    }
    let mut answer = Box::pin(connect(
        state,
        session,
        adm,
        attempts,
        reply.request_id,
        reply.trace,
    ))
    .await?;
    let Some(attempt) = answer.attempt.take() else {
        return relay_answer(state, session, adm, answer, flight, reply).await;
    };
    let status = answer.ex.status();
    let result = relay_answer(state, session, adm, answer, flight, reply).await;
    let outcome = match &result {
        Ok(o) => o.error_code.unwrap_or("complete"),
        Err(e) => e.code(),
    };
    attempt.end(outcome, Some(status));
    result
}

/// Relays the answer `connect` found: see [`forward`].
async fn relay_answer(
    state: &SharedApiState,
    session: &mut Session,
    adm: &Admitted,
    answer: Answer,
    flight: &mut InFlight,
    reply: &Reply<'_>,
) -> Result<Outcome, ApiError> {
    flight.set_deployment(answer.target.label());
    if answer.refused {
        return Err(refused(state, answer).await);
    }
    let mut relay = Relay::new(state, adm, reply, answer, flight);

    session.set_abort_on_close(true);
    if let Err(early) = relay.send_header(session, flight).await {
        return relay.give_up(early).await;
    }
    let reason = relay.pump(session, flight).await;

    // The provider's part is over (the count is already down if the last write of a relayed
    // body went out).
    relay.release_deployment();

    relay.deliver_rest(session, flight, reason).await;
    let issued = relay.read_kept_usage(flight, adm.endpoint.generates());
    relay.record_issued(adm, flight, issued);
    Ok(relay.close(session, flight, reason).await)
}

/// A provider refused the operator's credential (401/403): nothing of its answer is relayed,
/// the client gets `provider_auth_failed` with any echo of the credential masked.
async fn refused(state: &SharedApiState, answer: Answer) -> ApiError {
    let Answer {
        mut ex,
        target,
        prefetched,
        ..
    } = answer;
    let status = ex.status();
    let body = match prefetched {
        Some(body) => body,
        None => ex.read_all(ERROR_BODY_LIMIT).await.unwrap_or_default(),
    };
    state.upstreams.finish(ex).await;
    let p = &target.provider;
    sanitize::operator_refused(p, status, &body, &p.api_key_mask)
}

/// Why the relay stopped before the client's header went out.
enum Early {
    /// The header could not be built from the provider's.
    Unbuildable,
    /// The client went away.
    ClientGone,
}

/// One provider answer on its way to the client. The per-request pieces that other owners hold
/// (the session, the in-flight settlement) are passed to each step rather than kept here, so
/// each step says what it touches.
struct Relay<'a> {
    state: &'a SharedApiState,
    reply: &'a Reply<'a>,
    ex: Exchange,
    target: Target,
    /// Whether the answer still counts for the deployment's health (see [`Answer`]).
    scores: bool,
    shaper: Shaper,
    /// The client's status: the provider's, or the translated one of an answer held whole.
    status: u16,
    /// Bytes of a length-delimited relayed body still owed to the client.
    owed: Option<usize>,
    /// Why the provider's answer broke off, when it did.
    cut: Option<Failure>,
    /// The deployment's outstanding count, released as soon as the provider's part is over and
    /// before the write that completes the client's body: a client's next request must find
    /// the count already down, or the choice of two would see load that is not there.
    outstanding: Option<Outstanding>,
}

impl<'a> Relay<'a> {
    /// Sets up the shaping for the client's style and starts watching the stream's usage.
    fn new(
        state: &'a SharedApiState,
        adm: &Admitted,
        reply: &'a Reply<'a>,
        answer: Answer,
        flight: &mut InFlight,
    ) -> Relay<'a> {
        let Answer {
            ex,
            target,
            crossing,
            scores,
            prefetched,
            _outstanding: outstanding,
            ..
        } = answer;
        let status = ex.status();
        let client = ClientSide::of(adm, reply.style_b);
        let mut shaper = match target.provider.style.is_direct() {
            true => Shaper::new(crossing, client, status, content_type(&ex)),
            false => Shaper::with_dialect(
                crossing,
                client,
                status,
                content_type(&ex),
                cloud::dialect(target.provider.style, ex.header()),
            ),
        };
        if let Some(body) = prefetched {
            // Read whole to judge the answer (an error, held whole): what the relay would have
            // fed first.
            shaper.feed(body, None);
        }
        flight.watch_stream(shaper.tracker());
        Relay {
            state,
            reply,
            ex,
            target,
            scores,
            shaper,
            status,
            owed: None,
            cut: None,
            outstanding: Some(outstanding),
        }
    }

    /// Writes the client's header now, unless the answer is held whole (then it goes out with
    /// the body in [`Relay::deliver_rest`]).
    async fn send_header(
        &mut self,
        session: &mut Session,
        flight: &mut InFlight,
    ) -> Result<(), Early> {
        if self.shaper.holds_header() {
            return Ok(());
        }
        // A body relayed byte for byte keeps the provider's length: Pingora then sends the
        // header and the whole body in one write, with no chunk framing.
        let length = if self.shaper.is_plain() {
            relayed_length(&self.ex)
        } else {
            None
        };
        self.owed = length;
        let header = client_header(
            self.ex.header(),
            self.status,
            self.shaper.content_type(),
            length,
            self.reply,
        );
        let header = header.ok_or(Early::Unbuildable)?;
        if session.write_response_header(header).await.is_err() {
            return Err(Early::ClientGone);
        }
        flight.mark_first_byte();
        Ok(())
    }

    /// Ends a relay that stopped before its header went out.
    async fn give_up(self, early: Early) -> Result<Outcome, ApiError> {
        self.state.upstreams.abort(self.ex).await;
        match early {
            Early::Unbuildable => Err(ApiError::ServerError),
            Early::ClientGone => Ok(Outcome {
                status: self.status,
                reason: Reason::ClientDisconnect,
                error_code: None,
            }),
        }
    }

    /// Relays the provider's body until it ends, breaks off, the client leaves, or the shutdown
    /// drain runs out; the client is watched all along so an abort is seen at once.
    async fn pump(&mut self, session: &mut Session, flight: &mut InFlight) -> Reason {
        let drain_cut = crate::settle::drain_cut();
        tokio::pin!(drain_cut);
        loop {
            tokio::select! {
                chunk = self.ex.next_chunk() => {
                    if let Some(reason) = self.pass_on(session, flight, chunk).await {
                        return reason;
                    }
                }
                gone = session.read_body_or_idle(true) => {
                    if gone.is_err() {
                        return Reason::ClientDisconnect;
                    }
                }
                () = &mut drain_cut => return Reason::Aborted,
            }
        }
    }

    /// Passes one provider chunk, with whatever has already arrived behind it, to the client.
    /// Returns how the relay ends when this chunk ends it.
    async fn pass_on(
        &mut self,
        session: &mut Session,
        flight: &mut InFlight,
        chunk: Result<Option<Bytes>, UpstreamError>,
    ) -> Option<Reason> {
        let (out, after) = match chunk {
            Ok(Some(bytes)) => {
                coalesce(&mut self.ex, &mut self.shaper, flight.tracker_mut(), bytes)
            }
            Ok(None) => (Bytes::new(), After::End),
            Err(e) => (Bytes::new(), After::Failed(e)),
        };
        if !out.is_empty() {
            let sent = out.len();
            if matches!(after, After::End) && self.owed.is_none() {
                end_follows(session);
            }
            if matches!(after, After::End) || self.owed.is_some_and(|left| left <= sent) {
                self.release_deployment();
            }
            if session.write_response_body(out, false).await.is_err() {
                return Some(Reason::ClientDisconnect);
            }
            if let Some(left) = self.owed.as_mut() {
                *left = left.saturating_sub(sent);
                if *left == 0 {
                    // All of it is with the client: done, without waiting for the provider's
                    // end-of-body (the connection is pooled only if its body was read to the
                    // end).
                    return Some(Reason::Complete);
                }
            }
        }
        match after {
            After::Open => None,
            After::End => Some(Reason::Complete),
            After::Failed(e) => {
                log::warn!(
                    "deployment {} failed mid-response: {e} (request {})",
                    self.target.label(),
                    self.reply.request_id
                );
                self.cut = Failure::of_error(&e);
                Some(Reason::UpstreamError)
            }
        }
    }

    /// Ends the deployment's share of this request in its outstanding count (once).
    fn release_deployment(&mut self) {
        self.outstanding = None;
    }

    /// What the client is still owed once the provider's part is over: the held answer whole
    /// (header and body, credential echoes masked), or the end of the stream.
    async fn deliver_rest(&mut self, session: &mut Session, flight: &mut InFlight, reason: Reason) {
        let client_here = reason != Reason::ClientDisconnect;
        if self.shaper.holds_header() && client_here {
            let (client_status, body) = self.shaper.whole(reason);
            let body = match client_status {
                400.. => sanitize::mask_credential(body, &self.target.provider.api_key_mask),
                _ => body,
            };
            self.status = client_status;
            let header = client_header(
                self.ex.header(),
                self.status,
                self.shaper.content_type(),
                Some(body.len()),
                self.reply,
            );
            if let Some(header) = header {
                if session.write_response_header(header).await.is_ok() {
                    flight.mark_first_byte();
                    let _ = session.write_response_body(body, false).await;
                }
            }
        } else if !self.shaper.holds_header() {
            let tail = self.shaper.end(reason, flight.tracker_mut());
            if client_here && !tail.is_empty() {
                if reason == Reason::Complete {
                    end_follows(session);
                }
                let _ = session.write_response_body(tail, false).await;
            }
        }
    }

    /// Reads the usage of an answer whose provider body was kept (a non-stream answer; a stream's
    /// usage was watched on the way), and the ids of a Responses answer with it.
    fn read_kept_usage(&self, flight: &mut InFlight, generates: bool) -> Issued {
        match self.shaper.provider_body() {
            Some(body) => {
                let kind = self.shaper.usage_kind().unwrap_or(StreamKind::OpenAiChat);
                flight.read_whole_answer(kind, body, generates)
            }
            None => Issued::default(),
        }
    }

    /// Records for the account the Responses ids its answer carried (a provider's, read from
    /// its body or stream, or the items of a translated answer), unless the request said
    /// `store: false` or the answer was an error. The client already has the answer: a
    /// follow-up it sends at once finds the ids in this instance's cache.
    fn record_issued(&mut self, adm: &Admitted, flight: &mut InFlight, mut issued: Issued) {
        if !adm.keeps_answer() || self.status >= 400 {
            return;
        }
        if let Some(t) = flight.tracker_mut() {
            issued.ids.extend(t.take_issued().ids);
        }
        issued.ids.extend(self.shaper.take_issued().ids);
        self.state.items.record(&adm.identity.user.id, issued);
    }

    /// Closes both sides according to how the relay ended: the provider's connection is pooled
    /// only after a complete answer, the deployment is scored, and the client's answer is ended
    /// (or, for a cut plain body, its connection closed). Says how the request ended, for
    /// settlement.
    async fn close(self, session: &mut Session, flight: &mut InFlight, reason: Reason) -> Outcome {
        let (state, request_id) = (self.state, self.reply.request_id);
        let (reason, error_code) = match reason {
            Reason::Complete => {
                if self.scores {
                    state.routing.succeeded(&self.target, request_id);
                }
                state.upstreams.finish(self.ex).await;
                let _ = session.write_response_body(Bytes::new(), true).await;
                if self.status >= 400 {
                    (Reason::ProviderError, Some("provider_error"))
                } else {
                    (Reason::Complete, None)
                }
            }
            Reason::UpstreamError => {
                state.upstreams.abort(self.ex).await;
                if let Some(failure) = self.cut.filter(|_| self.scores) {
                    state
                        .routing
                        .failed(&self.target, failure, None, request_id);
                }
                if self.shaper.is_plain() {
                    // A cut plain body cannot be marked as failed in-band: close the connection
                    // so the client sees the truncation.
                    session.shutdown().await;
                } else {
                    let _ = session.write_response_body(Bytes::new(), true).await;
                }
                (Reason::UpstreamError, Some("upstream_error"))
            }
            Reason::Aborted => {
                // The shutdown drain ended: the answer was closed with an error (`deliver_rest`).
                state.upstreams.abort(self.ex).await;
                let _ = session.write_response_body(Bytes::new(), true).await;
                (Reason::Aborted, Some("shutting_down"))
            }
            other => {
                state.upstreams.abort(self.ex).await;
                (other, Some("client_disconnect"))
            }
        };
        if self.status >= 400 && reason == Reason::ProviderError {
            // The provider refused before generating: nothing to charge beyond what it reported.
            flight.waive_input_estimate();
        }
        Outcome {
            status: self.status,
            reason,
            error_code,
        }
    }
}
