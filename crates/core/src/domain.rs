//! Words of the gateway's domain that every part uses: config, storage, quota and both
//! services speak them, so they live apart from each of those.

use std::fmt;

/// Quota tiers, ordered from lowest to highest so `max` picks the effective tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    Beginner,
    Steady,
    Persistent,
    Tryharder,
}

impl Tier {
    pub const ALL: [Tier; 4] = [
        Tier::Beginner,
        Tier::Steady,
        Tier::Persistent,
        Tier::Tryharder,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Beginner => "beginner",
            Tier::Steady => "steady",
            Tier::Persistent => "persistent",
            Tier::Tryharder => "tryharder",
        }
    }

    pub fn parse(s: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|t| t.as_str() == s)
    }

    pub fn index(self) -> usize {
        self as usize
    }

    /// The tier at `index` (the scripts' number for it); `None` for none (-1) or an unknown one.
    pub fn from_index(index: i64) -> Option<Tier> {
        usize::try_from(index)
            .ok()
            .and_then(|i| Tier::ALL.get(i).copied())
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Provider API style: how the gateway authenticates, which paths it speaks and which
/// protocol its answers come in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderStyle {
    /// `Authorization: Bearer`, OpenAI paths.
    OpenAi,
    /// `x-api-key` + `anthropic-version`, Anthropic paths.
    Anthropic,
    /// Azure OpenAI: OpenAI's protocol, `api-key`, deployment paths with `api-version`.
    Azure,
    /// Anthropic models on AWS Bedrock: InvokeModel, SigV4, binary event streams.
    Bedrock,
    /// Anthropic models on Google Vertex AI: rawPredict, OAuth from a service account.
    VertexAnthropic,
    /// The Gemini API's own protocol (`generateContent`), `x-goog-api-key`.
    Gemini,
}

/// The protocol a provider's requests and answers are written in, whatever carries them:
/// it decides which translation a client needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// OpenAI chat completions (and, where served, Responses, embeddings, images, speech).
    OpenAi,
    /// Anthropic messages.
    Anthropic,
    /// Gemini `generateContent`.
    Gemini,
}

impl ProviderStyle {
    pub const ALL: [ProviderStyle; 6] = [
        ProviderStyle::OpenAi,
        ProviderStyle::Anthropic,
        ProviderStyle::Azure,
        ProviderStyle::Bedrock,
        ProviderStyle::VertexAnthropic,
        ProviderStyle::Gemini,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ProviderStyle::OpenAi => "openai",
            ProviderStyle::Anthropic => "anthropic",
            ProviderStyle::Azure => "azure",
            ProviderStyle::Bedrock => "bedrock",
            ProviderStyle::VertexAnthropic => "vertex-anthropic",
            ProviderStyle::Gemini => "gemini",
        }
    }

    pub fn parse(s: &str) -> Option<ProviderStyle> {
        ProviderStyle::ALL.into_iter().find(|p| p.as_str() == s)
    }

    pub fn wire(self) -> Wire {
        match self {
            ProviderStyle::OpenAi | ProviderStyle::Azure => Wire::OpenAi,
            ProviderStyle::Anthropic | ProviderStyle::Bedrock | ProviderStyle::VertexAnthropic => {
                Wire::Anthropic
            }
            ProviderStyle::Gemini => Wire::Gemini,
        }
    }

    /// The two styles whose paths, headers and bodies are the client's own (renames aside):
    /// every other style has its request built for it (paths, credentials, body fields).
    pub fn is_direct(self) -> bool {
        matches!(self, ProviderStyle::OpenAi | ProviderStyle::Anthropic)
    }
}

/// How a key counts against per-minute limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitMode {
    /// The key has its own per-minute windows.
    PerKey,
    /// The key shares the account's windows (the global key).
    AccountPool,
}

impl LimitMode {
    pub fn as_str(self) -> &'static str {
        match self {
            LimitMode::PerKey => "per_key",
            LimitMode::AccountPool => "account_pool",
        }
    }
    /// Anything but `account_pool` (what older rows hold too) is `PerKey`.
    pub fn parse(s: &str) -> LimitMode {
        if s == "account_pool" {
            LimitMode::AccountPool
        } else {
            LimitMode::PerKey
        }
    }
}

/// Which meter a lot tops up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LotKind {
    Token,
    Request,
}

