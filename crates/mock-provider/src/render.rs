//! Turning a reply into a hyper response, with the transport-level misbehaviours (cut
//! bodies, broken streams, pacing).

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use http::{Response, StatusCode};

use crate::body::{full_body, paced_body, BoxedBody, Step};
use crate::faults::{Behaviour, MIDSTREAM_ERROR_AFTER};
use crate::replay;
use crate::reply::{error_value, EventPlan, Reply};

/// The audio payload is sent in this many frames to exercise streaming.
pub(crate) const AUDIO_FRAMES: usize = 4;

/// Flatten an event plan into steps according to the behaviour:
/// `cut` keeps half the deltas and aborts; `midstream-error` keeps a few
/// deltas, then the error event, then ends cleanly.
pub(crate) fn assemble(plan: EventPlan, behaviour: &Behaviour) -> Vec<Step> {
    let EventPlan {
        prelude,
        mut deltas,
        epilogue,
        error_event,
        content_type: _,
    } = plan;
    let mut steps: Vec<Step> = prelude.into_iter().map(Step::Data).collect();
    if behaviour.cut {
        deltas.truncate(deltas.len() / 2);
        steps.extend(deltas.into_iter().map(Step::Data));
        steps.push(Step::Abort);
    } else if behaviour.midstream_error {
        deltas.truncate(MIDSTREAM_ERROR_AFTER);
        steps.extend(deltas.into_iter().map(Step::Data));
        steps.push(Step::Data(error_event));
    } else {
        steps.extend(deltas.into_iter().map(Step::Data));
        steps.extend(epilogue.into_iter().map(Step::Data));
    }
    steps
}

pub(crate) fn content_type(value: &'static str) -> (HeaderName, HeaderValue) {
    (CONTENT_TYPE, HeaderValue::from_static(value))
}

/// Build the response; `cut` non-streamed answers announce the full length
/// but send only half of it before dropping the connection.
pub(crate) fn render(
    reply: Reply,
    b: &Behaviour,
    chunk_delay: Duration,
) -> Result<Response<BoxedBody>, http::Error> {
    // What real providers add to their answers, none of which may reach a gateway's client:
    // a cookie, the provider account's organization and its own rate-limit state.
    let mut builder = Response::builder()
        .header(
            "set-cookie",
            "__cf_bm=mock-provider-cookie; path=/; HttpOnly",
        )
        .header("openai-organization", "org-mock")
        .header("x-ratelimit-limit-requests", "5000")
        .header("x-ratelimit-remaining-requests", "4999")
        .header("anthropic-ratelimit-requests-limit", "4000");
    let body = match reply {
        Reply::Json {
            status,
            body,
            retry_after,
        } => {
            builder = builder
                .status(status)
                .header(CONTENT_TYPE, "application/json");
            if let Some(secs) = retry_after {
                builder = builder.header("retry-after", secs);
            }
            if b.cut && status.is_success() {
                builder = builder.header(CONTENT_LENGTH, body.len());
                let half = body.slice(..body.len() / 2);
                paced_body(vec![Step::Data(half), Step::Abort], Duration::ZERO)
            } else {
                full_body(body)
            }
        }
        Reply::Audio(audio) => {
            let (name, value) = content_type("audio/mpeg");
            builder = builder.header(name, value);
            let frame_len = audio.len().div_ceil(AUDIO_FRAMES).max(1);
            let mut steps: Vec<Step> = (0..audio.len())
                .step_by(frame_len)
                .map(|start| Step::Data(audio.slice(start..(start + frame_len).min(audio.len()))))
                .collect();
            if b.cut {
                builder = builder.header(CONTENT_LENGTH, audio.len());
                steps.truncate(steps.len() / 2);
                steps.push(Step::Abort);
            }
            paced_body(steps, Duration::ZERO)
        }
        Reply::Events(plan) => {
            builder = builder
                .header(
                    CONTENT_TYPE,
                    plan.content_type.unwrap_or("text/event-stream"),
                )
                .header("cache-control", "no-cache");
            paced_body(assemble(plan, b), chunk_delay)
        }
        Reply::Raw {
            status,
            headers,
            body,
        } => {
            let mut builder = Response::builder()
                .status(status)
                .header(CONTENT_TYPE, "application/json");
            for (name, value) in headers {
                builder = builder.header(name, value);
            }
            return builder.body(full_body(body));
        }
        // Sent as recorded: none of the mock's own headers.
        Reply::Replay(answer) => return replay::render(answer, chunk_delay),
    };
    builder.body(body)
}

/// Last-resort 500 when building a response failed.
pub(crate) fn internal_error() -> Response<BoxedBody> {
    let body = error_value("mock internal error", "server_error").to_string();
    let mut response = Response::new(full_body(Bytes::from(body)));
    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
