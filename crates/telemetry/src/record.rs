//! A span as the request threads record it: ids, times and name as plain data, its attributes
//! and events written in their OTLP wire form as they are set ([`crate::wire`]).
//!
//! Building spans through the SDK's tracer (its span builder, the sampler behind a trait
//! object, an owned `KeyValue` per attribute, a queue hand-off per span) and then taking them
//! apart again for the wire put most of what tracing costs on the request threads. Here an
//! attribute costs its bytes, a span ends by being written into its thread's batch
//! ([`crate::export`]), and nothing per attribute is allocated, handed to another thread or
//! freed there. The JSON and gRPC exports read the same bytes back
//! ([`crate::convert`]); the tests hold the bytes to `opentelemetry-proto`'s own conversion of
//! the SDK's form of the same spans.

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, TraceFlags, TraceId, TraceState};

use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

use crate::wire;

/// An attribute's value, in the shapes the gateway records; borrowed, as it is written into
/// the span's wire form when it is set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Attr<'a> {
    Str(&'a str),
    Int(i64),
    Bool(bool),
    Strs(&'a [Cow<'a, str>]),
}

impl<'a> From<&'a str> for Attr<'a> {
    fn from(s: &'a str) -> Self {
        Attr::Str(s)
    }
}

impl<'a> From<&'a String> for Attr<'a> {
    fn from(s: &'a String) -> Self {
        Attr::Str(s)
    }
}

impl From<i64> for Attr<'_> {
    fn from(i: i64) -> Self {
        Attr::Int(i)
    }
}

impl From<bool> for Attr<'_> {
    fn from(b: bool) -> Self {
        Attr::Bool(b)
    }
}

impl<'a, 'b: 'a> From<&'a [Cow<'b, str>]> for Attr<'a> {
    fn from(v: &'a [Cow<'b, str>]) -> Self {
        Attr::Strs(v)
    }
}

/// A moment as OTLP writes it: nanoseconds since the Unix epoch.
///
/// A span reads the clock several times; `SystemTime` would then be taken apart again
/// (`duration_since(UNIX_EPOCH)`, checked at every step) for each moment written, which is
/// most of what a clock read costs here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// The wall clock now.
    #[inline]
    pub fn now() -> Self {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `t` is a valid `timespec` to write to; `CLOCK_REALTIME` always exists, so
        // the call cannot fail (`t` would stay the epoch if it did).
        unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut t) };
        let nanos = u64::try_from(t.tv_sec)
            .unwrap_or(0)
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::try_from(t.tv_nsec).unwrap_or(0));
        Timestamp(nanos)
    }
}

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Self {
        Timestamp(
            t.duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }
}

impl From<Timestamp> for SystemTime {
    fn from(t: Timestamp) -> Self {
        UNIX_EPOCH + Duration::from_nanos(t.0)
    }
}

impl std::ops::Add<Duration> for Timestamp {
    type Output = Timestamp;
    fn add(self, d: Duration) -> Timestamp {
        Timestamp(
            self.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }
}

/// The room a span's fields start with: a server span's fit.
const FIELD_ROOM: usize = 1024;

/// One sampled span, its attributes and events already in their wire form.
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
    pub start: Timestamp,
    pub end: Timestamp,
    /// The attributes and events set so far, as the span's `KeyValue` and `Event` fields (and
    /// its name, when given in parts: [`SpanRecord::set_name_spaced`]): written when set, so
    /// that nothing is kept per attribute and nothing is left to convert when the span ends.
    /// A message's fields may come in any order, and each repeated field keeps its own.
    pub(crate) fields: Vec<u8>,
    /// The status's description when the span failed (`Status::Error`); unset otherwise.
    pub error: Option<Cow<'static, str>>,
}

impl SpanRecord {
    /// A span started at `start` under `parent` (a root when `parent` is `None`).
    pub fn start(
        context: SpanContext,
        parent: Option<(&SpanContext, bool)>,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
        start: Timestamp,
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
            fields: Vec::new(),
            error: None,
        }
    }

    #[inline]
    pub fn set<'a>(&mut self, key: &str, value: impl Into<Attr<'a>>) {
        wire::attribute(self.room(), wire::SPAN_ATTRIBUTE, key, value.into());
    }

    /// Names the span `a b` (`chat gpt-4o`), written in its wire form beside the attributes
    /// rather than built as a `String` to be copied again when the span ends; it stands in for
    /// `name`, which is emptied.
    pub fn set_name_spaced(&mut self, a: &str, b: &str) {
        self.name = Cow::Borrowed("");
        wire::spaced_name(self.room(), a, b);
    }

    /// Sets every attribute of `attributes` at once.
    pub fn set_all(&mut self, attributes: &Attributes) {
        self.room().extend_from_slice(&attributes.0);
    }

    /// The span's fields, given a server span's room when the first is set.
    #[inline]
    fn room(&mut self) -> &mut Vec<u8> {
        if self.fields.capacity() == 0 {
            self.fields.reserve(FIELD_ROOM);
        }
        &mut self.fields
    }

    pub fn event(&mut self, name: &str, at: Timestamp, attributes: &[(&str, Attr<'_>)]) {
        wire::event(self.room(), name, at, attributes);
    }

    /// Writes the span as one `spans` field of a `ScopeSpans` message.
    pub fn encode(&self, out: &mut Vec<u8>) {
        wire::span(out, self);
    }
}

/// Attributes that many spans carry alike, written in their wire form once: setting them is
/// one copy.
#[derive(Debug, Clone)]
pub struct Attributes(Vec<u8>);

impl Attributes {
    pub fn new(attributes: &[(&str, Attr<'_>)]) -> Self {
        let mut bytes = Vec::new();
        for (key, value) in attributes {
            wire::attribute(&mut bytes, wire::SPAN_ATTRIBUTE, key, *value);
        }
        Attributes(bytes)
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

thread_local! {
    /// Ids need to be random enough not to collide, not secret (they are sent to providers and
    /// collectors anyway): a fast generator seeded from the OS once per thread, as the SDK's
    /// own id generator uses, where the thread's ChaCha generator costs several times as much
    /// per id.
    static IDS: std::cell::RefCell<SmallRng> = std::cell::RefCell::new(SmallRng::from_os_rng());
}

fn random_u64() -> u64 {
    IDS.with(|rng| rng.borrow_mut().next_u64())
}

/// A random trace id (never the invalid all-zero one).
pub fn new_trace_id() -> TraceId {
    loop {
        let id = u128::from(random_u64()) << 64 | u128::from(random_u64());
        if id != 0 {
            return TraceId::from(id);
        }
    }
}

/// A random span id (never the invalid all-zero one).
pub fn new_span_id() -> SpanId {
    loop {
        let id = random_u64();
        if id != 0 {
            return SpanId::from(id);
        }
    }
}
