//! Spans in the OTLP protobuf wire form: an attribute or event when it is set ([`attribute`],
//! [`event`]), a span when it ends ([`span`]), and the body of an OTLP/HTTP export request
//! (`ExportTraceServiceRequest`) around a batch of them ([`export_request`]).
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

use crate::record::{Attr, SpanRecord, Timestamp};
use opentelemetry::trace::SpanKind;
use opentelemetry::{Array, Value};
use opentelemetry_sdk::Resource;
use prost::encoding::{encode_varint, encoded_len_varint, WireType};

/// Room kept for a message's length until it is known: a varint of up to 2^35 - 1 bytes.
const LEN_ROOM: usize = 5;

/// `SpanFlags`: the span's parent is known to be local or remote (OTLP 1.3).
const HAS_IS_REMOTE: u32 = 0x100;
/// `SpanFlags`: the span's parent is remote.
pub(crate) const IS_REMOTE: u32 = 0x200;

/// The `Resource` message of the process, written once when the exporter learns it.
pub fn resource(resource: &Resource) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in resource.iter() {
        key_value(&mut out, 1, k.as_str(), v);
    }
    out
}

/// Field number of a `Span`'s attributes.
pub(crate) const SPAN_ATTRIBUTE: u32 = 9;

/// The export request for the spans written in `chunks` (each a run of `spans` fields, as
/// [`span`] writes them), under the resource written by [`resource`] and its schema URL, all
/// in the instrumentation scope named `scope`.
pub fn export_request(
    out: &mut Vec<u8>,
    resource: &[u8],
    schema_url: &str,
    scope: &str,
    chunks: &[&[u8]],
) {
    out.clear();
    let resource_spans = open(out, 1);
    bytes_field(out, 1, resource, true);
    if chunks.iter().any(|c| !c.is_empty()) {
        let scope_spans = open(out, 2);
        let head = open(out, 1);
        string(out, 1, scope);
        close(out, head);
        for chunk in chunks {
            out.extend_from_slice(chunk);
        }
        close_in_place(out, scope_spans);
    }
    string(out, 3, schema_url);
    close_in_place(out, resource_spans);
}

/// Where the first `n` spans written in `bytes` (a run of [`span`]'s fields) end, and how many
/// there were (fewer than `n` when `bytes` holds fewer, or is not such a run).
pub(crate) fn after_spans(bytes: &[u8], n: usize) -> (usize, usize) {
    let (mut at, mut seen) = (0, 0);
    while seen < n && bytes.get(at) == Some(&(2 << 3 | WireType::LengthDelimited as u8)) {
        let mut rest = &bytes[at + 1..];
        let before = rest.len();
        let Ok(len) = prost::encoding::decode_varint(&mut rest) else {
            break;
        };
        let end = at + 1 + (before - rest.len()) + len as usize;
        if end > bytes.len() {
            break;
        }
        at = end;
        seen += 1;
    }
    (at, seen)
}

