//! Shaping: how a client endpoint meets a provider style, and the bytes the client gets back.
//!
//! A request reaches a provider in one of several ways ([`Crossing`]), decided per deployment
//! by the protocol the provider speaks ([`Wire`]): in its own protocol (the provider's bytes
//! pass through), as an OpenAI chat request to an Anthropic-protocol provider, as an Anthropic
//! messages request to an OpenAI-protocol provider, as a Responses request to an
//! Anthropic-protocol provider or to an OpenAI-protocol one without `/v1/responses`, or as any
//! of the three to Gemini (through chat completions, see [`gateway_translate::gemini`]). The request body is translated once per crossing, before anything is
//! reserved ([`translate_request`]), so a request the translation refuses costs nothing. The answer is shaped by a [`Shaper`], which
//! `forward` feeds with the provider's chunks and which hands back the client's bytes.
//!
//! Usage is always read from the provider's own events and body, before any translation, so
//! settlement records exactly what the provider reported.

use bytes::{Bytes, BytesMut};
use serde_json::Value;

use crate::cloud::{Dialect, EventStreamReader};
use crate::error::ApiError;
use crate::items;
use crate::pipeline::Admitted;
use crate::respond;
use crate::route::Endpoint;
use crate::routing::Target;
use crate::settle::Reason;
use crate::sse::{SseEvent, SseParser};
use crate::usage::{EventVerdict, StreamKind, StreamUsageTracker};
use gateway_core::config::Provider;
use gateway_core::domain::Wire;
use gateway_core::response_items::Issued;
use gateway_translate::{chat_to_messages, gemini, messages_to_chat, responses};

/// A translated answer is collected whole before it is translated; past this the provider's
/// answer is refused (no chat answer comes near it).
const TRANSLATE_BODY_LIMIT: usize = 16 * 1024 * 1024;
/// A copy of a passed-through JSON body kept to read its usage.
const USAGE_COPY_LIMIT: usize = 16 * 1024 * 1024;

/// What the client is told when the provider's answer breaks off or cannot be translated, in the
/// OpenAI error shape that both translators read like a provider's error.
const CUT_OPENAI: &str = r#"{"error":{"message":"The upstream stream was interrupted.","type":"server_error","code":"upstream_error"}}"#;
const CUT_BODY_OPENAI: &str = r#"{"error":{"message":"The upstream response was interrupted.","type":"server_error","code":"upstream_error"}}"#;
const TOO_LARGE_OPENAI: &str = r#"{"error":{"message":"The provider's answer was too large to translate.","type":"server_error"}}"#;

/// How a client endpoint is served by a provider of a given style.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crossing {
    /// Same style: the request and the answer pass through.
    Native,
    /// An OpenAI chat-completions client on an Anthropic-style provider (`/v1/messages`).
    ChatToMessages,
    /// An Anthropic messages client on an OpenAI-style provider (`/v1/chat/completions`).
    MessagesToChat,
    /// A Responses client on an Anthropic-style provider (`/v1/messages`).
    ResponsesToMessages,
    /// A Responses client on an OpenAI-style provider without `/v1/responses`
    /// (`/v1/chat/completions`).
    ResponsesToChat,
    /// An OpenAI chat client on Gemini (`generateContent`).
    ChatToGemini,
    /// An Anthropic messages client on Gemini, through chat completions.
    MessagesToGemini,
    /// A Responses client on Gemini, through chat completions.
    ResponsesToGemini,
}

impl Crossing {
    /// How `provider` serves `endpoint`, or `None` when it cannot: Anthropic-protocol
    /// providers have no embeddings, images or speech, OpenAI-protocol providers no token
    /// counting (the gateway counts locally for those models instead), Gemini serves the three
    /// generating endpoints only, and the cloud styles no tools.
    pub fn of(endpoint: Endpoint, provider: &Provider) -> Option<Crossing> {
        use Endpoint as E;
        match (provider.style.wire(), endpoint) {
            (Wire::Anthropic, E::ChatCompletions) => Some(Crossing::ChatToMessages),
            (Wire::Anthropic, E::Responses) => Some(Crossing::ResponsesToMessages),
            (Wire::Anthropic, E::Embeddings | E::Images | E::Speech) => None,
            (Wire::OpenAi, E::Messages) => Some(Crossing::MessagesToChat),
            (Wire::OpenAi, E::Responses) if !provider.serves_responses => {
                Some(Crossing::ResponsesToChat)
            }
            (Wire::OpenAi, E::CountTokens) => None,
            (Wire::Gemini, E::ChatCompletions) => Some(Crossing::ChatToGemini),
            (Wire::Gemini, E::Messages) => Some(Crossing::MessagesToGemini),
            (Wire::Gemini, E::Responses) => Some(Crossing::ResponsesToGemini),
            (Wire::Gemini, _) => None,
            (_, E::CountTokens | E::Search | E::WebFetch) if !provider.style.is_direct() => None,
            _ => Some(Crossing::Native),
        }
    }

