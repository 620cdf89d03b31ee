//! A batch of finished spans as the body of an OTLP/HTTP protobuf export request
//! (`ExportTraceServiceRequest`), written in one pass from the gateway's [`SpanRecord`]s.
//!
//! `opentelemetry-otlp` gets there by copying every span into `opentelemetry-proto`'s message
//! structs (each attribute key and string value becomes a new `String`) and letting prost encode
//! the tree, which sizes every nested message once per level above it. Here each message is
//! written where it ends up: a nested message's length is either summed from its parts
//! (attributes and their values), filled in when the message closes (spans, events: their
//! content is moved up against the length, a few hundred bytes), or, for the two groups that
//! hold the whole batch (the resource's and the scope's), written in a fixed five bytes so that
//! nothing moves. A varint with redundant continuation bytes is valid protobuf that decoders
//! read (Google's protobuf tests decoding them), and three or four bytes of a whole batch is the
//! price. The result decodes to exactly what the library's own conversion of the same spans
//! produces, which the tests check field by field through `opentelemetry-proto`.

use opentelemetry::trace::{SpanKind, TraceState};
use opentelemetry::{Array, Value};
use opentelemetry_sdk::Resource;
use prost::encoding::{encode_varint, encoded_len_varint, WireType};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::record::{Attr, SpanRecord};

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
/// URL, all in the instrumentation scope named `scope`.
pub fn export_request(
    out: &mut Vec<u8>,
    resource: &[u8],
    schema_url: &str,
    scope: &str,
    spans: &[SpanRecord],
) {
    out.clear();
    let resource_spans = open(out, 1);
    bytes_field(out, 1, resource, true);
    if !spans.is_empty() {
        let scope_spans = open(out, 2);
        let head = open(out, 1);
        string(out, 1, scope);
        close(out, head);
        for span in spans {
            span_message(out, span);
        }
        close_in_place(out, scope_spans);
    }
    string(out, 3, schema_url);
    close_in_place(out, resource_spans);
}

