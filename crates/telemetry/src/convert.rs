//! The spans of a written batch back in the SDK's form, for the exports that
//! `opentelemetry-otlp` sends (OTLP/HTTP with JSON, OTLP/gRPC): they take the SDK's span data,
//! and the request threads write only the wire form ([`crate::wire`]). These exports are the
//! less common choice, so the decoding is theirs to pay; protobuf over HTTP sends the bytes as
//! written.

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::trace::{
    Event, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Array, InstrumentationScope, Key, KeyValue, StringValue, Value};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue as ProtoKeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use prost::Message;

use crate::wire::IS_REMOTE;

/// The spans of the export request `body` (as [`crate::wire::export_request`] writes it), in
/// the SDK's form under `scope`.
pub fn span_data(body: &[u8], scope: &InstrumentationScope) -> Result<Vec<SpanData>, String> {
    let request = ExportTraceServiceRequest::decode(body).map_err(|e| e.to_string())?;
    Ok(request
        .resource_spans
        .into_iter()
        .flat_map(|r| r.scope_spans)
        .flat_map(|s| s.spans)
        .map(|span| one(span, scope))
        .collect())
}

fn one(span: Span, scope: &InstrumentationScope) -> SpanData {
    let trace_id = TraceId::from_bytes(span.trace_id.try_into().unwrap_or_default());
    let span_id = SpanId::from_bytes(span.span_id.try_into().unwrap_or_default());
    let parent_span_id = span
        .parent_span_id
        .try_into()
        .map_or(SpanId::INVALID, SpanId::from_bytes);
    let trace_state = span.trace_state.parse().unwrap_or(TraceState::NONE);
    let flags = TraceFlags::new((span.flags & 0xff) as u8);
    let mut events = SpanEvents::default();
    events.events = span
        .events
        .into_iter()
        .map(|e| Event::new(e.name, time(e.time_unix_nano), key_values(e.attributes), 0))
        .collect();
    SpanData {
        span_context: SpanContext::new(trace_id, span_id, flags, false, trace_state),
        parent_span_id,
        parent_span_is_remote: span.flags & IS_REMOTE != 0,
        span_kind: match span.kind {
            2 => SpanKind::Server,
            3 => SpanKind::Client,
            4 => SpanKind::Producer,
            5 => SpanKind::Consumer,
            _ => SpanKind::Internal,
        },
        name: Cow::Owned(span.name),
        start_time: time(span.start_time_unix_nano),
        end_time: time(span.end_time_unix_nano),
        attributes: key_values(span.attributes),
        dropped_attributes_count: 0,
        events,
        links: SpanLinks::default(),
        status: match span.status {
            Some(s) if s.code == 2 => Status::error(s.message),
            Some(s) if s.code == 1 => Status::Ok,
            _ => Status::Unset,
        },
        instrumentation_scope: scope.clone(),
    }
}

fn time(nanos: u64) -> SystemTime {
    crate::record::Timestamp(nanos).into()
}

fn key_values(kvs: Vec<ProtoKeyValue>) -> Vec<KeyValue> {
    kvs.into_iter()
        .map(|kv| KeyValue::new(Key::from(kv.key), value(kv.value)))
        .collect()
}

/// The SDK's value for what the gateway writes: strings, integers, flags, lists of strings.
fn value(v: Option<AnyValue>) -> Value {
    match v.and_then(|v| v.value) {
        Some(Any::BoolValue(b)) => Value::Bool(b),
        Some(Any::IntValue(i)) => Value::I64(i),
        Some(Any::DoubleValue(f)) => Value::F64(f),
        Some(Any::StringValue(s)) => Value::from(s),
        Some(Any::ArrayValue(a)) => Value::Array(Array::String(
            a.values
                .into_iter()
                .map(|item| match item.value {
                    Some(Any::StringValue(s)) => StringValue::from(s),
                    _ => StringValue::from(""),
                })
                .collect(),
        )),
        _ => Value::from(""),
    }
}
