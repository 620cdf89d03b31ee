//! A batch of finished spans as the body of an OTLP/HTTP protobuf export request
//! (`ExportTraceServiceRequest`), written in one pass from the SDK's [`SpanData`].
//!
//! `opentelemetry-otlp` gets there by copying every span into `opentelemetry-proto`'s message
//! structs (each attribute key and string value becomes a new `String`) and letting prost encode
//! the tree, which sizes every nested message once per level above it. For the few spans of
//! each request that is most of what tracing costs the gateway, and all of it is spent on the
//! export thread sharing the request threads' cores. Here each message is written where it
//! ends up: a nested message's length is either summed from its parts (attributes and their
//! values), filled in when the message closes (spans, events, links: their content is moved up
//! against the length, a few hundred bytes), or, for the two groups that hold the whole batch
//! (the resource's and the scope's), written in a fixed five bytes so that nothing moves.
//! A varint with redundant continuation bytes is valid protobuf that decoders read (Google's
//! protobuf tests decoding them), and three or four bytes of a whole batch is the price.
//! The result decodes to exactly what the library's own conversion produces, which the tests
//! check field by field through `opentelemetry-proto`.

use opentelemetry::trace::{SpanId, SpanKind, Status, TraceState};
use opentelemetry::{Array, InstrumentationScope, Value};
use opentelemetry_sdk::trace::SpanData;
use opentelemetry_sdk::Resource;
use prost::encoding::{encode_varint, encoded_len_varint, WireType};
use std::time::{SystemTime, UNIX_EPOCH};

/// Room kept for a message's length until it is known: a varint of up to 2^35 - 1 bytes.
const LEN_ROOM: usize = 5;

/// `SpanFlags`: the span's parent is known to be local or remote (OTLP 1.3).
const HAS_IS_REMOTE: u32 = 0x100;
/// `SpanFlags`: the span's parent is remote.
const IS_REMOTE: u32 = 0x200;

/// The `Resource` message of the process, written once when the exporter learns it.
pub fn resource(resource: &Resource) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in resource.iter() {
        key_value(&mut out, 1, k.as_str(), v);
    }
    out
}

/// The export request for `spans`, under the resource written by [`resource`] and its schema
/// URL, grouped by instrumentation scope in order of first appearance (as the library does).
pub fn export_request(out: &mut Vec<u8>, resource: &[u8], schema_url: &str, spans: &[SpanData]) {
    out.clear();
    let resource_spans = open(out, 1);
    bytes_field(out, 1, resource, true);
    // Each span's scope found once (scopes compare field by field). A scope that is not equal
    // to itself (a NaN attribute) gets a group per span, as the library gives it.
    let mut scopes: Vec<&InstrumentationScope> = Vec::with_capacity(1);
    let mut scope_of: Vec<usize> = Vec::with_capacity(spans.len());
    for span in spans {
        let scope = &span.instrumentation_scope;
        let i = match scopes.iter().position(|s| *s == scope) {
            Some(i) => i,
            None => {
                scopes.push(scope);
                scopes.len() - 1
            }
        };
        scope_of.push(i);
    }
    for (i, scope) in scopes.iter().enumerate() {
        let scope_spans = open(out, 2);
        let head = open(out, 1);
        string(out, 1, scope.name());
        string(out, 2, scope.version().unwrap_or_default());
        for kv in scope.attributes() {
            key_value(out, 3, kv.key.as_str(), &kv.value);
        }
        close(out, head);
        for (span, _) in spans.iter().zip(&scope_of).filter(|(_, s)| **s == i) {
            span_message(out, span);
        }
        string(out, 3, scope.schema_url().unwrap_or_default());
        close_in_place(out, scope_spans);
    }
    string(out, 3, schema_url);
    close_in_place(out, resource_spans);
}

