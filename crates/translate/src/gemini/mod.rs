//! The provider speaks the Gemini API (`generateContent`); the client speaks OpenAI chat
//! completions.
//!
//! Gemini is reached through chat completions: an Anthropic messages or Responses client's
//! request is first translated to a chat request (by [`crate::messages_to_chat`] or
//! [`crate::responses`]) and then here, and Gemini's answers come back the same way. The chat
//! protocol carries everything both ends share (text, system instructions, images, tools and
//! their results, reasoning, usage), so one pair of translations serves every client style.
//!
//! Split by what is translated: the request going up, a whole answer (or error body) coming
//! back, and a streamed answer coming back.
//!
//! Gemini 3 models sign the function calls they make (`thoughtSignature`) and refuse a later
//! turn that does not send the signature back with its call. Chat has no field for it, so it
//! travels inside the tool call's id ([`call_id`]), which every client returns unchanged.

mod answer;
mod request;
mod stream;

pub use answer::{error, response, usage};
pub use request::request;
pub use stream::StreamTranslator;

/// Between a tool call's own id and the Gemini thought signature carried in it.
const SIGNATURE_MARK: &str = "~sig~";

/// The chat tool call id for a Gemini function call: its own id (or a fresh one) and, when the
/// call was signed, the signature after [`SIGNATURE_MARK`].
fn call_id(own: Option<&str>, signature: Option<&str>) -> String {
    let own = match own.filter(|s| !s.is_empty()) {
        Some(id) => id.to_string(),
        None => crate::random_id("call_"),
    };
    match signature.filter(|s| !s.is_empty()) {
        Some(sig) => format!("{own}{SIGNATURE_MARK}{sig}"),
        None => own,
    }
}

/// The signature a chat tool call id carries, if any ([`call_id`]).
fn signature_of(id: &str) -> Option<&str> {
    id.split_once(SIGNATURE_MARK)
        .map(|(_, sig)| sig)
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_travel_in_call_ids() {
        let id = call_id(Some("call_1"), Some("c2lnbmF0dXJl"));
        assert_eq!(id, "call_1~sig~c2lnbmF0dXJl");
        assert_eq!(signature_of(&id), Some("c2lnbmF0dXJl"));
        assert_eq!(signature_of("call_1"), None);
        assert!(call_id(None, None).starts_with("call_"));
        assert_eq!(call_id(Some("x"), Some("")), "x");
    }
}
