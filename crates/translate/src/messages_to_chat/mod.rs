//! The client speaks Anthropic messages; the provider is OpenAI-style.
//!
//! Split by what is translated: the request going up, a whole answer (or error body)
//! coming back, and a streamed answer coming back.

mod answer;
mod request;
mod stream;

pub use answer::{error, response};
pub use request::request;
pub use stream::StreamTranslator;