    /// The provider endpoint a request for the client's `endpoint` is sent to. Gemini's
    /// `generateContent` has no endpoint of the gateway's own: it is reached through chat
    /// completions, whose place it takes.
    pub fn provider_endpoint(self, endpoint: Endpoint) -> Endpoint {
        match self {
            Crossing::Native => endpoint,
            Crossing::ChatToMessages | Crossing::ResponsesToMessages => Endpoint::Messages,
            Crossing::MessagesToChat
            | Crossing::ResponsesToChat
            | Crossing::ChatToGemini
            | Crossing::MessagesToGemini
            | Crossing::ResponsesToGemini => Endpoint::ChatCompletions,
        }
    }

    /// The protocol the provider's answer speaks, for reading its usage.
    fn usage_kind(self, endpoint: Endpoint) -> Option<StreamKind> {
        match self {
            Crossing::ChatToGemini | Crossing::MessagesToGemini | Crossing::ResponsesToGemini => {
                Some(StreamKind::Gemini)
            }
            _ => usage_kind(self.provider_endpoint(endpoint)),
        }
    }

    /// True when the provider speaks Gemini's protocol.
    fn to_gemini(self) -> bool {
        matches!(
            self,
            Crossing::ChatToGemini | Crossing::MessagesToGemini | Crossing::ResponsesToGemini
        )
    }
}

/// The client's request translated for each crossing its deployments need (at most two: a
/// Responses request may go to Anthropic-style and chat-only deployments of one model).
#[derive(Debug, Default)]
pub struct Translated(Vec<(Crossing, Value)>);

impl Translated {
    pub fn none() -> Translated {
        Translated(Vec::new())
    }

    /// The body for `crossing`, translated with the client's model name.
    pub fn get(&self, crossing: Crossing) -> Option<&Value> {
        self.0.iter().find(|(c, _)| *c == crossing).map(|(_, v)| v)
    }
}

/// The protocol the provider's answer speaks, for reading its usage.
fn usage_kind(endpoint: Endpoint) -> Option<StreamKind> {
    match endpoint {
        Endpoint::ChatCompletions => Some(StreamKind::OpenAiChat),
        Endpoint::Responses => Some(StreamKind::OpenAiResponses),
        Endpoint::Messages => Some(StreamKind::Anthropic),
        _ => None,
    }
}

/// Translates the client's body for the targets of another style, once per crossing. Runs
/// before the reservation: a body the translation refuses is a 400 `invalid_request` that costs
/// nothing. Empty when every target speaks the client's style. The `model` of a result is the
/// client's; `forward` replaces it with each deployment's upstream name.
pub fn translate_request(adm: &Admitted, targets: &[Target]) -> Result<Translated, ApiError> {
    let mut out = Translated::none();
    for crossing in targets
        .iter()
        .filter_map(|t| Crossing::of(adm.endpoint, &t.provider))
    {
        if crossing == Crossing::Native || out.get(crossing).is_some() {
            continue;
        }
        let tree = adm.tree_for_rewrite()?;
        let json = tree.as_ref();
        // Anthropic requires max_tokens: the reserve already holds the requested or default
        // output, capped by the key's and the context's limits.
        let default_max = match adm.output_reserve {
            0 => adm
                .model
                .as_ref()
                .map(|m| m.default_output_tokens)
                .unwrap_or(1),
            n => n,
        }
        .max(1);
        let model = &adm.model_name;
        let translated = match crossing {
            Crossing::Native => continue,
            Crossing::ChatToMessages => chat_to_messages::request(json, model, default_max),
            Crossing::MessagesToChat => messages_to_chat::request(json, model),
            Crossing::ResponsesToMessages => responses::to_messages(json, model, default_max),
            Crossing::ResponsesToChat => responses::to_chat(json, model, false),
            Crossing::ChatToGemini => gemini::request(json),
            Crossing::MessagesToGemini => {
                messages_to_chat::request(json, model).and_then(|chat| gemini::request(&chat))
            }
            Crossing::ResponsesToGemini => {
                responses::to_chat(json, model, false).and_then(|chat| gemini::request(&chat))
            }
        };
        let translated =
            translated.map_err(|e| ApiError::invalid("invalid_request", e.to_string()))?;
        out.0.push((crossing, translated));
    }
    Ok(out)
}