/// `span` as one `spans` field (2) of a `ScopeSpans` message, its length summed first so that
/// nothing is moved once written.
pub(crate) fn span(out: &mut Vec<u8>, span: &SpanRecord) {
    let cx = &span.context;
    let state = crate::tracestate(cx.trace_state());
    let state = state.as_deref().unwrap_or_default();
    let has_parent = span.parent_span_id != opentelemetry::trace::SpanId::INVALID;
    let kind = kind(&span.kind);
    let (code, message) = match &span.error {
        None => (0, ""),
        Some(description) => (2, description.as_ref()),
    };
    let status_len = string_len(2, message) + uint_len(3, code);
    let (start, end) = (span.start.0, span.end.0);
    let len = 18
        + 10
        + string_len(3, state)
        + if has_parent { 10 } else { 0 }
        + string_len(5, &span.name)
        + uint_len(6, kind)
        + fixed64_len(start)
        + fixed64_len(end)
        + span.fields.len()
        + 1
        + encoded_len_varint(status_len as u64)
        + status_len
        // The flags: field 16's key takes two bytes.
        + 6;
    out.reserve(len + 1 + LEN_ROOM);
    field_key(out, 2, WireType::LengthDelimited);
    varint(out, len as u64);
    let from = out.len();
    // The ids: fields 1 and 2, sixteen and eight bytes.
    let mut ids = [0u8; 28];
    ids[0] = 1 << 3 | WireType::LengthDelimited as u8;
    ids[1] = 16;
    ids[2..18].copy_from_slice(&cx.trace_id().to_bytes());
    ids[18] = 2 << 3 | WireType::LengthDelimited as u8;
    ids[19] = 8;
    ids[20..28].copy_from_slice(&cx.span_id().to_bytes());
    out.extend_from_slice(&ids);
    string(out, 3, state);
    if has_parent {
        let mut parent = [
            4 << 3 | WireType::LengthDelimited as u8,
            8,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        ];
        parent[2..].copy_from_slice(&span.parent_span_id.to_bytes());
        out.extend_from_slice(&parent);
    }
    string(out, 5, &span.name);
    uint(out, 6, kind);
    fixed64(out, 7, start);
    fixed64(out, 8, end);
    out.extend_from_slice(&span.fields);
    field_key(out, 15, WireType::LengthDelimited);
    varint(out, status_len as u64);
    string(out, 2, message);
    uint(out, 3, code);
    // Never zero: `HAS_IS_REMOTE` is always set.
    fixed32(
        out,
        16,
        flags(span.parent_is_remote, u32::from(cx.trace_flags().to_u8())),
    );
    debug_assert_eq!(out.len() - from, len, "a span's length summed wrong");
}

fn fixed64_len(v: u64) -> usize {
    if v == 0 {
        0
    } else {
        9
    }
}

