//! What a stream has told the gateway so far: the usage it reported, whether it ended
//! deliberately, its first error and the text it delivered.

use gateway_core::domain::Usage;
use serde_json::Value;

/// Enough text for fallback counting of any realistic reply; past it a cut
/// stream is billed on the estimate of what fit.
pub const MAX_DELIVERED_TEXT_BYTES: usize = 4 * 1024 * 1024;

/// Error messages end up in logs and records; a provider could send anything.
pub(super) const MAX_ERROR_MESSAGE_BYTES: usize = 4 * 1024;

/// The state every protocol's reader updates; the tracker owns one per stream.
#[derive(Debug, Default)]
pub(super) struct Received {
    pub(super) usage: Option<Usage>,
    pub(super) terminal: bool,
    pub(super) error: Option<String>,
    /// The provider's code (or type) of that error, e.g. `overloaded_error`.
    pub(super) error_code: Option<String>,
    pub(super) delivered: String,
    pub(super) delivered_truncated: bool,
    /// While set, text is not collected (a chunk read early for its usage).
    pub(super) quiet: bool,
}

impl Received {
    /// Keeps the first error: later ones are usually consequences of it.
    pub(super) fn record_error(&mut self, json: &Value) {
        if self.error.is_some() {
            return;
        }
        let err = json.get("error").filter(|e| !e.is_null()).unwrap_or(json);
        self.error_code = ["code", "type"]
            .iter()
            .filter_map(|k| err.get(*k).and_then(Value::as_str))
            .find(|c| !c.is_empty() && *c != "error")
            .map(|c| truncate_to(c.to_owned(), 64));
        let msg = match err {
            Value::String(s) => s.clone(),
            _ => match err.get("message").and_then(Value::as_str) {
                Some(m) => m.to_owned(),
                None => err.to_string(),
            },
        };
        self.error = Some(truncate_to(msg, MAX_ERROR_MESSAGE_BYTES));
    }

    pub(super) fn deliver(&mut self, text: &str) {
        if self.quiet {
            return;
        }
        let room = MAX_DELIVERED_TEXT_BYTES.saturating_sub(self.delivered.len());
        if text.len() <= room {
            self.delivered.push_str(text);
            return;
        }
        self.delivered_truncated = true;
        let mut cut = room;
        while cut > 0 && !text.is_char_boundary(cut) {
            cut -= 1;
        }
        if let Some(head) = text.get(..cut) {
            self.delivered.push_str(head);
        }
    }
}

fn truncate_to(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while cut > 0 && !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}