/// The client's side of an exchange: what it called and how it wants the answer.
#[derive(Debug, Clone, Copy)]
pub struct ClientSide<'a> {
    pub endpoint: Endpoint,
    /// The model name the client sent, echoed in translated answers.
    pub model: &'a str,
    /// OpenAI chat: the client's `stream_options.include_usage`.
    pub wants_usage: bool,
    /// Style B: the gateway's own error frames are Anthropic-shaped.
    pub style_b: bool,
    /// Responses without `store: false`: a translated answer's output items are kept.
    pub keep_items: bool,
}

impl<'a> ClientSide<'a> {
    pub fn of(adm: &'a Admitted, style_b: bool) -> Self {
        ClientSide {
            endpoint: adm.endpoint,
            model: &adm.model_name,
            wants_usage: adm.client_wants_usage,
            style_b,
            keep_items: adm.keeps_answer(),
        }
    }
}

/// What happens to each event of a streamed answer.
enum Shape {
    /// Same style: the provider's bytes unchanged, except, when `drop_usage_only`, the usage-only
    /// chat chunk the gateway asked for and the client did not.
    Passthrough { drop_usage_only: bool },
    /// Anthropic events to OpenAI `chat.completion.chunk`s.
    ChatFromMessages(Box<chat_to_messages::StreamTranslator>),
    /// OpenAI chat chunks to Anthropic events.
    MessagesFromChat(Box<messages_to_chat::StreamTranslator>),
    /// Anthropic events to Responses events.
    ResponsesFromMessages(Box<responses::MessagesStream>),
    /// OpenAI chat chunks to Responses events.
    ResponsesFromChat(Box<responses::ChatStream>),
    /// Same protocol, other framing (Bedrock's event stream): each event written as SSE.
    Relay,
    /// Gemini events to OpenAI `chat.completion.chunk`s.
    ChatFromGemini(Box<gemini::StreamTranslator>),
    /// Gemini events to Anthropic events, through chat chunks.
    MessagesFromGemini(Box<(gemini::StreamTranslator, messages_to_chat::StreamTranslator)>),
    /// Gemini events to Responses events, through chat chunks.
    ResponsesFromGemini(Box<(gemini::StreamTranslator, responses::ChatStream)>),
}

impl Shape {
    /// Appends the client's bytes for one provider event.
    fn event(&mut self, ev: &SseEvent, verdict: EventVerdict, out: &mut BytesMut) {
        let frames = match self {
            Shape::Passthrough { drop_usage_only } => {
                if !*drop_usage_only || verdict == EventVerdict::Forward {
                    out.extend_from_slice(&ev.raw);
                }
                return;
            }
            Shape::Relay => {
                out.extend_from_slice(&ev.raw);
                return;
            }
            // Comment-only blocks (keep-alives) carry no data and mean nothing to the client.
            _ if ev.data.is_empty() => return,
            Shape::ChatFromMessages(t) => t.on_event(ev.event.as_deref(), &ev.data),
            Shape::MessagesFromChat(t) => t.on_event(ev.event.as_deref(), &ev.data),
            Shape::ResponsesFromMessages(t) => t.on_event(ev.event.as_deref(), &ev.data),
            Shape::ResponsesFromChat(t) => t.on_event(ev.event.as_deref(), &ev.data),
            Shape::ChatFromGemini(t) => t.on_event_frames(&ev.data),
            Shape::MessagesFromGemini(t) => {
                let (g, m) = &mut **t;
                through_chat(g.on_event(&ev.data), |c| m.on_event(None, c))
            }
            Shape::ResponsesFromGemini(t) => {
                let (g, r) = &mut **t;
                through_chat(g.on_event(&ev.data), |c| r.on_event(None, c))
            }
        };
        frames.iter().for_each(|f| out.extend_from_slice(f));
    }

