//! Settlement: every admitted request ends here exactly once, whatever the exit path.
//!
//! `InFlight` owns the reservation and what is known about usage so far, behind methods that
//! record facts (the stream's tracker, a whole answer's body, "this costs no tokens");
//! `charge` alone decides from them what is billed. The normal paths call
//! `finish` with the reason; if the request future is dropped instead (gateway shutdown, a
//! panic unwinding), `Drop` settles with what was counted up to that point. Either way one usage
//! event is recorded and the reservation is settled once.

use std::time::Instant;

use crate::usage::{
    responses_answer, usage_from_body, FinishReasons, StreamKind, StreamUsageTracker,
};
use gateway_core::response_items::Issued;

use crate::state::SharedApiState;
use gateway_core::domain::Usage;
use gateway_core::journal::Hold;
use gateway_core::quota::{Reservation, Used};
use gateway_core::storage::UsageEvent;
use gateway_core::usage::UsageSink;
use gateway_core::util::{new_time_ordered_id, now_ms};

/// How the final numbers were obtained, recorded with the event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Completed; the provider reported usage (or no usage applies).
    Complete,
    /// The client went away mid-response.
    ClientDisconnect,
    /// The provider failed or cut the stream mid-response.
    UpstreamError,
    /// The provider answered with an error status before any output.
    ProviderError,
    /// No deployment could serve the request.
    Unrouted,
    /// The request future was dropped (shutdown).
    Aborted,
}

/// The reason names, written once: [`Reason::settlement`] prefixes them at compile time.
macro_rules! reason_name {
    ($reason:expr, $prefix:literal) => {
        match $reason {
            Reason::Complete => concat!($prefix, "complete"),
            Reason::ClientDisconnect => concat!($prefix, "client_disconnect"),
            Reason::UpstreamError => concat!($prefix, "upstream_error"),
            Reason::ProviderError => concat!($prefix, "provider_error"),
            Reason::Unrouted => concat!($prefix, "unrouted"),
            Reason::Aborted => concat!($prefix, "aborted"),
        }
    };
}

impl Reason {
    /// How the numbers were obtained and why the request ended, as recorded in the event:
    /// `provider:<reason>` or `counted:<reason>`. Static text: this is made for every request
    /// and read on the usage writer's thread.
    fn settlement(self, provider_reported: bool) -> &'static str {
        if provider_reported {
            reason_name!(self, "provider:")
        } else {
            reason_name!(self, "counted:")
        }
    }
}

pub struct InFlight {
    state: SharedApiState,
    reservation: Option<Reservation>,
    started: Instant,
    event: UsageEvent,
    /// Estimated input, charged when the provider reported nothing.
    input_estimate: u64,
    /// Stream observer: the usage a stream reported, and its delivered text for counting
    /// when it reported none.
    /// Boxed: only streams have one, and every request's guard is moved several times.
    tracker: Option<Box<StreamUsageTracker>>,
    /// Usage stated in a whole (non-streamed) answer.
    body_usage: Option<Usage>,
    /// Output tokens counted by other means (a whole answer that stated no usage).
    counted_output: Option<u64>,
    /// The request costs no tokens whatever the provider says (listings, token counts).
    tokens_free: bool,
    /// Whether input should be charged when the provider reported nothing (false for local
    /// answers and failures before the provider saw the request).
    charge_input_estimate: bool,
    /// The journal segment holding the admission line (kept until the event is committed).
    admitted: Option<Hold>,
    /// The finish reasons a whole answer states, when the request is traced.
    reasons: Option<FinishReasons>,
    done: bool,
}

impl InFlight {
    pub fn new(
        state: SharedApiState,
        reservation: Reservation,
        started: Instant,
        event: UsageEvent,
        input_estimate: u64,
    ) -> Self {
        gateway_core::metrics::RESERVATIONS.inc();
        let admitted = state
            .usage
            .admit(&event, input_estimate, reservation.ticket.reserved());
        InFlight {
            state,
            reservation: Some(reservation),
            started,
            event,
            input_estimate,
            tracker: None,
            body_usage: None,
            counted_output: None,
            tokens_free: false,
            charge_input_estimate: true,
            admitted,
            reasons: None,
            done: false,
        }
    }

    /// Also collects the finish reasons the answer states (the request's span is recorded).
    pub fn want_finish_reasons(&mut self) {
        self.reasons = Some(FinishReasons::default());
    }

    /// The finish reasons the answer stated, when they were asked for.
    pub fn finish_reasons(&mut self) -> FinishReasons {
        self.tracker
            .as_deref_mut()
            .and_then(StreamUsageTracker::take_finish_reasons)
            .or_else(|| self.reasons.take())
            .unwrap_or_default()
    }

    /// Names the deployment that answered, for the event and the access log.
    pub fn set_deployment(&mut self, label: &str) {
        self.event.deployment = Some(label.to_string());
    }

    pub fn deployment(&self) -> Option<String> {
        self.event.deployment.clone()
    }

