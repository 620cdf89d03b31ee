//! Which protocol a provider's answer speaks, and what to do with one of its events.

/// Which provider protocol a stream speaks; the usage fields differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    OpenAiChat,
    OpenAiResponses,
    Anthropic,
    Gemini,
}

/// What the caller should do with the event it just observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventVerdict {
    Forward,
    /// An OpenAI chat chunk that only carries usage. The gateway always asks
    /// for usage, so it drops these when the client did not.
    UsageOnly,
}
