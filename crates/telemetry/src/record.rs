//! A finished span as plain data: what the request threads hand to the export thread.
//!
//! A request's spans are filled in as it goes (ids, times, static names, the few ids and
//! names it owns) and handed over whole when each ends; the export thread writes the wire
//! format from them ([`crate::wire`]). Building them through the SDK's tracer instead (its
//! span builder, the sampler behind a trait object, a span wrapping its data and its tracer,
//! an owned `KeyValue` per attribute, one queue hand-off per span to the batch processor) put
//! most of what tracing costs on the request threads, and the export thread then spent as much
//! again taking the SDK's spans apart. The SDK's types are still what the OTLP exporters of
//! `opentelemetry-otlp` take: [`SpanRecord::to_span_data`] converts a record for the JSON and
//! gRPC exports, and the tests hold the protobuf written here to the library's own conversion
//! of that.

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::trace::{
    Event, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};

/// An attribute's value, in the shapes the gateway records.
#[derive(Debug, Clone, PartialEq)]
pub enum Attr {
    Static(&'static str),
    Text(String),
    /// Text copied into the span's own buffer ([`SpanRecord::set_str`]): the bytes from `.0` to `.1` of
    /// [`SpanRecord::text`].
    Held(u32, u32),
    Int(i64),
    Bool(bool),
    Texts(Vec<String>),
}

impl From<&'static str> for Attr {
    fn from(s: &'static str) -> Self {
        Attr::Static(s)
    }
}

impl From<String> for Attr {
    fn from(s: String) -> Self {
        Attr::Text(s)
    }
}

impl From<i64> for Attr {
    fn from(i: i64) -> Self {
        Attr::Int(i)
    }
}

impl From<bool> for Attr {
    fn from(b: bool) -> Self {
        Attr::Bool(b)
    }
}

impl From<Vec<String>> for Attr {
    fn from(v: Vec<String>) -> Self {
        Attr::Texts(v)
    }
}

impl Attr {
    /// The SDK's value for the same attribute of a span whose buffer is `held`.
    pub fn to_value(&self, held: &str) -> Value {
        match self {
            Attr::Static(s) => Value::from(*s),
            Attr::Text(s) => Value::from(s.clone()),
            Attr::Held(..) => Value::from(self.held_text(held).to_owned()),
            Attr::Int(i) => Value::I64(*i),
            Attr::Bool(b) => Value::Bool(*b),
            Attr::Texts(v) => Value::Array(Array::String(
                v.iter().cloned().map(StringValue::from).collect(),
            )),
        }
    }

    /// The text of a `Held` value in the span's buffer `held` (empty for any other value, and
    /// for a range the buffer does not hold).
    pub fn held_text<'a>(&self, held: &'a str) -> &'a str {
        match self {
            Attr::Held(from, to) => held.get(*from as usize..*to as usize).unwrap_or_default(),
            _ => "",
        }
    }
}

/// Attributes in the order they were set; keys are the semantic conventions' names.
pub type Attrs = Vec<(&'static str, Attr)>;

/// The room a span's text buffer starts with: a server span's ids and names fit.
const TEXT_ROOM: usize = 192;

/// A moment in a span (the first byte, the reservation).
#[derive(Debug, Clone, PartialEq)]
pub struct EventRecord {
    pub name: &'static str,
    pub at: SystemTime,
    pub attributes: Attrs,
}

/// One finished, sampled span.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanRecord {
    /// The span's own context: its trace id, span id and the trace's `tracestate`.
    pub context: SpanContext,
    /// The parent's span id; `SpanId::INVALID` for a root.
    pub parent_span_id: SpanId,
    /// The parent is the client's span (from its `traceparent`), not one of ours.
    pub parent_is_remote: bool,
    pub name: Cow<'static, str>,
    pub kind: SpanKind,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Attrs,
    /// The text of the attributes set with [`SpanRecord::set_str`], one after another: one
    /// allocation for all of a span's ids and names, and one to free on the export thread.
    pub text: String,
    pub events: Vec<EventRecord>,
    /// The status's description when the span failed (`Status::Error`); unset otherwise.
    pub error: Option<Cow<'static, str>>,
}

