//! Usage accounting: what a provider says a request cost, read out of its answer.
//!
//! The gateway bills from what the provider reports. A streamed answer is read event by event
//! as it passes ([`StreamUsageTracker`] over the events of [`crate::sse`]); a whole answer at
//! once ([`usage_from_body`]). Each provider protocol names its usage fields its own way:
//! [`openai`] reads chat completions and the Responses API, [`anthropic`] the messages API,
//! [`gemini`] the Gemini API.
//!
//! Everything here takes hostile input from the network: nothing panics, every loop is bounded
//! by the input, and every buffer has a cap.

mod anthropic;
mod body;
mod finish;
mod gemini;
mod kind;
mod object;
mod openai;
mod received;
mod stream;

pub use body::{responses_answer, usage_from_body};
pub use finish::FinishReasons;
pub use kind::{EventVerdict, StreamKind};
pub use received::MAX_DELIVERED_TEXT_BYTES;
pub use stream::StreamUsageTracker;
