//! A batch of finished spans as an OTLP `ExportTraceServiceRequest` in protobuf, written
//! straight from the SDK's `SpanData` with prost's wire primitives.
//!
//! `opentelemetry-otlp` first copies every span into the generated message types (a `String`
//! per attribute key and value, a `Vec` per id) and then lets prost measure each nested message
//! again at every level of nesting: at every request sampled, that was more work than the
//! request itself. Here each span is written once into a scratch buffer and copied behind its
//! length; the resource is encoded once, when the SDK hands it over. The tests decode what this
//! writes with the official `opentelemetry-proto` definitions.

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanKind, Status};
use opentelemetry::{Array, InstrumentationScope, KeyValue, Value};
use opentelemetry_sdk::trace::SpanData;
use opentelemetry_sdk::Resource;
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};

/// Reusable buffers: an exporter keeps one, so a batch allocates nothing once they have grown.
#[derive(Debug, Default)]
pub struct Encoder {
    /// The encoded `Resource` message (without its tag), and its schema URL.
    resource: Vec<u8>,
    schema_url: String,
    span: Vec<u8>,
    scope: Vec<u8>,
    scopes: Vec<u8>,
    /// A nested message being written (an attribute's value, an event, a link, the status).
    inner: Vec<u8>,
    value: Vec<u8>,
}

impl Encoder {
    /// Encodes the resource every batch carries.
    pub fn set_resource(&mut self, resource: &Resource) {
        self.resource.clear();
        for (k, v) in resource.iter() {
            key_value(&mut self.resource, 1, k.as_str(), v, &mut self.value);
        }
        self.schema_url = resource.schema_url().unwrap_or_default().to_owned();
    }

    /// `spans` as one request body.
    pub fn encode(&mut self, spans: &[SpanData]) -> Vec<u8> {
        self.scopes.clear();
        let mut rest = spans;
        while let Some(first) = rest.first() {
            // A run of spans from the same instrumentation scope is one `ScopeSpans`.
            let n = rest
                .iter()
                .take_while(|s| s.instrumentation_scope == first.instrumentation_scope)
                .count();
            let (run, tail) = rest.split_at(n);
            rest = tail;
            self.scope.clear();
            scope(&mut self.scope, &first.instrumentation_scope, &mut self.inner, &mut self.value);
            for s in run {
                self.span.clear();
                span(&mut self.span, s, &mut self.inner, &mut self.value);
                bytes_field(&mut self.scope, 2, &self.span);
            }
            if let Some(url) = first.instrumentation_scope.schema_url() {
                string_field(&mut self.scope, 3, url);
            }
            bytes_field(&mut self.scopes, 2, &self.scope);
        }
        // ResourceSpans { resource = 1, scope_spans = 2, schema_url = 3 }
        let mut rs_len = field_len(1, self.resource.len()) + self.scopes.len();
        if !self.schema_url.is_empty() {
            rs_len += field_len(3, self.schema_url.len());
        }
        let mut out = Vec::with_capacity(field_len(1, rs_len));
        encode_key(1, WireType::LengthDelimited, &mut out);
        encode_varint(rs_len as u64, &mut out);
        bytes_field(&mut out, 1, &self.resource);
        out.extend_from_slice(&self.scopes);
        if !self.schema_url.is_empty() {
            string_field(&mut out, 3, &self.schema_url);
        }
        out
    }
}

/// The length of a length-delimited field `tag` holding `len` bytes, tag included.
fn field_len(tag: u32, len: usize) -> usize {
    prost::encoding::key_len(tag) + encoded_len_varint(len as u64) + len
}

fn bytes_field(out: &mut Vec<u8>, tag: u32, b: &[u8]) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(b.len() as u64, out);
    out.extend_from_slice(b);
}

fn string_field(out: &mut Vec<u8>, tag: u32, s: &str) {
    bytes_field(out, tag, s.as_bytes());
}

fn varint_field(out: &mut Vec<u8>, tag: u32, v: u64) {
    encode_key(tag, WireType::Varint, out);
    encode_varint(v, out);
}

fn fixed64_field(out: &mut Vec<u8>, tag: u32, v: u64) {
    encode_key(tag, WireType::SixtyFourBit, out);
    out.extend_from_slice(&v.to_le_bytes());
}