impl LotKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LotKind::Token => "token",
            LotKind::Request => "request",
        }
    }
    pub fn parse(s: &str) -> Option<LotKind> {
        match s {
            "token" => Some(LotKind::Token),
            "request" => Some(LotKind::Request),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lot {
    pub id: String,
    pub user_id: String,
    pub kind: LotKind,
    pub amount: u64,
    pub remaining: u64,
    pub tier: Option<Tier>,
    pub source: String,
    pub created_at: i64,
    pub expires_at: i64,
}

/// One hour of spend for one account.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpendBucket {
    pub hour: i64,
    pub allowance_tokens: u64,
    pub allowance_requests: u64,
    pub lot_tokens: u64,
    pub lot_requests: u64,
}

impl SpendBucket {
    /// Adds `other`'s four amounts to these (the hour is left alone).
    pub fn add_amounts(&mut self, other: &SpendBucket) {
        self.allowance_tokens += other.allowance_tokens;
        self.allowance_requests += other.allowance_requests;
        self.lot_tokens += other.lot_tokens;
        self.lot_requests += other.lot_requests;
    }

    /// Takes `other`'s four amounts out of these, which include them.
    pub fn sub_amounts(&mut self, other: &SpendBucket) {
        self.allowance_tokens = self.allowance_tokens.saturating_sub(other.allowance_tokens);
        self.allowance_requests = self
            .allowance_requests
            .saturating_sub(other.allowance_requests);
        self.lot_tokens = self.lot_tokens.saturating_sub(other.lot_tokens);
        self.lot_requests = self.lot_requests.saturating_sub(other.lot_requests);
    }
}

/// How one settlement was paid: what came out of the weekly allowance and which lots.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Breakdown {
    pub user_id: String,
    pub at_ms: i64,
    pub allowance_tokens: u64,
    pub allowance_requests: u64,
    /// (lot id, kind, amount taken)
    pub lots: Vec<(String, LotKind, u64)>,
}

impl Breakdown {
    pub fn is_empty(&self) -> bool {
        self.allowance_tokens == 0 && self.allowance_requests == 0 && self.lots.is_empty()
    }
}

/// Provider-reported usage, normalized to OpenAI semantics: `cached_tokens`
/// is a subset of `input_tokens` and `reasoning_tokens` a subset of
/// `output_tokens`. For Anthropic, `input_tokens` therefore includes cache
/// reads and cache writes, and `cached_tokens` is the cache reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_tokens: u64,
    pub reasoning_tokens: u64,
}

/// Normalizes an email for storage and lookup; `None` when it is not plausibly an address.
///
/// Only the common form is accepted: a dot-atom local part (no quoted strings, comments or
/// backslashes) and a host name of letters, digits and hyphens (no `[127.0.0.1]` literals),
/// which is also what the mailer must be able to address: an address that passed here and
/// failed there answered 500 instead of `invalid_email`.
pub fn normalize_email(raw: &str) -> Option<String> {
    let e = raw.trim().to_ascii_lowercase();
    if e.len() > 254 {
        return None;
    }
    let (local, domain) = e.split_once('@')?;
    let atext = |c: char| c.is_alphanumeric() || "!#$%&'*+/=?^_`{|}~-".contains(c);
    let local_ok = local.len() <= 64
        && local
            .split('.')
            .all(|part| !part.is_empty() && part.chars().all(atext));
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars().all(|c| c.is_alphanumeric() || c == '-')
    };
    let domain_ok = domain.split('.').count() >= 2 && domain.split('.').all(label_ok);
    let mailable = e.parse::<lettre::Address>().is_ok();
    (local_ok && domain_ok && mailable).then_some(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emails() {
        assert_eq!(
            normalize_email(" A@Example.COM "),
            Some("a@example.com".into())
        );
        assert_eq!(normalize_email("nope"), None);
        assert_eq!(normalize_email("a@b"), None);
        assert_eq!(normalize_email("a b@c.d"), None);
        assert_eq!(normalize_email("@c.d"), None);
        for odd in [
            "a\"b@example.com",
            "a@[127.0.0.1]",
            "a..b@example.com",
            "a@-x.com",
            "a(c)@x.com",
            "a@x_y.com",
        ] {
            assert_eq!(normalize_email(odd), None, "{odd}");
        }
        assert_eq!(
            normalize_email("First.Last+tag@Sub.Example.com").as_deref(),
            Some("first.last+tag@sub.example.com")
        );
    }
}