    /// Ends the stream, once: a translated stream is always finished well-formed. When the
    /// provider cut it, the client is told first, in its style: OpenAI clients get the gateway's
    /// error frame before the final `[DONE]`, Anthropic clients an `error` event, after which
    /// Anthropic streams send nothing more. A stream the provider had already ended gets nothing.
    fn end(&mut self, cut: bool, style_b: bool, out: &mut BytesMut) {
        let frames = match self {
            Shape::Passthrough { .. } | Shape::Relay => {
                if cut {
                    out.extend_from_slice(&cut_frame(style_b));
                }
                return;
            }
            Shape::ChatFromGemini(t) => {
                let tail = t.finish_frames();
                if (cut || !t.finished()) && !tail.is_empty() {
                    out.extend_from_slice(&cut_frame(false));
                }
                tail
            }
            // A chained translation ends the way the provider's stream did: complete when
            // Gemini said why it finished, else as cut.
            Shape::MessagesFromGemini(t) => {
                let (g, m) = &mut **t;
                let cut = cut || !g.finished();
                let mut frames = through_chat(g.finish(), |c| m.on_event(None, c));
                if cut {
                    frames.extend(m.on_event(None, CUT_OPENAI));
                    frames.extend(m.finish());
                } else {
                    frames.extend(m.on_event(None, "[DONE]"));
                }
                frames
            }
            Shape::ResponsesFromGemini(t) => {
                let (g, r) = &mut **t;
                let cut = cut || !g.finished();
                let mut frames = through_chat(g.finish(), |c| r.on_event(None, c));
                frames.extend(r.finish(cut));
                frames
            }
            Shape::ChatFromMessages(t) => {
                let tail = t.finish();
                if cut && !tail.is_empty() {
                    out.extend_from_slice(&cut_frame(false));
                }
                tail
            }
            Shape::MessagesFromChat(t) => {
                let mut frames = match cut {
                    true => t.on_event(None, CUT_OPENAI),
                    false => Vec::new(),
                };
                frames.extend(t.finish());
                frames
            }
            // A Responses client learns of a cut from `response.failed`.
            Shape::ResponsesFromMessages(t) => t.finish(cut),
            Shape::ResponsesFromChat(t) => t.finish(cut),
        };
        frames.iter().for_each(|f| out.extend_from_slice(f));
    }
}

/// Feeds chat chunks made by one translation to the next.
fn through_chat(chunks: Vec<Value>, mut next: impl FnMut(&str) -> Vec<Bytes>) -> Vec<Bytes> {
    chunks.iter().flat_map(|c| next(&c.to_string())).collect()
}

/// How a stream's bytes are cut into events.
enum Framing {
    /// Server-sent events (every provider but Bedrock).
    Sse(SseParser),
    /// AWS event-stream messages (Bedrock's streamed answers).
    Aws(Box<EventStreamReader>),
}

impl Framing {
    fn feed(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        match self {
            Framing::Sse(p) => p.feed(chunk),
            Framing::Aws(r) => r.feed(chunk),
        }
    }

    fn finish(&mut self) -> Option<SseEvent> {
        match self {
            Framing::Sse(p) => p.finish(),
            Framing::Aws(r) => r.finish(),
        }
    }
}

/// How the provider's body is read.
enum Body {
    /// Events, parsed and shaped one by one.
    Events(Framing, Shape),
    /// Relayed as it comes; `copy` keeps (up to a cap) a successful JSON answer to read its usage.
    Plain { copy: Option<Vec<u8>> },
    /// A translated non-stream answer, or any provider error: collected whole, translated (or,
    /// same style, handed back as it came) at the end.
    Whole(Vec<u8>),
}

/// Turns one provider response into the client's bytes. Created once the provider's response
/// header is in; `forward` feeds it every body chunk and then ends it exactly once.
pub struct Shaper {
    crossing: Crossing,
    /// How a cloud provider's errors are written, when not in its protocol's own shape.
    dialect: Option<Dialect>,
    body: Body,
    status: u16,
    kind: Option<StreamKind>,
    client_model: String,
    style_b: bool,
    overflow: bool,
    /// Keep the output items of a translated Responses answer ([`Shaper::take_issued`]).
    keep_items: bool,
    issued: Issued,
}

impl Shaper {
    /// `status` and `content_type` are the provider's.
    pub fn new(
        crossing: Crossing,
        client: ClientSide<'_>,
        status: u16,
        content_type: Option<&str>,
    ) -> Shaper {
        Shaper::with_dialect(crossing, client, status, content_type, None)
    }

