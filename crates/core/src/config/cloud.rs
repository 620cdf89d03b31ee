//! What the cloud styles need beyond a base URL and an API key: Azure's API version, the AWS
//! region and credentials Bedrock requests are signed with, the Vertex project, region and
//! service account access tokens are minted from, the Gemini API version.

use std::fmt;
use std::sync::Arc;

use super::check::{Checker, ConfigError};
use super::file::ProviderFile;
use crate::domain::ProviderStyle;

/// Google's OAuth token endpoint, when neither the config nor the key file names another.
pub const GOOGLE_TOKEN_URL: &str = "https://oauth2.googleapis.com/token";

/// The style's own settings, checked at load.
#[derive(Debug, Clone, Default)]
pub enum StyleAccess {
    /// `openai`, `anthropic` (and `gemini`'s key): nothing beyond the API key.
    #[default]
    Direct,
    Azure {
        /// `v1` selects the v1 path family (`/openai/v1/...`, model in the body); a date, the
        /// deployment paths with `?api-version=`.
        api_version: String,
    },
    Bedrock {
        region: String,
        /// From the standard AWS variables at load; `None` when they are not set (the
        /// provider's deployments are then skipped, as for a missing API key).
        credentials: Option<AwsCredentials>,
    },
    Vertex(Arc<VertexAccess>),
    Gemini {
        /// The path's version segment (`v1beta`).
        api_version: String,
    },
}

impl StyleAccess {
    /// True for a v1-family Azure provider (model in the body, no `api-version`).
    pub fn azure_v1(&self) -> bool {
        matches!(self, StyleAccess::Azure { api_version } if api_version == "v1")
    }
}

/// AWS credentials from `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`.
#[derive(Clone)]
pub struct AwsCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsCredentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"***")
            .field("session_token", &self.session_token.as_ref().map(|_| "***"))
            .finish()
    }
}

impl AwsCredentials {
    /// The standard variables, as every AWS SDK reads them; `None` without a key pair.
    fn from_env() -> Option<AwsCredentials> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let access_key_id = var("AWS_ACCESS_KEY_ID")?;
        let secret_access_key = var("AWS_SECRET_ACCESS_KEY")?;
        let session_token = var("AWS_SESSION_TOKEN");
        crate::logging::never_print(&secret_access_key);
        if let Some(t) = &session_token {
            crate::logging::never_print(t);
        }
        Some(AwsCredentials {
            access_key_id,
            secret_access_key,
            session_token,
        })
    }
}

/// A Vertex AI provider's project, region and service account.
#[derive(Debug)]
pub struct VertexAccess {
    pub project: String,
    pub region: String,
    /// Where the signed assertion is exchanged for an access token (also its `aud`).
    pub token_url: String,
    pub account: ServiceAccount,
}

/// A service-account key file: who signs, and the RSA key it signs with.
pub struct ServiceAccount {
    /// The key file, named in errors and logs.
    pub file: String,
    pub client_email: String,
    /// The key's id, sent as the assertion's `kid`.
    pub private_key_id: Option<String>,
    pub key: jsonwebtoken::EncodingKey,
}

impl fmt::Debug for ServiceAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceAccount")
            .field("file", &self.file)
            .field("client_email", &self.client_email)
            .finish_non_exhaustive()
    }
}

/// The fields of a key file the gateway reads.
#[derive(serde::Deserialize)]
struct KeyFile {
    #[serde(rename = "type")]
    kind: Option<String>,
    client_email: Option<String>,
    private_key: Option<String>,
    private_key_id: Option<String>,
    project_id: Option<String>,
    token_uri: Option<String>,
}

/// Reads and checks a service-account key file; the error says what is wrong with it.
fn read_key_file(path: &str) -> Result<(ServiceAccount, KeyFile), String> {
    let text = std::fs::read(path).map_err(|e| format!("cannot read {path:?}: {e}"))?;
    let mut file: KeyFile = serde_json::from_slice(&text)
        .map_err(|e| format!("{path:?} is not a service-account key file (JSON): {e}"))?;
    if let Some(kind) = file.kind.as_deref().filter(|k| *k != "service_account") {
        return Err(format!(
            "{path:?} holds a {kind:?} credential; a \"service_account\" key file is needed"
        ));
    }
    let client_email = file
        .client_email
        .take()
        .filter(|e| !e.is_empty())
        .ok_or_else(|| format!("{path:?} has no client_email"))?;
    let pem = file
        .private_key
        .take()
        .ok_or_else(|| format!("{path:?} has no private_key"))?;
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(pem.as_bytes())
        .map_err(|e| format!("{path:?}: private_key is not an RSA key in PEM: {e}"))?;
    crate::logging::never_print(&pem);
    let account = ServiceAccount {
        file: path.to_string(),
        client_email,
        private_key_id: file.private_key_id.take().filter(|k| !k.is_empty()),
        key,
    };
    Ok((account, file))
}