fn span_message(out: &mut Vec<u8>, span: &SpanData) {
    let msg = open(out, 2);
    let cx = &span.span_context;
    bytes_field(out, 1, &cx.trace_id().to_bytes(), false);
    bytes_field(out, 2, &cx.span_id().to_bytes(), false);
    trace_state(out, 3, cx.trace_state());
    if span.parent_span_id != SpanId::INVALID {
        bytes_field(out, 4, &span.parent_span_id.to_bytes(), false);
    }
    string(out, 5, &span.name);
    uint(out, 6, kind(&span.span_kind));
    fixed64(out, 7, nanos(span.start_time));
    fixed64(out, 8, nanos(span.end_time));
    for kv in &span.attributes {
        key_value(out, 9, kv.key.as_str(), &kv.value);
    }
    uint(out, 10, u64::from(span.dropped_attributes_count));
    for event in span.events.iter() {
        let e = open(out, 11);
        fixed64(out, 1, nanos(event.timestamp));
        string(out, 2, &event.name);
        for kv in &event.attributes {
            key_value(out, 3, kv.key.as_str(), &kv.value);
        }
        uint(out, 4, u64::from(event.dropped_attributes_count));
        close(out, e);
    }
    uint(out, 12, u64::from(span.events.dropped_count));
    for link in span.links.iter() {
        let l = open(out, 13);
        let lcx = &link.span_context;
        bytes_field(out, 1, &lcx.trace_id().to_bytes(), false);
        bytes_field(out, 2, &lcx.span_id().to_bytes(), false);
        trace_state(out, 3, lcx.trace_state());
        for kv in &link.attributes {
            key_value(out, 4, kv.key.as_str(), &kv.value);
        }
        uint(out, 5, u64::from(link.dropped_attributes_count));
        fixed32(
            out,
            6,
            flags(lcx.is_remote(), u32::from(lcx.trace_flags().to_u8())),
        );
        close(out, l);
    }
    uint(out, 14, u64::from(span.links.dropped_count));
    let (code, message) = match &span.status {
        Status::Unset => (0, ""),
        Status::Ok => (1, ""),
        Status::Error { description } => (2, description.as_ref()),
    };
    let status_len = string_len(2, message) + uint_len(3, code);
    field_key(out, 15, WireType::LengthDelimited);
    varint(out, status_len as u64);
    string(out, 2, message);
    uint(out, 3, code);
    fixed32(
        out,
        16,
        flags(
            span.parent_span_is_remote,
            u32::from(cx.trace_flags().to_u8()),
        ),
    );
    close(out, msg);
}

/// A span's `tracestate`, when it has one.
fn trace_state(out: &mut Vec<u8>, tag: u32, state: &TraceState) {
    if let Some(header) = crate::tracestate(state) {
        string(out, tag, &header);
    }
}

fn kind(kind: &SpanKind) -> u64 {
    match kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    }
}

fn flags(parent_is_remote: bool, trace_flags: u32) -> u32 {
    let mut flags = trace_flags | HAS_IS_REMOTE;
    if parent_is_remote {
        flags |= IS_REMOTE;
    }
    flags
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Starts a length-delimited field whose length is known only once it is written; returns
/// where its content begins.
fn open(out: &mut Vec<u8>, tag: u32) -> usize {
    field_key(out, tag, WireType::LengthDelimited);
    out.extend_from_slice(&[0; LEN_ROOM]);
    out.len()
}

/// Writes the length of the field opened at `start` in the room kept for it, with redundant
/// continuation bytes where it needs fewer than five: nothing moves.
fn close_in_place(out: &mut [u8], start: usize) {
    let mut len = (out.len() - start) as u64;
    debug_assert!(
        len < 1 << (7 * LEN_ROOM),
        "a batch past the room for its length"
    );
    for (i, byte) in out[start - LEN_ROOM..start].iter_mut().enumerate() {
        let more = if i + 1 < LEN_ROOM { 0x80 } else { 0 };
        *byte = (len & 0x7f) as u8 | more;
        len >>= 7;
    }
}

/// Writes the length of the field opened at `start` and moves its content up against it.
fn close(out: &mut Vec<u8>, start: usize) {
    let len = out.len() - start;
    let mut head = [0u8; LEN_ROOM];
    let mut cursor = &mut head[..];
    encode_varint(len as u64, &mut cursor);
    let used = LEN_ROOM - cursor.len();
    let room = start - LEN_ROOM;
    out[room..room + used].copy_from_slice(&head[..used]);
    if used < LEN_ROOM {
        out.copy_within(start.., room + used);
        out.truncate(room + used + len);
    }
}

/// A varint; most are keys and short lengths, one byte.
#[inline]
fn varint(out: &mut Vec<u8>, v: u64) {
    if v < 0x80 {
        out.push(v as u8);
    } else {
        encode_varint(v, out);
    }
}

/// A field's key: its number and wire type.
#[inline]
fn field_key(out: &mut Vec<u8>, tag: u32, wire_type: WireType) {
    varint(out, u64::from(tag << 3 | wire_type as u32));
}

fn key_len(tag: u32) -> usize {
    prost::encoding::key_len(tag)
}

fn string_len(tag: u32, s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        key_len(tag) + encoded_len_varint(s.len() as u64) + s.len()
    }
}

