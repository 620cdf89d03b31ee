//! Response bodies: sent whole, or paced one frame at a time (and cut on purpose).

use std::io;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{self, StreamExt};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;

pub(crate) type BoxedBody = UnsyncBoxBody<Bytes, io::Error>;

/// One step of a paced body: a frame to send, or the signal to drop the
/// connection without finishing the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    Data(Bytes),
    Abort,
}

/// Yield between frames so hyper flushes each one as its own write (like a
/// real provider), or sleep when `--chunk-delay-ms` asks for pacing.
pub(crate) async fn pause(delay: Duration) {
    if delay.is_zero() {
        tokio::task::yield_now().await;
    } else {
        tokio::time::sleep(delay).await;
    }
}

/// A body that sends the steps one frame at a time; `Abort` fails the body,
/// which makes hyper drop the connection without the final chunk.
pub(crate) fn paced_body(steps: Vec<Step>, delay: Duration) -> BoxedBody {
    let frames = stream::iter(steps.into_iter().enumerate()).then(move |(i, step)| async move {
        if i > 0 {
            pause(delay).await;
        }
        match step {
            Step::Data(bytes) => Ok(Frame::data(bytes)),
            Step::Abort => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "mock: connection cut on purpose",
            )),
        }
    });
    StreamBody::new(frames).boxed_unsync()
}

pub(crate) fn full_body(bytes: Bytes) -> BoxedBody {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}