/// An `Event` (field 11 of a `Span`) named `name` at `at`.
pub(crate) fn event(out: &mut Vec<u8>, name: &str, at: Timestamp, attributes: &[(&str, Attr<'_>)]) {
    // Summed first, so that the event is written in place (most have no attributes).
    let at = at.0;
    let len = fixed64_len(at)
        + string_len(2, name)
        + attributes
            .iter()
            .map(|(k, v)| attribute_len(3, k, *v))
            .sum::<usize>();
    field_key(out, 11, WireType::LengthDelimited);
    varint(out, len as u64);
    let from = out.len();
    fixed64(out, 1, at);
    string(out, 2, name);
    for (k, v) in attributes {
        attribute(out, 3, k, *v);
    }
    debug_assert_eq!(out.len() - from, len, "an event's length summed wrong");
}

/// A `Span`'s name (field 5) made of `a`, a space and `b`.
pub(crate) fn spaced_name(out: &mut Vec<u8>, a: &str, b: &str) {
    let len = a.len() + 1 + b.len();
    field_key(out, 5, WireType::LengthDelimited);
    varint(out, len as u64);
    out.reserve(len);
    out.extend_from_slice(a.as_bytes());
    out.push(b' ');
    out.extend_from_slice(b.as_bytes());
}

/// The bytes [`attribute`] writes for `key` and `value` as field `tag`.
fn attribute_len(tag: u32, key: &str, value: Attr<'_>) -> usize {
    let kv_len = key_value_len(key, attr_len(value));
    key_len(tag) + encoded_len_varint(kv_len as u64) + kv_len
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
    let len = key_value_len(key, value_len);
    field_key(out, tag, WireType::LengthDelimited);
    varint(out, len as u64);
    string(out, 1, key);
    field_key(out, 2, WireType::LengthDelimited);
    varint(out, value_len as u64);
}

/// The content of a `KeyValue` message: `key`, and a value whose `AnyValue` is `value_len` bytes.
fn key_value_len(key: &str, value_len: usize) -> usize {
    string_len(1, key) + key_len(2) + encoded_len_varint(value_len as u64) + value_len
}

/// A `KeyValue` message holding one of the gateway's attributes, as field `tag`: the same
/// bytes [`key_value`] writes for the SDK's value of it.
#[inline]
pub(crate) fn attribute(out: &mut Vec<u8>, tag: u32, key: &str, value: Attr<'_>) {
    match value {
        Attr::Str(s) => text_attribute(out, tag, key, s),
        other => attribute_other(out, tag, key, other),
    }
}

/// A `KeyValue` holding a string, most of a span's attributes. Where every length fits one
/// varint byte (keys and values under 128 bytes, as ids and names are) its head is eight bytes
/// known at once, written around the key in two pieces.
#[inline]
fn text_attribute(out: &mut Vec<u8>, tag: u32, key: &str, value: &str) {
    // AnyValue { string_value = 1 } holding `value`; KeyValue { key = 1, value = 2 }.
    let any_len = 1 + encoded_len_varint(value.len() as u64) + value.len();
    let kv_len = 2 + key.len() + 1 + encoded_len_varint(any_len as u64) + any_len;
    if tag < 16 && kv_len < 0x80 && !key.is_empty() {
        short_key(out, tag, key, kv_len);
        out.extend_from_slice(&[
            2 << 3 | WireType::LengthDelimited as u8,
            any_len as u8,
            1 << 3 | WireType::LengthDelimited as u8,
            value.len() as u8,
        ]);
        out.extend_from_slice(value.as_bytes());
        return;
    }
    key_value_head(out, tag, key, any_len);
    bytes_field(out, 1, value.as_bytes(), true);
}

/// The start of a `KeyValue` of `kv_len` bytes (under 128) as field `tag` (under 16), and its
/// key (under 128 bytes): room is kept for all of it.
#[inline]
fn short_key(out: &mut Vec<u8>, tag: u32, key: &str, kv_len: usize) {
    out.reserve(2 + kv_len);
    out.extend_from_slice(&[
        (tag << 3 | WireType::LengthDelimited as u32) as u8,
        kv_len as u8,
        1 << 3 | WireType::LengthDelimited as u8,
        key.len() as u8,
    ]);
    out.extend_from_slice(key.as_bytes());
}

/// A `KeyValue` holding an integer, written in one piece where its key is short (as the
/// gateway's are); `false` when it was not written.
#[inline]
fn int_attribute(out: &mut Vec<u8>, tag: u32, key: &str, value: i64) -> bool {
    let digits = encoded_len_varint(value as u64);
    let any_len = 1 + digits;
    let kv_len = 2 + key.len() + 2 + any_len;
    if tag >= 16 || kv_len >= 0x80 || key.is_empty() {
        return false;
    }
    short_key(out, tag, key, kv_len);
    out.extend_from_slice(&[
        2 << 3 | WireType::LengthDelimited as u8,
        any_len as u8,
        3 << 3 | WireType::Varint as u8,
    ]);
    varint(out, value as u64);
    true
}

/// A `KeyValue` holding a flag, written in one piece where its key is short; `false` when it
/// was not written.
fn short_flag(out: &mut Vec<u8>, tag: u32, key: &str, value: bool) -> bool {
    // AnyValue { bool_value = 2 }: two bytes.
    let kv_len = 2 + key.len() + 2 + 2;
    if tag >= 16 || kv_len >= 0x80 || key.is_empty() {
        return false;
    }
    short_key(out, tag, key, kv_len);
    out.extend_from_slice(&[
        2 << 3 | WireType::LengthDelimited as u8,
        2,
        2 << 3 | WireType::Varint as u8,
        u8::from(value),
    ]);
    true
}

/// A `KeyValue` holding a number, a flag or a list of strings.
fn attribute_other(out: &mut Vec<u8>, tag: u32, key: &str, value: Attr<'_>) {
    match value {
        Attr::Int(i) if int_attribute(out, tag, key, i) => return,
        // A flag's value is one varint byte, as an integer under 128 is.
        Attr::Bool(b) if short_flag(out, tag, key, b) => return,
        _ => {}
    }
    key_value_head(out, tag, key, attr_len(value));
    match value {
        Attr::Str(s) => bytes_field(out, 1, s.as_bytes(), true),
        Attr::Int(i) => {
            field_key(out, 3, WireType::Varint);
            varint(out, i as u64);
        }
        Attr::Bool(b) => {
            field_key(out, 2, WireType::Varint);
            varint(out, u64::from(b));
        }
        Attr::Strs(v) => {
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
fn attr_len(value: Attr<'_>) -> usize {
    match value {
        Attr::Str(s) => one_string_len(s),
        Attr::Int(i) => 1 + encoded_len_varint(i as u64),
        Attr::Bool(_) => 2,
        Attr::Strs(v) => {
            let len = texts_len(v);
            1 + encoded_len_varint(len as u64) + len
        }
    }
}

/// The content of an `ArrayValue` of strings.
fn texts_len(v: &[std::borrow::Cow<'_, str>]) -> usize {
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
    use crate::record::SpanRecord;
    use opentelemetry::trace::{
        Event, SpanContext, SpanId, Status, TraceFlags, TraceId, TraceState,
    };
    use opentelemetry::{InstrumentationScope, KeyValue, StringValue};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
    use prost::Message;
    use std::borrow::Cow;
    use std::time::Duration;
    use std::time::{SystemTime, UNIX_EPOCH};

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

    /// An attribute in the test's own terms, set on a record and given to the SDK alike.
    #[derive(Clone)]
    enum V {
        S(String),
        I(i64),
        B(bool),
        L(Vec<Cow<'static, str>>),
    }

    impl V {
        fn attr(&self) -> Attr<'_> {
            match self {
                V::S(s) => Attr::Str(s),
                V::I(i) => Attr::Int(*i),
                V::B(b) => Attr::Bool(*b),
                V::L(v) => Attr::Strs(v),
            }
        }

        fn value(&self) -> Value {
            match self {
                V::S(s) => Value::from(s.clone()),
                V::I(i) => Value::I64(*i),
                V::B(b) => Value::Bool(*b),
                V::L(v) => Value::Array(Array::String(
                    v.iter().map(|s| StringValue::from(s.to_string())).collect(),
                )),
            }
        }
    }

    const LONG_KEY: &str =
        "long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.long.k";

    /// Every kind of value an attribute can hold, defaults (which proto3 would leave out of
    /// a plain field), long strings (lengths past one varint byte) and a key too long for the
    /// one-piece head among them.
    fn attributes() -> Vec<(String, V)> {
        let s = |v: &str| V::S(v.to_owned());
        vec![
            ("gen_ai.request.model".into(), s("gpt-4o-mini")),
            ("empty".into(), s("")),
            ("long".into(), V::S("x".repeat(300))),
            ("gateway.request_id".into(), s("req_0123456789abcdef")),
            ("gen_ai.usage.input_tokens".into(), V::I(1234)),
            ("zero".into(), V::I(0)),
            ("negative".into(), V::I(-7)),
            ("big".into(), V::I(i64::MAX)),
            ("yes".into(), V::B(true)),
            ("no".into(), V::B(false)),
            (
                "gen_ai.response.finish_reasons".into(),
                V::L(vec!["stop".into(), Cow::Owned(String::new())]),
            ),
            ("none".into(), V::L(vec![])),
            (LONG_KEY.into(), s("v")),
            (LONG_KEY.into(), V::I(3)),
        ]
    }

    /// An event: its name, when, and its attributes.
    type EventSpec = (&'static str, SystemTime, Vec<(String, V)>);

    /// One span, as the test describes it.
    struct Spec {
        context: SpanContext,
        parent: Option<(SpanContext, bool)>,
        name: Cow<'static, str>,
        kind: SpanKind,
        start: SystemTime,
        end: SystemTime,
        attributes: Vec<(String, V)>,
        events: Vec<EventSpec>,
        error: Option<Cow<'static, str>>,
    }

    fn spec(n: u64) -> Spec {
        let start = UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789 + n);
        let trace = 0x0af7651916cd43dd8448eb211c80319c;
        Spec {
            context: context(trace, n + 1, if n == 0 { "a=1,b=2" } else { "" }),
            parent: (n > 0).then(|| (context(trace, 99, ""), n == 3)),
            name: if n == 2 {
                Cow::Borrowed("gateway.admission")
            } else {
                Cow::Owned(format!("span {n}"))
            },
            kind: [
                SpanKind::Server,
                SpanKind::Internal,
                SpanKind::Client,
                SpanKind::Producer,
                SpanKind::Consumer,
            ][n as usize % 5]
                .clone(),
            start,
            end: start + Duration::from_micros(250),
            attributes: if n == 4 { Vec::new() } else { attributes() },
            events: vec![
                (
                    "gateway.first_byte",
                    start + Duration::from_millis(3),
                    vec![("gateway.ttfb_ms".into(), V::I(n as i64))],
                ),
                ("gateway.settle", start, Vec::new()),
            ],
            error: match n % 3 {
                0 => None,
                1 => Some(Cow::Borrowed("upstream_error")),
                _ => Some(Cow::Owned(String::new())),
            },
        }
    }

    fn record(spec: &Spec) -> SpanRecord {
        let mut span = SpanRecord::start(
            spec.context.clone(),
            spec.parent.as_ref().map(|(p, remote)| (p, *remote)),
            spec.name.clone(),
            spec.kind.clone(),
            spec.start.into(),
        );
        span.end = spec.end.into();
        for (k, v) in &spec.attributes {
            span.set(k, v.attr());
        }
        for (name, at, attrs) in &spec.events {
            let attrs: Vec<(&str, Attr<'_>)> =
                attrs.iter().map(|(k, v)| (k.as_str(), v.attr())).collect();
            span.event(name, (*at).into(), &attrs);
        }
        span.error = spec.error.clone();
        span
    }

    /// The SDK's form of the same span: what `opentelemetry-otlp` converts and sends.
    fn data(spec: &Spec, scope: &InstrumentationScope) -> SpanData {
        let kvs = |attrs: &[(String, V)]| -> Vec<KeyValue> {
            attrs
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.value()))
                .collect()
        };
        let mut events = SpanEvents::default();
        events.events = spec
            .events
            .iter()
            .map(|(name, at, attrs)| Event::new(*name, *at, kvs(attrs), 0))
            .collect();
        SpanData {
            span_context: spec.context.clone(),
            parent_span_id: spec
                .parent
                .as_ref()
                .map_or(SpanId::INVALID, |(p, _)| p.span_id()),
            parent_span_is_remote: spec.parent.as_ref().is_some_and(|(_, remote)| *remote),
            span_kind: spec.kind.clone(),
            name: spec.name.clone(),
            start_time: spec.start,
            end_time: spec.end,
            attributes: kvs(&spec.attributes),
            dropped_attributes_count: 0,
            events,
            links: SpanLinks::default(),
            status: match &spec.error {
                Some(description) => Status::error(description.clone()),
                None => Status::Unset,
            },
            instrumentation_scope: scope.clone(),
        }
    }

    fn scope() -> InstrumentationScope {
        InstrumentationScope::builder("gateway").build()
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

    /// The body written here, from the spans' records in `chunks` (as threads write them).
    fn body(specs: &[Spec], chunks: usize, resource: &Resource) -> Vec<u8> {
        let mut written = vec![Vec::new(); chunks.max(1)];
        for (i, s) in specs.iter().enumerate() {
            record(s).encode(&mut written[i % chunks.max(1)]);
        }
        let chunks: Vec<&[u8]> = written.iter().map(Vec::as_slice).collect();
        let mut out = Vec::new();
        export_request(
            &mut out,
            &super::resource(resource),
            resource.schema_url().unwrap_or_default(),
            "gateway",
            &chunks,
        );
        out
    }

    fn ours(specs: &[Spec], resource: &Resource) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest::decode(body(specs, 1, resource).as_slice()).unwrap()
    }

    fn sdk(specs: &[Spec], resource: &Resource) -> ExportTraceServiceRequest {
        library(specs.iter().map(|s| data(s, &scope())).collect(), resource)
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
        let specs: Vec<Spec> = (0..6).map(spec).collect();
        let got = ours(&specs, &resource);
        assert_eq!(got, sdk(&specs, &resource));
        assert_eq!(got.resource_spans[0].scope_spans.len(), 1);
        assert_eq!(got.resource_spans[0].scope_spans[0].spans.len(), 6);
    }

    #[test]
    fn spans_written_by_several_threads_make_one_batch() {
        let resource = Resource::builder().with_service_name("g").build();
        let specs: Vec<Spec> = (0..6).map(spec).collect();
        let got = ExportTraceServiceRequest::decode(body(&specs, 3, &resource).as_slice()).unwrap();
        let spans = &got.resource_spans[0].scope_spans[0].spans;
        assert_eq!(spans.len(), 6);
        // Chunk by chunk: spans 0 and 3, then 1 and 4, then 2 and 5.
        let ids: Vec<u8> = spans.iter().map(|s| s.span_id[7]).collect();
        assert_eq!(ids, [1, 4, 2, 5, 3, 6]);
    }

    #[test]
    fn one_span_and_none_decode_as_the_library_sends_them() {
        let resource = Resource::builder_empty().build();
        let one = vec![spec(4)];
        assert_eq!(ours(&one, &resource), sdk(&one, &resource));
        assert_eq!(ours(&[], &resource), sdk(&[], &resource));
    }

    #[test]
    fn a_span_past_a_two_byte_length_closes_right() {
        let resource = Resource::builder().with_service_name("g").build();
        let specs: Vec<Spec> = (0..3)
            .map(|_| {
                let mut s = spec(0);
                s.attributes.push(("big".into(), V::S("y".repeat(70_000))));
                s
            })
            .collect();
        assert_eq!(ours(&specs, &resource), sdk(&specs, &resource));
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
        let one = vec![spec(1)];
        assert_eq!(ours(&one, &resource), sdk(&one, &resource));
    }

    #[test]
    fn a_run_of_spans_splits_at_span_boundaries() {
        let mut run = Vec::new();
        let mut ends = Vec::new();
        for n in 0..5 {
            let mut s = spec(n);
            if n == 2 {
                // Past a two-byte length.
                s.attributes.push(("big".into(), V::S("y".repeat(20_000))));
            }
            record(&s).encode(&mut run);
            ends.push(run.len());
        }
        assert_eq!(after_spans(&run, 0), (0, 0));
        for n in 1..=5 {
            assert_eq!(after_spans(&run, n), (ends[n - 1], n));
        }
        assert_eq!(after_spans(&run, 9), (run.len(), 5));
        // A cut run stops at the last whole span.
        assert_eq!(after_spans(&run[..ends[3] - 1], 5), (ends[2], 3));
        assert_eq!(after_spans(b"garbage", 2), (0, 0));
    }

    /// The JSON and gRPC exports read the written spans back into the SDK's form: the library
    /// converts that back into the same request.
    #[test]
    fn written_spans_read_back_into_the_sdks_form() {
        let resource = Resource::builder_empty().build();
        let specs: Vec<Spec> = (0..6).map(spec).collect();
        let back = crate::convert::span_data(&body(&specs, 2, &resource), &scope()).unwrap();
        assert_eq!(back.len(), 6);
        let mut want: Vec<SpanData> = specs.iter().map(|s| data(s, &scope())).collect();
        // The chunks put spans 0, 2, 4 first.
        want = [0, 2, 4, 1, 3, 5]
            .iter()
            .map(|&i| std::mem::replace(&mut want[i], data(&specs[i], &scope())))
            .collect();
        assert_eq!(library(back, &resource), library(want, &resource));
    }
}