/// A region or project as it goes into a host name or a path segment.
fn plain_name(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 100
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// Checks the style's keys (and refuses those of other styles) and builds its access.
pub(super) fn validate(
    c: &Checker,
    i: usize,
    style: ProviderStyle,
    p: &ProviderFile,
) -> Result<StyleAccess, ConfigError> {
    let key = |k: &str| format!("providers[{i}].{k}");
    let set = |v: &Option<String>| v.as_deref().filter(|s| !s.is_empty()).map(str::to_string);
    let used: &[&str] = match style {
        ProviderStyle::OpenAi | ProviderStyle::Anthropic => &[],
        ProviderStyle::Azure | ProviderStyle::Gemini => &["api_version"],
        ProviderStyle::Bedrock => &["region"],
        ProviderStyle::VertexAnthropic => &["region", "project", "credentials_file", "token_url"],
    };
    for (name, value) in [
        ("api_version", &p.api_version),
        ("region", &p.region),
        ("project", &p.project),
        ("credentials_file", &p.credentials_file),
        ("token_url", &p.token_url),
    ] {
        if value.is_some() && !used.contains(&name) {
            return Err(c.err(
                key(name),
                format!("is not used by a {:?} provider", style.as_str()),
            ));
        }
    }
    if matches!(
        style,
        ProviderStyle::Bedrock | ProviderStyle::VertexAnthropic
    ) && p.api_key_env.is_some()
    {
        let how = if style == ProviderStyle::Bedrock {
            "requests are signed with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and \
             AWS_SESSION_TOKEN) from the environment"
        } else {
            "access tokens are minted from credentials_file"
        };
        return Err(c.err(key("api_key_env"), format!("is not used: {how}")));
    }
    let region = || -> Result<String, ConfigError> {
        let r = set(&p.region).ok_or_else(|| c.err(key("region"), "is required"))?;
        if !plain_name(&r) {
            return Err(c.err(key("region"), format!("{r:?} is not a region name")));
        }
        Ok(r)
    };
    Ok(match style {
        ProviderStyle::OpenAi | ProviderStyle::Anthropic => StyleAccess::Direct,
        ProviderStyle::Azure => {
            let v = set(&p.api_version).ok_or_else(|| {
                c.err(
                    key("api_version"),
                    "is required: a date such as \"2024-10-21\", or \"v1\"",
                )
            })?;
            if v != "v1" && !is_api_date(&v) {
                return Err(c.err(
                    key("api_version"),
                    format!("{v:?} is neither \"v1\" nor a date such as \"2024-10-21\""),
                ));
            }
            StyleAccess::Azure { api_version: v }
        }
        ProviderStyle::Gemini => {
            let v = set(&p.api_version).unwrap_or_else(|| "v1beta".into());
            if !matches!(v.as_str(), "v1" | "v1beta" | "v1alpha") {
                return Err(c.err(
                    key("api_version"),
                    format!("{v:?} is not one of \"v1beta\", \"v1\", \"v1alpha\""),
                ));
            }
            StyleAccess::Gemini { api_version: v }
        }
        ProviderStyle::Bedrock => StyleAccess::Bedrock {
            region: region()?,
            credentials: AwsCredentials::from_env(),
        },
        ProviderStyle::VertexAnthropic => {
            let region = region()?;
            let file = set(&p.credentials_file).ok_or_else(|| {
                c.err(
                    key("credentials_file"),
                    "is required: the service-account key file (JSON) access tokens are minted from",
                )
            })?;
            let (account, rest) =
                read_key_file(&file).map_err(|e| c.err(key("credentials_file"), e))?;
            let project = set(&p.project).or(rest.project_id).ok_or_else(|| {
                c.err(
                    key("project"),
                    "is required (the key file names no project_id)",
                )
            })?;
            if !plain_name(&project) {
                return Err(c.err(key("project"), format!("{project:?} is not a project id")));
            }
            let token_url = set(&p.token_url)
                .or(rest.token_uri)
                .unwrap_or_else(|| GOOGLE_TOKEN_URL.into());
            if !(token_url.starts_with("https://") || token_url.starts_with("http://")) {
                return Err(c.err(
                    key("token_url"),
                    format!("{token_url:?} is not an http(s) URL"),
                ));
            }
            StyleAccess::Vertex(Arc::new(VertexAccess {
                project,
                region,
                token_url,
                account,
            }))
        }
    })
}

/// `YYYY-MM-DD`, optionally followed by `-preview`.
fn is_api_date(v: &str) -> bool {
    let date = v.strip_suffix("-preview").unwrap_or(v);
    let b = date.as_bytes();
    b.len() == 10
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            _ => c.is_ascii_digit(),
        })
}

#[cfg(test)]
mod tests {
    use super::is_api_date;

    #[test]
    fn api_dates() {
        assert!(is_api_date("2024-10-21"));
        assert!(is_api_date("2025-04-01-preview"));
        for bad in ["2024-1-21", "v2", "2024-10-21x", "", "2024/10/21"] {
            assert!(!is_api_date(bad), "{bad}");
        }
    }
}