fn fixed32_field(out: &mut Vec<u8>, tag: u32, v: u32) {
    encode_key(tag, WireType::ThirtyTwoBit, out);
    out.extend_from_slice(&v.to_le_bytes());
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// `InstrumentationScope { name = 1, version = 2, attributes = 3 }` as field 1 of `ScopeSpans`.
fn scope(out: &mut Vec<u8>, s: &InstrumentationScope, inner: &mut Vec<u8>, value: &mut Vec<u8>) {
    inner.clear();
    string_field(inner, 1, s.name());
    if let Some(v) = s.version() {
        string_field(inner, 2, v);
    }
    for kv in s.attributes() {
        key_value(inner, 3, kv.key.as_str(), &kv.value, value);
    }
    bytes_field(out, 1, inner);
}

/// `KeyValue { key = 1, value = 2 }` as field `tag` of `out`.
fn key_value(out: &mut Vec<u8>, tag: u32, key: &str, v: &Value, value: &mut Vec<u8>) {
    value.clear();
    any_value(value, v);
    let len = field_len(1, key.len()) + field_len(2, value.len());
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(len as u64, out);
    string_field(out, 1, key);
    bytes_field(out, 2, value);
}

fn attributes(out: &mut Vec<u8>, tag: u32, kvs: &[KeyValue], value: &mut Vec<u8>) {
    for kv in kvs {
        key_value(out, tag, kv.key.as_str(), &kv.value, value);
    }
}

/// The fields of an `AnyValue` (string 1, bool 2, int 3, double 4, array 5).
fn any_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::String(s) => string_field(out, 1, s.as_str()),
        Value::Bool(b) => varint_field(out, 2, u64::from(*b)),
        Value::I64(i) => varint_field(out, 3, *i as u64),
        Value::F64(f) => fixed64_field(out, 4, f.to_bits()),
        Value::Array(a) => {
            // ArrayValue { values = 1 }: each element an AnyValue.
            let mut arr = Vec::new();
            let mut one = Vec::new();
            let mut push = |arr: &mut Vec<u8>, v: Value| {
                one.clear();
                any_value(&mut one, &v);
                bytes_field(arr, 1, &one);
            };
            match a {
                Array::Bool(xs) => xs.iter().for_each(|x| push(&mut arr, Value::Bool(*x))),
                Array::I64(xs) => xs.iter().for_each(|x| push(&mut arr, Value::I64(*x))),
                Array::F64(xs) => xs.iter().for_each(|x| push(&mut arr, Value::F64(*x))),
                Array::String(xs) => xs
                    .iter()
                    .for_each(|x| push(&mut arr, Value::String(x.clone()))),
                other => push(&mut arr, Value::from(other.to_string())),
            }
            bytes_field(out, 5, &arr);
        }
        other => string_field(out, 1, &other.as_str()),
    }
}

/// The fields of one `Span` (the OTLP trace.proto numbering).
fn span(out: &mut Vec<u8>, s: &SpanData, inner: &mut Vec<u8>, value: &mut Vec<u8>) {
    let sc = &s.span_context;
    bytes_field(out, 1, &sc.trace_id().to_bytes());
    bytes_field(out, 2, &sc.span_id().to_bytes());
    let state = sc.trace_state().header();
    if !state.is_empty() {
        string_field(out, 3, &state);
    }
    if s.parent_span_id != opentelemetry::trace::SpanId::INVALID {
        bytes_field(out, 4, &s.parent_span_id.to_bytes());
    }
    string_field(out, 5, &s.name);
    let kind: u64 = match s.span_kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    };
    varint_field(out, 6, kind);
    fixed64_field(out, 7, nanos(s.start_time));
    fixed64_field(out, 8, nanos(s.end_time));
    attributes(out, 9, &s.attributes, value);
    if s.dropped_attributes_count > 0 {
        varint_field(out, 10, u64::from(s.dropped_attributes_count));
    }
    for e in s.events.iter() {
        // Event { time_unix_nano = 1, name = 2, attributes = 3, dropped_attributes_count = 4 }
        inner.clear();
        fixed64_field(inner, 1, nanos(e.timestamp));
        string_field(inner, 2, &e.name);
        attributes(inner, 3, &e.attributes, value);
        if e.dropped_attributes_count > 0 {
            varint_field(inner, 4, u64::from(e.dropped_attributes_count));
        }
        bytes_field(out, 11, inner);
    }
    if s.events.dropped_count > 0 {
        varint_field(out, 12, u64::from(s.events.dropped_count));
    }
    for l in s.links.iter() {
        // Link { trace_id = 1, span_id = 2, trace_state = 3, attributes = 4,
        //        dropped_attributes_count = 5, flags = 6 }
        inner.clear();
        let lc = &l.span_context;
        bytes_field(inner, 1, &lc.trace_id().to_bytes());
        bytes_field(inner, 2, &lc.span_id().to_bytes());
        let state = lc.trace_state().header();
        if !state.is_empty() {
            string_field(inner, 3, &state);
        }
        attributes(inner, 4, &l.attributes, value);
        if l.dropped_attributes_count > 0 {
            varint_field(inner, 5, u64::from(l.dropped_attributes_count));
        }
        fixed32_field(inner, 6, flags(lc.is_remote(), lc.trace_flags().to_u8()));
        bytes_field(out, 13, inner);
    }
    if s.links.dropped_count > 0 {
        varint_field(out, 14, u64::from(s.links.dropped_count));
    }
    // Status { message = 2, code = 3 }
    inner.clear();
    match &s.status {
        Status::Unset => {}
        Status::Ok => varint_field(inner, 3, 1),
        Status::Error { description } => {
            if !description.is_empty() {
                string_field(inner, 2, description);
            }
            varint_field(inner, 3, 2);
        }
    }
    bytes_field(out, 15, inner);
    fixed32_field(
        out,
        16,
        flags(s.parent_span_is_remote, sc.trace_flags().to_u8()),
    );
}

/// Span flags: the W3C trace flags, and whether the parent is remote (known, and its value).
fn flags(remote: bool, trace_flags: u8) -> u32 {
    const HAS_IS_REMOTE: u32 = 0x100;
    const IS_REMOTE: u32 = 0x200;
    u32::from(trace_flags) | HAS_IS_REMOTE | if remote { IS_REMOTE } else { 0 }
}