    pub fn ttfb_ms(&self) -> Option<u64> {
        self.event.ttfb_ms
    }

    /// The answer is a stream read by `tracker` (`None`: it is not).
    pub fn watch_stream(&mut self, mut tracker: Option<StreamUsageTracker>) {
        if let (Some(t), Some(_)) = (tracker.as_mut(), &self.reasons) {
            t.want_finish_reasons();
        }
        self.tracker = tracker.map(Box::new);
    }

    /// The stream's observer, for the relay to show it each event.
    pub fn tracker_mut(&mut self) -> Option<&mut StreamUsageTracker> {
        self.tracker.as_deref_mut()
    }

    /// Reads the usage a whole answer states; an answer that generated text but states none
    /// has its text counted as output instead. A Responses answer's ids are read in the same
    /// pass and handed back, for the item registry.
    pub fn read_whole_answer(&mut self, kind: StreamKind, body: &[u8], generates: bool) -> Issued {
        if let Some(r) = &mut self.reasons {
            r.scan(body);
        }
        if self.tracker.as_ref().and_then(|t| t.usage()).is_some() {
            return Issued::default();
        }
        let issued = if kind == StreamKind::OpenAiResponses {
            let (usage, issued) = responses_answer(body);
            self.body_usage = usage;
            issued
        } else {
            self.body_usage = usage_from_body(kind, body);
            Issued::default()
        };
        if self.body_usage.is_none() && generates {
            let text = String::from_utf8_lossy(body);
            self.counted_output = Some(self.state.tokens.count(&text));
        }
        issued
    }

    /// The request costs one request and no tokens, whatever the provider says.
    pub fn costs_no_tokens(&mut self) {
        self.tokens_free = true;
    }

    /// Input is not charged on the estimate: the provider never generated for this request.
    pub fn waive_input_estimate(&mut self) {
        self.charge_input_estimate = false;
    }

    pub fn mark_first_byte(&mut self) {
        if self.event.ttfb_ms.is_none() {
            self.event.ttfb_ms = Some(self.started.elapsed().as_millis() as u64);
        }
    }

    /// What the request's outcome is recorded as, from what the relay saw:
    /// - a stream the provider broke with an `error` event settles as `upstream_error` with the
    ///   provider's error code (the stream itself may have ended cleanly after it);
    /// - a non-streamed answer cut mid-body is a 502, not the 200 its header announced.
    pub fn judge(
        &self,
        status: u16,
        reason: Reason,
        error_code: Option<&'static str>,
    ) -> (u16, Reason, Option<&'static str>) {
        let provider_error = self
            .tracker
            .as_ref()
            .filter(|t| t.error_event().is_some())
            .map(|t| t.error_code().map_or("upstream_error", provider_code));
        match (reason, provider_error) {
            (Reason::Complete | Reason::UpstreamError, Some(code)) => {
                (status, Reason::UpstreamError, Some(code))
            }
            (Reason::UpstreamError, None) if self.tracker.is_none() && status < 400 => {
                (502, reason, error_code)
            }
            _ => (status, reason, error_code),
        }
    }

    /// Settles and records. Consumes the guard so it cannot run twice.
    pub fn finish(
        mut self: Box<Self>,
        status: u16,
        reason: Reason,
        error_code: Option<&'static str>,
    ) -> Usage {
        self.event.status = status;
        if let Some(code) = error_code {
            self.event.error_code = Some(code);
        }
        self.complete(reason)
    }

    fn complete(&mut self, reason: Reason) -> Usage {
        self.done = true;
        let (usage, provider_reported) = self.charge();
        self.event.settlement = reason.settlement(provider_reported);
        self.event.input_tokens = usage.input_tokens;
        self.event.output_tokens = usage.output_tokens;
        self.event.cached_tokens = usage.cached_tokens;
        self.event.latency_ms = self.started.elapsed().as_millis() as u64;
        let used = Used {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cached_input_tokens: usage.cached_tokens,
        };
        // Settled once (`done`): the event is not needed here any more.
        let mut event = std::mem::take(&mut self.event);
        let admitted = self.admitted.take();
        match self.reservation.take() {
            Some(r) => {
                event.quota_charged = r.ticket.charge(used);
                settle_and_record(&self.state, r, used, event, admitted)
            }
            None => self.state.usage.record(event, admitted),
        }
        usage
    }

    /// Which usage the request is charged, decided here and only here, and whether the
    /// provider reported it: what the provider reported in its stream or its body (raised to
    /// what was delivered when the stream was cut); otherwise the input estimate (when the
    /// provider saw the request) and the tokenizer's count of what was delivered for output.
    fn charge(&mut self) -> (Usage, bool) {
        let reported = if self.tokens_free {
            Some(Usage::default())
        } else {
            self.tracker
                .as_deref()
                .and_then(StreamUsageTracker::usage)
                .or(self.body_usage)
        };
        if let Some(u) = reported {
            return (self.at_least_delivered(u), true);
        }
        let output = match (&mut self.tracker, self.counted_output) {
            (_, Some(n)) => n,
            (Some(t), None) => self.state.tokens.count(t.delivered_text()),
            (None, None) => 0,
        };
        let usage = Usage {
            input_tokens: if self.charge_input_estimate {
                self.input_estimate
            } else {
                0
            },
            output_tokens: output,
            ..Usage::default()
        };
        (usage, false)
    }
}

