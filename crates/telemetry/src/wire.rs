//! A batch of finished spans as an OTLP `ExportTraceServiceRequest` in protobuf, written
//! straight from the SDK's `SpanData`.
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

/// The protobuf wire types used here.
#[derive(Clone, Copy)]
enum WireType {
    Varint = 0,
    SixtyFourBit = 1,
    LengthDelimited = 2,
    ThirtyTwoBit = 5,
}

/// A field's key: its number and wire type, as a varint.
#[inline]
fn encode_key(tag: u32, wt: WireType, out: &mut Vec<u8>) {
    encode_varint(u64::from(tag << 3 | wt as u32), out);
}

#[inline]
fn encode_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[inline]
fn encoded_len_varint(v: u64) -> usize {
    // One byte per started group of seven bits (at least one).
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn key_len(tag: u32) -> usize {
    encoded_len_varint(u64::from(tag << 3))
}

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
            scope(
                &mut self.scope,
                &first.instrumentation_scope,
                &mut self.inner,
                &mut self.value,
            );
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
    key_len(tag) + encoded_len_varint(len as u64) + len
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

/// `KeyValue { key = 1, value = 2 }` as field `tag` of `out`. Scalar and string values are
/// written in place (their length is known); arrays go through `value`.
fn key_value(out: &mut Vec<u8>, tag: u32, key: &str, v: &Value, value: &mut Vec<u8>) {
    let any_len = match v {
        Value::String(s) => field_len(1, s.as_str().len()),
        Value::Bool(_) => 2,
        Value::I64(i) => 1 + encoded_len_varint(*i as u64),
        Value::F64(_) => 9,
        other => {
            value.clear();
            any_value(value, other);
            value.len()
        }
    };
    let len = field_len(1, key.len()) + field_len(2, any_len);
    out.reserve(field_len(tag, len));
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(len as u64, out);
    string_field(out, 1, key);
    encode_key(2, WireType::LengthDelimited, out);
    encode_varint(any_len as u64, out);
    match v {
        Value::String(_) | Value::Bool(_) | Value::I64(_) | Value::F64(_) => any_value(out, v),
        _ => out.extend_from_slice(value),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{Event, Link, SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    use opentelemetry::InstrumentationScope;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use prost::Message;
    use std::time::Duration;

    fn data(name: &'static str, attrs: Vec<KeyValue>, status: Status) -> SpanData {
        let t0 = UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789);
        let mut events = SpanEvents::default();
        events.events.push(Event::new(
            "gateway.first_byte",
            t0 + Duration::from_millis(1),
            vec![KeyValue::new("gateway.ttfb_ms", 1)],
            0,
        ));
        let mut links = SpanLinks::default();
        links.links.push(Link::new(
            SpanContext::new(
                TraceId::from_bytes([1; 16]),
                SpanId::from_bytes([2; 8]),
                TraceFlags::default(),
                true,
                TraceState::default(),
            ),
            vec![],
            0,
        ));
        SpanData {
            span_context: SpanContext::new(
                TraceId::from_bytes([7; 16]),
                SpanId::from_bytes([9; 8]),
                TraceFlags::SAMPLED,
                false,
                TraceState::from_key_value([("vendor", "abc")]).unwrap(),
            ),
            parent_span_id: SpanId::from_bytes([3; 8]),
            parent_span_is_remote: true,
            span_kind: SpanKind::Client,
            name: name.into(),
            start_time: t0,
            end_time: t0 + Duration::from_millis(5),
            attributes: attrs,
            dropped_attributes_count: 0,
            events,
            links,
            status,
            instrumentation_scope: InstrumentationScope::builder("gateway").build(),
        }
    }

    /// What the official definitions decode from a batch is what the spans held.
    #[test]
    fn the_official_definitions_decode_what_is_written() {
        let mut enc = Encoder::default();
        enc.set_resource(&Resource::builder_empty().with_service_name("gw").build());
        let long = "x".repeat(300);
        let spans = vec![
            data(
                "chat mock-gpt",
                vec![
                    KeyValue::new("s", long.clone()),
                    KeyValue::new("b", true),
                    KeyValue::new("i", -5_i64),
                    KeyValue::new("big", i64::MAX),
                    KeyValue::new("f", 1.5),
                    KeyValue::new("a", Value::Array(vec![1_i64, 2].into())),
                ],
                Status::error("server_error"),
            ),
            data("second", vec![], Status::Unset),
        ];
        let req = ExportTraceServiceRequest::decode(enc.encode(&spans).as_slice()).unwrap();
        assert_eq!(req.resource_spans.len(), 1);
        let rs = &req.resource_spans[0];
        let res = rs.resource.as_ref().unwrap();
        assert_eq!(res.attributes[0].key, "service.name");
        assert_eq!(
            res.attributes[0].value.as_ref().unwrap().value,
            Some(Any::StringValue("gw".into()))
        );
        assert_eq!(rs.scope_spans.len(), 1);
        assert_eq!(rs.scope_spans[0].scope.as_ref().unwrap().name, "gateway");
        let got = &rs.scope_spans[0].spans;
        assert_eq!(got.len(), 2);
        let a = &got[0];
        assert_eq!(a.trace_id, vec![7; 16]);
        assert_eq!(a.span_id, vec![9; 8]);
        assert_eq!(a.parent_span_id, vec![3; 8]);
        assert_eq!(a.trace_state, "vendor=abc");
        assert_eq!(a.name, "chat mock-gpt");
        assert_eq!(a.kind, 3);
        assert_eq!(a.start_time_unix_nano, 1_700_000_000_123_456_789);
        assert_eq!(a.end_time_unix_nano, 1_700_000_000_128_456_789);
        assert_eq!(a.flags, 0x301);
        let v = |i: usize| {
            a.attributes[i]
                .value
                .as_ref()
                .unwrap()
                .value
                .clone()
                .unwrap()
        };
        assert_eq!(a.attributes[0].key, "s");
        assert_eq!(v(0), Any::StringValue(long));
        assert_eq!(v(1), Any::BoolValue(true));
        assert_eq!(v(2), Any::IntValue(-5));
        assert_eq!(v(3), Any::IntValue(i64::MAX));
        assert_eq!(v(4), Any::DoubleValue(1.5));
        let Any::ArrayValue(arr) = v(5) else {
            panic!("not an array: {:?}", v(5))
        };
        assert_eq!(arr.values.len(), 2);
        assert_eq!(a.events.len(), 1);
        assert_eq!(a.events[0].name, "gateway.first_byte");
        assert_eq!(a.events[0].time_unix_nano, 1_700_000_000_124_456_789);
        assert_eq!(a.events[0].attributes[0].key, "gateway.ttfb_ms");
        assert_eq!(a.links.len(), 1);
        assert_eq!(a.links[0].trace_id, vec![1; 16]);
        assert_eq!(a.links[0].flags, 0x300);
        let st = a.status.as_ref().unwrap();
        assert_eq!((st.code, st.message.as_str()), (2, "server_error"));
        assert_eq!(got[1].name, "second");
        assert_eq!(got[1].status.as_ref().unwrap().code, 0);
        assert!(got[1].attributes.is_empty());
    }

    #[test]
    fn varint_lengths() {
        for v in [0_u64, 1, 127, 128, 16_383, 16_384, u64::MAX] {
            let mut out = Vec::new();
            encode_varint(v, &mut out);
            assert_eq!(out.len(), encoded_len_varint(v), "{v}");
        }
    }
}