    /// [`Shaper::new`] for a provider whose framing or errors are its own ([`Dialect`]).
    pub fn with_dialect(
        crossing: Crossing,
        client: ClientSide<'_>,
        status: u16,
        content_type: Option<&str>,
        dialect: Option<Dialect>,
    ) -> Shaper {
        // Media types are case-insensitive. A byte window, not `str::contains`: that builds a
        // substring searcher on every call.
        let sse = content_type.is_some_and(|v| {
            v.get(..17)
                .is_some_and(|t| t.eq_ignore_ascii_case("text/event-stream"))
        });
        let json = content_type.is_some_and(|v| {
            v.as_bytes()
                .windows(4)
                .any(|w| w.eq_ignore_ascii_case(b"json"))
        });
        let aws_events = matches!(dialect, Some(Dialect::Aws { .. }))
            && content_type.is_some_and(|v| {
                let name = "application/vnd.amazon.eventstream";
                v.get(..name.len())
                    .is_some_and(|t| t.eq_ignore_ascii_case(name))
            });
        let framing = || {
            if aws_events {
                Framing::Aws(Box::default())
            } else {
                Framing::Sse(SseParser::without_raw())
            }
        };
        let provider_endpoint = crossing.provider_endpoint(client.endpoint);
        let body = match crossing {
            // An error is held whole, whatever its content type claims: translated, or (same
            // style) relayed as it is once the caller has masked any echo of the provider's
            // credential in it.
            _ if status >= 400 => Body::Whole(Vec::new()),
            Crossing::Native if aws_events => Body::Events(framing(), Shape::Relay),
            _ if crossing != Crossing::Native && !sse && !aws_events => Body::Whole(Vec::new()),
            Crossing::ChatToMessages => Body::Events(
                framing(),
                Shape::ChatFromMessages(Box::new(chat_to_messages::StreamTranslator::new(
                    client.model,
                    client.wants_usage,
                ))),
            ),
            Crossing::MessagesToChat => Body::Events(
                framing(),
                Shape::MessagesFromChat(Box::new(messages_to_chat::StreamTranslator::new(
                    client.model,
                ))),
            ),
            Crossing::ResponsesToMessages => Body::Events(
                framing(),
                Shape::ResponsesFromMessages(Box::new(responses::MessagesStream::new(
                    client.model,
                ))),
            ),
            Crossing::ResponsesToChat => Body::Events(
                framing(),
                Shape::ResponsesFromChat(Box::new(responses::ChatStream::new(client.model))),
            ),
            Crossing::ChatToGemini => Body::Events(
                framing(),
                Shape::ChatFromGemini(Box::new(gemini::StreamTranslator::new(
                    client.model,
                    client.wants_usage,
                ))),
            ),
            Crossing::MessagesToGemini => Body::Events(
                framing(),
                Shape::MessagesFromGemini(Box::new((
                    gemini::StreamTranslator::new(client.model, true),
                    messages_to_chat::StreamTranslator::new(client.model),
                ))),
            ),
            Crossing::ResponsesToGemini => Body::Events(
                framing(),
                Shape::ResponsesFromGemini(Box::new((
                    gemini::StreamTranslator::new(client.model, true),
                    responses::ChatStream::new(client.model),
                ))),
            ),
            Crossing::Native if sse => {
                let drop_usage_only =
                    provider_endpoint == Endpoint::ChatCompletions && !client.wants_usage;
                // Only dropping needs each event's bytes; otherwise the chunks go out as they came.
                let parser = if drop_usage_only {
                    SseParser::new()
                } else {
                    SseParser::without_raw()
                };
                Body::Events(Framing::Sse(parser), Shape::Passthrough { drop_usage_only })
            }
            Crossing::Native => Body::Plain {
                copy: (json && status < 400).then(Vec::new),
            },
        };
        Shaper {
            crossing,
            dialect,
            body,
            status,
            kind: crossing.usage_kind(client.endpoint),
            client_model: client.model.to_string(),
            style_b: client.style_b,
            overflow: false,
            keep_items: client.keep_items,
            issued: Issued::default(),
        }
    }

    /// The usage observer for a streamed answer, speaking the provider's protocol.
    pub fn tracker(&self) -> Option<StreamUsageTracker> {
        match self.body {
            Body::Events(..) => self.kind.map(StreamUsageTracker::new),
            _ => None,
        }
    }