impl SpanRecord {
    /// A span started at `start` under `parent` (a root when `parent` is `None`), with room for
    /// `attributes` attributes so that setting them does not grow the list.
    pub fn start(
        context: SpanContext,
        parent: Option<(&SpanContext, bool)>,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
        start: SystemTime,
        attributes: usize,
    ) -> Self {
        let (parent_span_id, parent_is_remote) = parent
            .map_or((SpanId::INVALID, false), |(p, remote)| {
                (p.span_id(), remote)
            });
        SpanRecord {
            context,
            parent_span_id,
            parent_is_remote,
            name: name.into(),
            kind,
            start,
            end: start,
            attributes: Vec::with_capacity(attributes),
            text: String::new(),
            events: Vec::new(),
            error: None,
        }
    }

    pub fn set(&mut self, key: &'static str, value: impl Into<Attr>) {
        self.attributes.push((key, value.into()));
    }

    /// Sets a text attribute by copying `value` into the span's buffer, where an owned
    /// `String` per value would be one allocation each, freed on another thread.
    pub fn set_str(&mut self, key: &'static str, value: &str) {
        if self.text.capacity() == 0 {
            self.text.reserve(TEXT_ROOM.max(value.len()));
        }
        let from = self.text.len();
        self.text.push_str(value);
        match (u32::try_from(from), u32::try_from(self.text.len())) {
            (Ok(from), Ok(to)) => self.attributes.push((key, Attr::Held(from, to))),
            // Past 4 GiB of attribute text: kept as a value of its own.
            _ => {
                self.text.truncate(from);
                self.attributes.push((key, Attr::Text(value.to_owned())));
            }
        }
    }

    pub fn event(&mut self, name: &'static str, at: SystemTime, attributes: Attrs) {
        self.events.push(EventRecord {
            name,
            at,
            attributes,
        });
    }

    /// The same span as the SDK's export data, under `scope`: what `opentelemetry-otlp`'s
    /// exporters take.
    pub fn to_span_data(&self, scope: &InstrumentationScope) -> SpanData {
        let kvs = |attrs: &Attrs| -> Vec<KeyValue> {
            attrs
                .iter()
                .map(|(k, v)| KeyValue::new(*k, v.to_value(&self.text)))
                .collect()
        };
        let mut events = SpanEvents::default();
        events.events = self
            .events
            .iter()
            .map(|e| Event::new(e.name, e.at, kvs(&e.attributes), 0))
            .collect();
        SpanData {
            span_context: self.context.clone(),
            parent_span_id: self.parent_span_id,
            parent_span_is_remote: self.parent_is_remote,
            span_kind: self.kind.clone(),
            name: self.name.clone(),
            start_time: self.start,
            end_time: self.end,
            attributes: kvs(&self.attributes),
            dropped_attributes_count: 0,
            events,
            links: SpanLinks::default(),
            status: match &self.error {
                Some(description) => Status::error(description.clone()),
                None => Status::Unset,
            },
            instrumentation_scope: scope.clone(),
        }
    }
}

/// The context of a new span in trace `trace_id`: a fresh span id, the trace's sampling flag
/// and `tracestate`.
pub fn child(trace_id: TraceId, sampled: bool, state: &TraceState) -> SpanContext {
    let flags = if sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    SpanContext::new(trace_id, new_span_id(), flags, false, state.clone())
}

/// A random trace id (never the invalid all-zero one).
pub fn new_trace_id() -> TraceId {
    loop {
        let id = rand::random::<u128>();
        if id != 0 {
            return TraceId::from(id);
        }
    }
}

/// A random span id (never the invalid all-zero one).
pub fn new_span_id() -> SpanId {
    loop {
        let id = rand::random::<u64>();
        if id != 0 {
            return SpanId::from(id);
        }
    }
}