fn span_message(out: &mut Vec<u8>, span: &SpanRecord) {
    let msg = open(out, 2);
    let cx = &span.context;
    bytes_field(out, 1, &cx.trace_id().to_bytes(), false);
    bytes_field(out, 2, &cx.span_id().to_bytes(), false);
    trace_state(out, 3, cx.trace_state());
    if span.parent_span_id != opentelemetry::trace::SpanId::INVALID {
        bytes_field(out, 4, &span.parent_span_id.to_bytes(), false);
    }
    string(out, 5, &span.name);
    uint(out, 6, kind(&span.kind));
    fixed64(out, 7, nanos(span.start));
    fixed64(out, 8, nanos(span.end));
    for (k, v) in &span.attributes {
        attribute(out, 9, k, v, &span.text);
    }
    for event in &span.events {
        let e = open(out, 11);
        fixed64(out, 1, nanos(event.at));
        string(out, 2, event.name);
        for (k, v) in &event.attributes {
            attribute(out, 3, k, v, &span.text);
        }
        close(out, e);
    }
    let (code, message) = match &span.error {
        None => (0, ""),
        Some(description) => (2, description.as_ref()),
    };
    let status_len = string_len(2, message) + uint_len(3, code);
    field_key(out, 15, WireType::LengthDelimited);
    varint(out, status_len as u64);
    string(out, 2, message);
    uint(out, 3, code);
    fixed32(
        out,
        16,
        flags(span.parent_is_remote, u32::from(cx.trace_flags().to_u8())),
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

/// A `KeyValue` message's field key and length, its key, and its value's field key and length:
/// all of it but the value's content (`value_len` bytes).
fn key_value_head(out: &mut Vec<u8>, tag: u32, key: &str, value_len: usize) {
    let len = string_len(1, key) + key_len(2) + encoded_len_varint(value_len as u64) + value_len;
    field_key(out, tag, WireType::LengthDelimited);
    varint(out, len as u64);
    string(out, 1, key);
    field_key(out, 2, WireType::LengthDelimited);
    varint(out, value_len as u64);
}

/// A `KeyValue` message holding one of the gateway's attributes, as field `tag`: the same
/// bytes [`key_value`] writes for the SDK's value of it. `held` is the span's text buffer.
fn attribute(out: &mut Vec<u8>, tag: u32, key: &str, value: &Attr, held: &str) {
    match value {
        Attr::Static(s) => text_attribute(out, tag, key, s),
        Attr::Text(s) => text_attribute(out, tag, key, s),
        Attr::Held(..) => text_attribute(out, tag, key, value.held_text(held)),
        _ => attribute_other(out, tag, key, value),
    }
}

/// A `KeyValue` holding a string, most of a span's attributes. Where every length fits one
/// varint byte (keys and values under 128 bytes, as ids and names are) its head is six bytes
/// known at once, written with the key in one piece.
fn text_attribute(out: &mut Vec<u8>, tag: u32, key: &str, value: &str) {
    // AnyValue { string_value = 1 } holding `value`; KeyValue { key = 1, value = 2 }.
    let any_len = 1 + encoded_len_varint(value.len() as u64) + value.len();
    let kv_len = 2 + key.len() + 1 + encoded_len_varint(any_len as u64) + any_len;
    if tag < 16 && kv_len < 0x80 && !key.is_empty() {
        let mut head = [0u8; 4 + 128 + 4];
        head[0] = (tag << 3 | WireType::LengthDelimited as u32) as u8;
        head[1] = kv_len as u8;
        head[2] = 1 << 3 | WireType::LengthDelimited as u8;
        head[3] = key.len() as u8;
        head[4..4 + key.len()].copy_from_slice(key.as_bytes());
        let mut n = 4 + key.len();
        head[n..n + 4].copy_from_slice(&[
            2 << 3 | WireType::LengthDelimited as u8,
            any_len as u8,
            1 << 3 | WireType::LengthDelimited as u8,
            value.len() as u8,
        ]);
        n += 4;
        out.reserve(n + value.len());
        out.extend_from_slice(&head[..n]);
        out.extend_from_slice(value.as_bytes());
        return;
    }
    key_value_head(out, tag, key, any_len);
    bytes_field(out, 1, value.as_bytes(), true);
}

/// A `KeyValue` holding a number, a flag or a list of strings.
fn attribute_other(out: &mut Vec<u8>, tag: u32, key: &str, value: &Attr) {
    key_value_head(out, tag, key, attr_len(value));
    match value {
        Attr::Static(_) | Attr::Text(_) | Attr::Held(..) => {}
        Attr::Int(i) => {
            field_key(out, 3, WireType::Varint);
            varint(out, *i as u64);
        }
        Attr::Bool(b) => {
            field_key(out, 2, WireType::Varint);
            varint(out, u64::from(*b));
        }
        Attr::Texts(v) => {
            field_key(out, 5, WireType::LengthDelimited);
            varint(out, texts_len(v) as u64);
            for s in v {
                field_key(out, 1, WireType::LengthDelimited);
                varint(out, one_string_len(s) as u64);
                bytes_field(out, 1, s.as_bytes(), true);
            }
        }
    }
}

/// The length of the `AnyValue` holding `value`.
fn attr_len(value: &Attr) -> usize {
    match value {
        // Written by `text_attribute`, which sizes them itself.
        Attr::Static(_) | Attr::Text(_) | Attr::Held(..) => 0,
        Attr::Int(i) => 1 + encoded_len_varint(*i as u64),
        Attr::Bool(_) => 2,
        Attr::Texts(v) => {
            let len = texts_len(v);
            1 + encoded_len_varint(len as u64) + len
        }
    }
}

/// The content of an `ArrayValue` of strings.
fn texts_len(v: &[String]) -> usize {
    v.iter()
        .map(|s| {
            let item = one_string_len(s);
            1 + encoded_len_varint(item as u64) + item
        })
        .sum()
}

/// A `KeyValue` message as field `tag`; its value is always present, as the library writes it.
fn key_value(out: &mut Vec<u8>, tag: u32, key: &str, value: &Value) {
    key_value_head(out, tag, key, any_value_len(value));
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
    use crate::record::{Attrs, SpanRecord};
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId};
    use opentelemetry::{InstrumentationScope, KeyValue};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use prost::Message;
    use std::borrow::Cow;
    use std::time::Duration;

    fn context(trace: u128, span: u64, state: &str) -> SpanContext {
        SpanContext::new(
            TraceId::from(trace),
            SpanId::from(span),
            TraceFlags::SAMPLED,
            false,
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
    fn attributes() -> Attrs {
        vec![
            ("gen_ai.request.model", Attr::Static("gpt-4o-mini")),
            ("owned", Attr::Text("mock-gpt".into())),
            ("empty", Attr::Static("")),
            ("long", Attr::Text("x".repeat(300))),
            ("gen_ai.usage.input_tokens", Attr::Int(1234)),
            ("zero", Attr::Int(0)),
            ("negative", Attr::Int(-7)),
            ("yes", Attr::Bool(true)),
            ("no", Attr::Bool(false)),
            (
                "gen_ai.response.finish_reasons",
                Attr::Texts(vec!["stop".into(), String::new()]),
            ),
            ("none", Attr::Texts(vec![])),
        ]
    }

    fn span(n: u64) -> SpanRecord {
        let start = UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789 + n);
        let parent = context(0x0af7651916cd43dd8448eb211c80319c, 99, "");
        let mut span = SpanRecord::start(
            context(
                0x0af7651916cd43dd8448eb211c80319c,
                n + 1,
                if n == 0 { "a=1,b=2" } else { "" },
            ),
            (n > 0).then_some((&parent, n == 3)),
            if n == 2 {
                Cow::Borrowed("gateway.admission")
            } else {
                Cow::Owned(format!("span {n}"))
            },
            [
                SpanKind::Server,
                SpanKind::Internal,
                SpanKind::Client,
                SpanKind::Producer,
                SpanKind::Consumer,
            ][n as usize % 5]
                .clone(),
            start,
            4,
        );
        span.end = start + Duration::from_micros(250);
        if n != 4 {
            span.attributes = attributes();
            // Text held in the span's buffer: short, empty, past a one-byte length, and a key
            // too long for the one-piece head.
            span.set_str("gateway.request_id", "req_0123456789abcdef");
            span.set_str("held.empty", "");
            span.set_str("held.long", &"z".repeat(200));
            span.set_str(LONG_KEY, "v");
        }
        span.event(
            "gateway.first_byte",
            start + Duration::from_millis(3),
            vec![("gateway.ttfb_ms", Attr::Int(n as i64))],
        );
        span.event("gateway.settle", start, Vec::new());
        span.error = match n % 3 {
            0 => None,
            1 => Some(Cow::Borrowed("upstream_error")),
            _ => Some(Cow::Owned(String::new())),
        };
        span
    }

    const LONG_KEY: &str =
        "long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.k";

    fn scope() -> InstrumentationScope {
        InstrumentationScope::builder("gateway").build()
    }

    /// What `opentelemetry-otlp` would send for the same spans.
    fn library(spans: &[SpanRecord], resource: &Resource) -> ExportTraceServiceRequest {
        let scope = scope();
        ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                spans.iter().map(|s| s.to_span_data(&scope)).collect(),
                &ResourceAttributesWithSchema::from(resource),
            ),
        }
    }

    fn ours(spans: &[SpanRecord], resource: &Resource) -> ExportTraceServiceRequest {
        let mut out = Vec::new();
        export_request(
            &mut out,
            &super::resource(resource),
            resource.schema_url().unwrap_or_default(),
            "gateway",
            spans,
        );
        ExportTraceServiceRequest::decode(out.as_slice()).unwrap()
    }

    #[test]
    fn a_batch_decodes_to_what_the_library_would_send() {
        let resource = Resource::builder()
            .with_service_name("llm-gateway")
            .with_schema_url(
                [KeyValue::new("deployment.environment", "test")],
                "https://opentelemetry.io/schemas/1.30.0",
            )
            .build();
        let spans: Vec<SpanRecord> = (0..6).map(span).collect();
        let got = ours(&spans, &resource);
        assert_eq!(got, library(&spans, &resource));
        assert_eq!(got.resource_spans[0].scope_spans.len(), 1);
        assert_eq!(got.resource_spans[0].scope_spans[0].spans.len(), 6);
    }

    #[test]
    fn one_span_and_none_decode_as_the_library_sends_them() {
        let resource = Resource::builder_empty().build();
        let one = vec![span(4)];
        assert_eq!(ours(&one, &resource), library(&one, &resource));
        assert_eq!(ours(&[], &resource), library(&[], &resource));
    }

    #[test]
    fn a_span_past_a_two_byte_length_closes_right() {
        let resource = Resource::builder().with_service_name("g").build();
        let mut big = span(0);
        big.set("big", "y".repeat(70_000));
        let spans: Vec<SpanRecord> = (0..3).map(|_| big.clone()).collect();
        assert_eq!(ours(&spans, &resource), library(&spans, &resource));
    }

    #[test]
    fn resource_values_of_every_kind_decode_as_the_library_sends_them() {
        let resource = Resource::builder_empty()
            .with_attributes([
                KeyValue::new("s", "v"),
                KeyValue::new("i", -3_i64),
                KeyValue::new("f", 0.25_f64),
                KeyValue::new("b", false),
                KeyValue::new("a", Value::Array(Array::I64(vec![0, 1, i64::MAX]))),
                KeyValue::new("fs", Value::Array(Array::F64(vec![0.0, 1.5]))),
                KeyValue::new("bs", Value::Array(Array::Bool(vec![true, false]))),
            ])
            .build();
        let one = vec![span(1)];
        assert_eq!(ours(&one, &resource), library(&one, &resource));
    }
}