    /// The content type the client gets in place of the provider's, for translated answers.
    pub fn content_type(&self) -> Option<&'static str> {
        match (&self.body, self.crossing) {
            (Body::Events(Framing::Aws(_), _), _) => Some("text/event-stream"),
            (_, Crossing::Native) => None,
            (Body::Events(..), _) => Some("text/event-stream"),
            _ => Some(respond::JSON),
        }
    }

    /// True when nothing is sent until the provider's body is complete: the response header
    /// (its status and length) is then written by the caller with [`Shaper::whole`].
    pub fn holds_header(&self) -> bool {
        matches!(self.body, Body::Whole(_))
    }

    /// One chunk of the provider's body in, the client's bytes for it out (possibly empty).
    /// Stream events are observed by `tracker` before they are shaped.
    pub fn feed(&mut self, chunk: Bytes, tracker: Option<&mut StreamUsageTracker>) -> Bytes {
        match &mut self.body {
            Body::Events(framing, shape) => {
                let events = framing.feed(&chunk);
                let mut tracker = tracker;
                if let Shape::Passthrough {
                    drop_usage_only: false,
                } = shape
                {
                    if let Some(t) = tracker {
                        events.iter().for_each(|ev| {
                            t.observe(ev);
                        });
                    }
                    return chunk;
                }
                let mut out = BytesMut::new();
                for ev in &events {
                    let verdict = match tracker.as_deref_mut() {
                        Some(t) => t.observe(ev),
                        None => EventVerdict::Forward,
                    };
                    shape.event(ev, verdict, &mut out);
                }
                out.freeze()
            }
            Body::Plain { copy } => {
                if let Some(c) = copy {
                    if c.len() + chunk.len() <= USAGE_COPY_LIMIT {
                        c.extend_from_slice(&chunk);
                    } else {
                        self.overflow = true;
                    }
                }
                chunk
            }
            Body::Whole(buf) => {
                if buf.len() + chunk.len() <= TRANSLATE_BODY_LIMIT {
                    buf.extend_from_slice(&chunk);
                } else {
                    self.overflow = true;
                }
                Bytes::new()
            }
        }
    }

    /// Ends a streamed or relayed answer: what the client is still owed. A stream's unterminated
    /// last event is observed (and, when the stream completed, delivered); a translated stream is
    /// always finished, with an error event first when the provider cut it; a cut passthrough
    /// stream gets an error frame in the client's style. The caller drops the bytes when the
    /// client is gone.
    pub fn end(&mut self, reason: Reason, tracker: Option<&mut StreamUsageTracker>) -> Bytes {
        let Body::Events(framing, shape) = &mut self.body else {
            return Bytes::new();
        };
        let mut out = BytesMut::new();
        if let Some(ev) = framing.finish() {
            let verdict = match tracker {
                Some(t) => t.observe(&ev),
                None => EventVerdict::Forward,
            };
            match shape {
                // Without dropping, the raw bytes of the tail were relayed with their chunk.
                Shape::Passthrough {
                    drop_usage_only: false,
                } => {}
                Shape::Passthrough { .. } if reason != Reason::Complete => {}
                _ => shape.event(&ev, verdict, &mut out),
            }
        }
        let cut = matches!(reason, Reason::UpstreamError | Reason::Aborted);
        shape.end(cut, self.style_b, &mut out);
        if self.keep_items && self.status < 400 {
            let items = match shape {
                Shape::ResponsesFromMessages(t) => t.take_output(),
                Shape::ResponsesFromChat(t) => t.take_output(),
                Shape::ResponsesFromGemini(t) => t.1.take_output(),
                _ => Vec::new(),
            };
            self.issued = items::issued_items(&items);
        }
        out.freeze()
    }

    /// The output items a translated Responses answer issued, for the item registry (empty
    /// for other answers, and when the request said `store: false`).
    pub fn take_issued(&mut self) -> Issued {
        std::mem::take(&mut self.issued)
    }

    /// For a held answer ([`Shaper::holds_header`]): the status and body the client gets. A
    /// complete answer is translated, or as it came when same-style (errors keep the provider's
    /// status); one that broke off,
    /// could not be read or was too large becomes a 502 in the client's error shape.
    pub fn whole(&mut self, reason: Reason) -> (u16, Bytes) {
        if let (Some(dialect), Body::Whole(buf), true) =
            (&self.dialect, &mut self.body, self.status >= 400)
        {
            if let Some(native) = dialect.error_body(self.status, buf) {
                *buf = native;
            }
        }
        let Body::Whole(buf) = &self.body else {
            return (self.status, Bytes::new());
        };
        let (status, answer) = match (reason, self.overflow) {
            // Same style: the provider's error as it came. A chat provider's error is already
            // in the shape Responses clients read.
            (Reason::Complete, false)
                if self.crossing == Crossing::Native
                    || (self.crossing == Crossing::ResponsesToChat && self.status >= 400) =>
            {
                return (self.status, Bytes::copy_from_slice(buf));
            }
            (Reason::Complete, false) if self.status >= 400 => (self.status, self.error(buf)),
            (Reason::Complete, false) => match serde_json::from_slice::<Value>(buf) {
                Ok(v) => {
                    let answer = self.response(&v);
                    if self.keep_items && self.client_endpoint_is_responses() {
                        if let Some(items) = answer.get("output").and_then(Value::as_array) {
                            self.issued = items::issued_items(items);
                        }
                    }
                    (self.status, answer)
                }
                Err(_) => (502, self.error(buf)),
            },
            (Reason::Complete, true) => (502, self.error(TOO_LARGE_OPENAI.as_bytes())),
            _ => (502, self.error(CUT_BODY_OPENAI.as_bytes())),
        };
        (status, Bytes::from(answer.to_string()))
    }

    fn client_endpoint_is_responses(&self) -> bool {
        matches!(
            self.crossing,
            Crossing::ResponsesToMessages | Crossing::ResponsesToChat | Crossing::ResponsesToGemini
        )
    }

    fn response(&self, v: &Value) -> Value {
        let model = &self.client_model;
        match self.crossing {
            Crossing::MessagesToChat => messages_to_chat::response(v, model),
            Crossing::ResponsesToMessages => responses::from_messages(v, model),
            Crossing::ResponsesToChat => responses::from_chat(v, model),
            Crossing::ChatToGemini => gemini::response(v, model),
            Crossing::MessagesToGemini => {
                messages_to_chat::response(&gemini::response(v, model), model)
            }
            Crossing::ResponsesToGemini => responses::from_chat(&gemini::response(v, model), model),
            _ => chat_to_messages::response(v, model),
        }
    }

    /// The client-style error for a provider error body. The translators accept the other
    /// style's shapes and plain text, so the gateway's own messages are written OpenAI-style;
    /// Google's errors are read by the Gemini translation first.
    fn error(&self, body: &[u8]) -> Value {
        if self.crossing.to_gemini() && !is_gateway_message(body) {
            let openai = gemini::error(body);
            return match self.crossing {
                Crossing::MessagesToGemini => {
                    messages_to_chat::error(openai.to_string().as_bytes())
                }
                _ => openai,
            };
        }
        match self.crossing {
            Crossing::MessagesToChat | Crossing::MessagesToGemini => messages_to_chat::error(body),
            Crossing::Native if self.style_b => messages_to_chat::error(body),
            _ => chat_to_messages::error(body),
        }
    }

    /// The provider's successful non-stream answer as it came (its first 16 MiB), to read usage
    /// from; `None` for streams and errors.
    pub fn provider_body(&self) -> Option<&[u8]> {
        if self.status >= 400 {
            return None;
        }
        match &self.body {
            Body::Plain { copy: Some(c) } => Some(c),
            Body::Whole(buf) => Some(buf),
            _ => None,
        }
    }

    /// The provider's protocol, for reading usage out of [`Shaper::provider_body`].
    pub fn usage_kind(&self) -> Option<StreamKind> {
        self.kind
    }

    /// True for a relayed (untranslated, unparsed) body: a cut one cannot be marked as failed
    /// in-band, so the caller closes the connection instead.
    pub fn is_plain(&self) -> bool {
        matches!(self.body, Body::Plain { .. })
    }
}

/// True for the gateway's own error bodies (already OpenAI-shaped), as opposed to a provider's.
fn is_gateway_message(body: &[u8]) -> bool {
    [CUT_BODY_OPENAI, TOO_LARGE_OPENAI]
        .iter()
        .any(|m| m.as_bytes() == body)
}

/// An SSE error event in the client's style, sent when a passed-through stream breaks off so the
/// client sees an error rather than a silently short answer.
fn cut_frame(style_b: bool) -> Bytes {
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

#[cfg(test)]
mod tests;