impl InFlight {
    /// A stream that never reached its end reports only early usage (Anthropic's
    /// `message_start` says 1 output token): charge at least what was actually delivered.
    fn at_least_delivered(&mut self, mut u: Usage) -> Usage {
        if let Some(t) = &mut self.tracker {
            if !t.saw_terminal() && !t.delivered_text().is_empty() {
                let counted = self.state.tokens.count(t.delivered_text());
                u.output_tokens = u.output_tokens.max(counted);
            }
        }
        u
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.done {
            if self.event.status == 0 {
                self.event.status = 499;
            }
            self.complete(Reason::Aborted);
        }
    }
}

/// Most distinct provider error codes kept; later new ones are recorded as `upstream_error`.
const MAX_PROVIDER_CODES: usize = 256;

/// The provider's error code as a `&'static str` (the event's type): each distinct code is
/// leaked once, and only plain names up to a bounded count, since providers choose them.
fn provider_code(code: &str) -> &'static str {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static SEEN: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let plain = !code.is_empty()
        && code.len() <= 64
        && code
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if !plain {
        return "upstream_error";
    }
    let mut seen = SEEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(known) = seen.get(code) {
        return known;
    }
    if seen.len() >= MAX_PROVIDER_CODES {
        return "upstream_error";
    }
    let leaked: &'static str = Box::leak(code.to_owned().into_boxed_str());
    seen.insert(leaked);
    leaked
}

/// Set when the shutdown drain is about to end: relays still running stop and end their
/// answers with an error in the client's style, instead of being dropped mid-stream.
static DRAIN_CUT: std::sync::LazyLock<tokio::sync::watch::Sender<bool>> =
    std::sync::LazyLock::new(|| tokio::sync::watch::channel(false).0);

/// Asks every running relay to end now (the drain deadline is near).
pub fn cut_in_flight() {
    DRAIN_CUT.send_replace(true);
}

/// Resolves once [`cut_in_flight`] was called.
pub async fn drain_cut() {
    let mut rx = DRAIN_CUT.subscribe();
    let _ = rx.wait_for(|cut| *cut).await;
}

/// A fresh usage event for an admitted request.
pub fn new_event(user_id: &str, key_id: &str, model: &str, endpoint: &'static str) -> UsageEvent {
    UsageEvent {
        id: new_time_ordered_id("evt"),
        user_id: user_id.to_string(),
        key_id: key_id.to_string(),
        model: model.to_string(),
        endpoint,
        reasoning_effort: None,
        input_tokens: 0,
        output_tokens: 0,
        cached_tokens: 0,
        quota_charged: 0,
        status: 0,
        latency_ms: 0,
        ttfb_ms: None,
        settlement: "",
        deployment: None,
        error_code: None,
        created_at: now_ms(),
        breakdown: None,
    }
}

/// Settles the reservation and records the event with its breakdown once it is paid: at once in
/// process, with the lease's next renewal when admitted against one, otherwise on the storage
/// runtime (this may be called from `Drop`). Counted as pending so a flush waits for it.
fn settle_and_record(
    state: &SharedApiState,
    r: Reservation,
    used: Used,
    mut event: UsageEvent,
    admitted: Option<Hold>,
) {
    let sink: UsageSink = state.usage.clone();
    let pending = state.quota.is_shared().then(|| sink.begin_pending());
    // The reservation counts as held until its settlement is paid and recorded (with leases,
    // at the next renewal round): a gauge at 0 means every settlement is in the journal.
    let record = move |b| {
        event.breakdown = Some(b);
        sink.record(event, admitted);
        drop(pending);
        gateway_core::metrics::RESERVATIONS.dec();
    };
    if let Err(later) = state.quota.settle_now(r.ticket, used, record) {
        let engine = state.quota.clone();
        state.rt.spawn(async move {
            let b = engine.settle(&later.ticket, used).await;
            (later.on_paid)(b);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::Reason;

    #[test]
    fn settlement_names_the_source_and_the_reason() {
        let reasons = [
            (Reason::Complete, "complete"),
            (Reason::ClientDisconnect, "client_disconnect"),
            (Reason::UpstreamError, "upstream_error"),
            (Reason::ProviderError, "provider_error"),
            (Reason::Unrouted, "unrouted"),
            (Reason::Aborted, "aborted"),
        ];
        for (reason, name) in reasons {
            assert_eq!(reason.settlement(true), format!("provider:{name}"));
            assert_eq!(reason.settlement(false), format!("counted:{name}"));
        }
    }
}