fn uint_len(tag: u32, v: u64) -> usize {
    if v == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(v)
    }
}

/// A proto3 string field; the empty string is the default and not written.
fn string(out: &mut Vec<u8>, tag: u32, s: &str) {
    if !s.is_empty() {
        bytes_field(out, tag, s.as_bytes(), true);
    }
}

/// A length-delimited field holding `b`; an empty one is written only when `always`.
fn bytes_field(out: &mut Vec<u8>, tag: u32, b: &[u8], always: bool) {
    if b.is_empty() && !always {
        return;
    }
    field_key(out, tag, WireType::LengthDelimited);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn uint(out: &mut Vec<u8>, tag: u32, v: u64) {
    if v != 0 {
        field_key(out, tag, WireType::Varint);
        varint(out, v);
    }
}

fn fixed64(out: &mut Vec<u8>, tag: u32, v: u64) {
    if v != 0 {
        field_key(out, tag, WireType::SixtyFourBit);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn fixed32(out: &mut Vec<u8>, tag: u32, v: u32) {
    if v != 0 {
        field_key(out, tag, WireType::ThirtyTwoBit);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// A `KeyValue` message as field `tag`; its value is always present, as the library writes it.
fn key_value(out: &mut Vec<u8>, tag: u32, key: &str, value: &Value) {
    let value_len = any_value_len(value);
    let len = string_len(1, key) + key_len(2) + encoded_len_varint(value_len as u64) + value_len;
    field_key(out, tag, WireType::LengthDelimited);
    varint(out, len as u64);
    string(out, 1, key);
    field_key(out, 2, WireType::LengthDelimited);
    varint(out, value_len as u64);
    any_value(out, value);
}

/// The content of an `AnyValue` holding `value`. Its one-of member is written even when it
/// holds its type's default (`false`, `0`, `""`), so that the value is not lost.
fn any_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Bool(b) => {
            field_key(out, 2, WireType::Varint);
            varint(out, u64::from(*b));
        }
        Value::I64(i) => {
            field_key(out, 3, WireType::Varint);
            varint(out, *i as u64);
        }
        Value::F64(f) => {
            field_key(out, 4, WireType::SixtyFourBit);
            out.extend_from_slice(&f.to_le_bytes());
        }
        Value::String(s) => bytes_field(out, 1, s.as_str().as_bytes(), true),
        Value::Array(array) => {
            field_key(out, 5, WireType::LengthDelimited);
            varint(out, array_len(array) as u64);
            array_items(out, array);
        }
        other => bytes_field(out, 1, other.as_str().as_bytes(), true),
    }
}

fn any_value_len(value: &Value) -> usize {
    match value {
        Value::Bool(_) => 2,
        Value::I64(i) => 1 + encoded_len_varint(*i as u64),
        Value::F64(_) => 9,
        Value::String(s) => one_string_len(s.as_str()),
        Value::Array(array) => {
            let len = array_len(array);
            1 + encoded_len_varint(len as u64) + len
        }
        other => one_string_len(&other.as_str()),
    }
}

/// A string one-of member with its key: written even when empty.
fn one_string_len(s: &str) -> usize {
    1 + encoded_len_varint(s.len() as u64) + s.len()
}

/// The content of an `ArrayValue`: each item an `AnyValue` in field 1.
fn array_len(array: &Array) -> usize {
    fn item(len: usize) -> usize {
        1 + encoded_len_varint(len as u64) + len
    }
    match array {
        Array::Bool(v) => v.len() * item(2),
        Array::I64(v) => v
            .iter()
            .map(|i| item(1 + encoded_len_varint(*i as u64)))
            .sum(),
        Array::F64(v) => v.len() * item(9),
        Array::String(v) => v.iter().map(|s| item(one_string_len(s.as_str()))).sum(),
        other => item(one_string_len(&other.to_string())),
    }
}

fn array_items(out: &mut Vec<u8>, array: &Array) {
    let item = |out: &mut Vec<u8>, value: Value| {
        let len = any_value_len(&value);
        field_key(out, 1, WireType::LengthDelimited);
        varint(out, len as u64);
        any_value(out, &value);
    };
    match array {
        Array::Bool(v) => v.iter().for_each(|b| item(out, Value::Bool(*b))),
        Array::I64(v) => v.iter().for_each(|i| item(out, Value::I64(*i))),
        Array::F64(v) => v.iter().for_each(|f| item(out, Value::F64(*f))),
        Array::String(v) => v.iter().for_each(|s| {
            field_key(out, 1, WireType::LengthDelimited);
            varint(out, one_string_len(s.as_str()) as u64);
            bytes_field(out, 1, s.as_str().as_bytes(), true);
        }),
        other => item(out, Value::from(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{Event, Link, SpanContext, TraceFlags, TraceId, TraceState};
    use opentelemetry::{KeyValue, StringValue};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use prost::Message;
    use std::borrow::Cow;
    use std::time::Duration;

    fn context(trace: u128, span: u64, state: &str, remote: bool) -> SpanContext {
        SpanContext::new(
            TraceId::from(trace),
            SpanId::from(span),
            TraceFlags::SAMPLED,
            remote,
            TraceState::from_key_value(
                state
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .filter_map(|p| p.split_once('=')),
            )
            .unwrap(),
        )
    }

    /// Every kind of value an attribute can hold, defaults (which proto3 would leave out of
    /// a plain field) and long strings (lengths past one varint byte) among them.
    fn attributes() -> Vec<KeyValue> {
        vec![
            KeyValue::new("gen_ai.request.model", "gpt-4o-mini"),
            KeyValue::new("empty", ""),
            KeyValue::new("long", "x".repeat(300)),
            KeyValue::new("gen_ai.usage.input_tokens", 1234_i64),
            KeyValue::new("zero", 0_i64),
            KeyValue::new("negative", -7_i64),
            KeyValue::new("ratio", 0.25_f64),
            KeyValue::new("yes", true),
            KeyValue::new("no", false),
            KeyValue::new(
                "gen_ai.response.finish_reasons",
                Value::Array(Array::String(vec![
                    StringValue::from("stop"),
                    StringValue::from(""),
                ])),
            ),
            KeyValue::new("ints", Value::Array(Array::I64(vec![0, 1, -1, i64::MAX]))),
            KeyValue::new("floats", Value::Array(Array::F64(vec![0.0, 1.5]))),
            KeyValue::new("bools", Value::Array(Array::Bool(vec![true, false]))),
            KeyValue::new("none", Value::Array(Array::String(vec![]))),
        ]
    }

    fn span(n: u64, scope: &InstrumentationScope) -> SpanData {
        let start = UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789 + n);
        let mut events = SpanEvents::default();
        events.events.push(Event::new(
            "first_byte",
            start + Duration::from_millis(3),
            vec![KeyValue::new("n", n as i64)],
            0,
        ));
        events.events.push(Event::new("bare", start, vec![], 2));
        events.dropped_count = u32::from(n == 2);
        let mut links = SpanLinks::default();
        if n == 1 {
            links.links.push(Link::new(
                context(9, 10, "vendor=x", true),
                vec![KeyValue::new("why", "retry")],
                1,
            ));
            links.dropped_count = 3;
        }
        SpanData {
            span_context: context(
                0x0af7651916cd43dd8448eb211c80319c,
                n + 1,
                if n == 0 { "a=1,b=2" } else { "" },
                false,
            ),
            parent_span_id: if n == 0 {
                SpanId::INVALID
            } else {
                SpanId::from(1)
            },
            parent_span_is_remote: n == 3,
            span_kind: [
                SpanKind::Server,
                SpanKind::Internal,
                SpanKind::Client,
                SpanKind::Producer,
                SpanKind::Consumer,
            ][n as usize % 5]
                .clone(),
            name: Cow::Owned(format!("span {n}")),
            start_time: start,
            end_time: start + Duration::from_micros(250),
            attributes: if n == 4 { vec![] } else { attributes() },
            dropped_attributes_count: n as u32,
            events,
            links,
            status: match n % 3 {
                0 => Status::Unset,
                1 => Status::Ok,
                _ => Status::error("upstream_error"),
            },
            instrumentation_scope: scope.clone(),
        }
    }

    /// What `opentelemetry-otlp` would send for the same spans.
    fn library(spans: Vec<SpanData>, resource: &Resource) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                spans,
                &ResourceAttributesWithSchema::from(resource),
            ),
        }
    }

    fn ours(spans: &[SpanData], resource: &Resource) -> ExportTraceServiceRequest {
        let mut out = Vec::new();
        export_request(
            &mut out,
            &super::resource(resource),
            resource.schema_url().unwrap_or_default(),
            spans,
        );
        ExportTraceServiceRequest::decode(out.as_slice()).unwrap()
    }

    #[test]
    fn a_batch_decodes_to_what_the_library_would_send() {
        let gateway = InstrumentationScope::builder("gateway").build();
        let other = InstrumentationScope::builder("other")
            .with_version("1.2.3")
            .with_schema_url("https://opentelemetry.io/schemas/1.30.0")
            .with_attributes([KeyValue::new("scope.attr", 5_i64)])
            .build();
        let resource = Resource::builder()
            .with_service_name("llm-gateway")
            .with_schema_url(
                [KeyValue::new("deployment.environment", "test")],
                "https://opentelemetry.io/schemas/1.30.0",
            )
            .build();
        // Scopes interleaved: the library groups them in order of first appearance.
        let spans: Vec<SpanData> = (0..6)
            .map(|n| span(n, if n % 2 == 1 { &other } else { &gateway }))
            .collect();
        let want = library(spans.clone(), &resource);
        let got = ours(&spans, &resource);
        assert_eq!(got, want);
        assert_eq!(got.resource_spans[0].scope_spans.len(), 2);
        assert_eq!(got.resource_spans[0].scope_spans[0].spans.len(), 3);
    }

    #[test]
    fn a_scope_unequal_to_itself_loses_no_span() {
        let odd = InstrumentationScope::builder("odd")
            .with_attributes([KeyValue::new("nan", f64::NAN)])
            .build();
        let resource = Resource::builder().with_service_name("g").build();
        let spans: Vec<SpanData> = (0..3).map(|n| span(n, &odd)).collect();
        let got = ours(&spans, &resource);
        let sent: usize = got.resource_spans[0]
            .scope_spans
            .iter()
            .map(|s| s.spans.len())
            .sum();
        assert_eq!(sent, 3);
        let want = library(spans.clone(), &resource);
        assert_eq!(
            got.resource_spans[0].scope_spans.len(),
            want.resource_spans[0].scope_spans.len()
        );
    }

    #[test]
    fn one_span_and_none_decode_as_the_library_sends_them() {
        let scope = InstrumentationScope::builder("gateway").build();
        let resource = Resource::builder_empty().build();
        let one = vec![span(4, &scope)];
        assert_eq!(ours(&one, &resource), library(one.clone(), &resource));
        assert_eq!(ours(&[], &resource), library(vec![], &resource));
    }

    #[test]
    fn a_span_past_a_two_byte_length_closes_right() {
        let scope = InstrumentationScope::builder("gateway").build();
        let resource = Resource::builder().with_service_name("g").build();
        let mut big = span(0, &scope);
        big.attributes
            .push(KeyValue::new("big", "y".repeat(70_000)));
        let spans: Vec<SpanData> = (0..3).map(|_| big.clone()).collect();
        assert_eq!(ours(&spans, &resource), library(spans.clone(), &resource));
    }
}
