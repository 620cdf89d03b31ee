//! The cloud provider styles: Azure OpenAI, Anthropic models on AWS Bedrock and on Google
//! Vertex AI, and the Gemini API.
//!
//! Each speaks one of the gateway's protocols (Azure OpenAI's, Bedrock and Vertex Anthropic's)
//! or its own (Gemini), but addresses, authenticates and sometimes frames it in its own way. This
//! module builds their requests ([`prepare`]: paths with the model in them, query strings the
//! gateway writes itself, body fields the cloud wants, credentials: an `api-key`, a SigV4
//! signature, an OAuth access token), judges their answers by what their error shapes say
//! ([`judge`]), and reads their framing and errors ([`Dialect`], [`EventStreamReader`]).
//!
//! The direct styles (`openai`, `anthropic`) never come here: their requests are the client's
//! own, and their answers need nothing of this.

mod aws;
mod errors;
mod google;

use std::borrow::Cow;

use bytes::Bytes;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::Value;

use crate::error::ApiError;
use crate::pipeline::Admitted;
use crate::route::Endpoint;
use crate::routing::{Failure, Target};
use crate::shape::{Crossing, Translated};
use crate::state::ApiState;
use gateway_core::config::{Provider, StyleAccess};
use gateway_core::domain::ProviderStyle;

pub use aws::EventStreamReader;
pub use errors::{judge, Dialect};
pub use google::TokenCache;

/// A path segment as the clouds' SDKs write one: everything but unreserved characters
/// percent-encoded (a Bedrock model id's `:`, a replayed fixture's `/`).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');
/// Vertex model versions are written `claude-x@20250101` in the path, as Google's own clients
/// write them.
const VERTEX_SEGMENT: &AsciiSet = &SEGMENT.remove(b'@');

fn segment<'a>(s: &'a str, set: &'static AsciiSet) -> impl std::fmt::Display + 'a {
    utf8_percent_encode(s, set)
}

/// Anthropic API versions the clouds want in the body in place of the header.
const BEDROCK_ANTHROPIC_VERSION: &str = "bedrock-2023-05-31";
const VERTEX_ANTHROPIC_VERSION: &str = "vertex-2023-10-16";

/// A request for one attempt at a cloud deployment.
pub struct Prepared {
    /// Path and query, the base URL's path first.
    pub path: String,
    pub headers: Vec<(&'static str, Cow<'static, str>)>,
    pub body: Bytes,
}

/// Why no request was sent to a deployment.
pub enum NotSent {
    /// The request itself cannot be sent (its body could not be built).
    Request(ApiError),
    /// The deployment cannot be used now (its access token could not be had): scored like a
    /// failed connection, and the next deployment is tried.
    Deployment(Failure, String),
}

impl From<ApiError> for NotSent {
    fn from(e: ApiError) -> Self {
        NotSent::Request(e)
    }
}

/// The client headers a cloud request carries on.
pub struct ClientHeaders<'a> {
    pub user_agent: Option<&'a str>,
    /// `anthropic-beta`, for the Anthropic clouds.
    pub anthropic_beta: Option<&'a str>,
}

/// Builds the request for `target`, a deployment of a cloud style.
pub async fn prepare(
    state: &ApiState,
    client: &ClientHeaders<'_>,
    target: &Target,
    adm: &Admitted,
    crossing: Crossing,
    translated: &Translated,
) -> Result<Prepared, NotSent> {
    let p = &*target.provider;
    let model = target.upstream_model.as_deref().unwrap_or(&adm.model_name);
    let mut headers: Vec<(&'static str, Cow<'static, str>)> = Vec::with_capacity(8);
    headers.push(("content-type", Cow::Borrowed("application/json")));
    if let Some(ua) = client.user_agent {
        headers.push(("user-agent", Cow::Owned(ua.to_string())));
    }
    headers.push(("accept-encoding", Cow::Borrowed("identity")));
    let endpoint = crossing.provider_endpoint(adm.endpoint);
    match &p.access {
        StyleAccess::Azure { api_version } => {
            let body = crate::forward::upstream_body(adm, target, crossing, translated)?;
            if let Some(k) = &p.api_key {
                headers.push(("api-key", Cow::Owned(k.clone())));
            }
            Ok(Prepared {
                path: azure_path(p, api_version, endpoint, model),
                headers,
                body,
            })
        }
        StyleAccess::Bedrock {
            region,
            credentials,
        } => {
            let mut j = tree(adm, crossing, translated)?;
            if let Some(obj) = j.as_object_mut() {
                obj.remove("model");
                obj.remove("stream");
                obj.insert(
                    "anthropic_version".into(),
                    Value::from(BEDROCK_ANTHROPIC_VERSION),
                );
                if let Some(betas) = client.anthropic_beta.map(beta_list) {
                    obj.insert("anthropic_beta".into(), betas);
                }
            }
            let body = to_bytes(&j)?;
            let action = if adm.stream {
                "invoke-with-response-stream"
            } else {
                "invoke"
            };
            let path = format!("{}/model/{}/{action}", p.base_path, segment(model, SEGMENT));
            headers.push((
                "accept",
                Cow::Borrowed(if adm.stream {
                    "application/vnd.amazon.eventstream"
                } else {
                    "application/json"
                }),
            ));
            let Some(creds) = credentials else {
                return Err(NotSent::Deployment(
                    Failure::Credential,
                    "no AWS credentials in the environment".into(),
                ));
            };
            aws::sign(creds, region, &p.host_header, &path, &mut headers, &body)
                .map_err(|e| NotSent::Deployment(Failure::Credential, e))?;
            Ok(Prepared {
                path,
                headers,
                body,
            })
        }
        StyleAccess::Vertex(access) => {
            let mut j = tree(adm, crossing, translated)?;
            if let Some(obj) = j.as_object_mut() {
                obj.remove("model");
                obj.insert(
                    "anthropic_version".into(),
                    Value::from(VERTEX_ANTHROPIC_VERSION),
                );
            }
            let body = to_bytes(&j)?;
            let method = if adm.stream {
                "streamRawPredict"
            } else {
                "rawPredict"
            };
            let path = format!(
                "{}/v1/projects/{}/locations/{}/publishers/anthropic/models/{}:{method}",
                p.base_path,
                access.project,
                access.region,
                segment(model, VERTEX_SEGMENT)
            );
            if let Some(beta) = client.anthropic_beta {
                headers.push(("anthropic-beta", Cow::Owned(beta.to_string())));
            }
            let token = state
                .google_tokens
                .token(access)
                .await
                .map_err(|e| NotSent::Deployment(e.failure(), e.to_string()))?;
            headers.push(("authorization", Cow::Owned(format!("Bearer {token}"))));
            Ok(Prepared {
                path,
                headers,
                body,
            })
        }
        StyleAccess::Gemini { api_version } => {
            let mut j = tree(adm, crossing, translated)?;
            if let Some(limit) = adm.output_clamp {
                clamp_gemini_output(&mut j, limit);
            }
            let body = to_bytes(&j)?;
            let method = if adm.stream {
                "streamGenerateContent?alt=sse"
            } else {
                "generateContent"
            };
            let model = model.strip_prefix("models/").unwrap_or(model);
            if let Some(k) = &p.api_key {
                headers.push(("x-goog-api-key", Cow::Owned(k.clone())));
            }
            Ok(Prepared {
                path: format!(
                    "{}/{api_version}/models/{}:{method}",
                    p.base_path,
                    segment(model, SEGMENT)
                ),
                headers,
                body,
            })
        }
        StyleAccess::Direct => {
            log::error!(
                "provider {} of style {} has no cloud settings",
                p.name,
                p.style.as_str()
            );
            Err(NotSent::Request(ApiError::ServerError))
        }
    }
}

/// Azure's paths: a deployment's (`/openai/deployments/{deployment}/chat/completions`) with
/// `?api-version=`, or the v1 family's (`/openai/v1/chat/completions`, the deployment named in
/// the body). Responses are served outside any deployment (`/openai/responses`).
fn azure_path(p: &Provider, api_version: &str, endpoint: Endpoint, deployment: &str) -> String {
    let op = endpoint
        .path()
        .strip_prefix("/v1")
        .unwrap_or(endpoint.path());
    let base = &p.base_path;
    if api_version == "v1" {
        format!("{base}/openai/v1{op}")
    } else if endpoint == Endpoint::Responses {
        format!("{base}/openai{op}?api-version={api_version}")
    } else {
        format!(
            "{base}/openai/deployments/{}{op}?api-version={api_version}",
            segment(deployment, SEGMENT)
        )
    }
}

/// The request body as a tree: the translation for this crossing, or the client's own, with
/// the model's output clamp applied to the fields the body names.
fn tree(adm: &Admitted, crossing: Crossing, translated: &Translated) -> Result<Value, ApiError> {
    let mut j = if crossing == Crossing::Native {
        adm.tree_for_rewrite()?.into_owned()
    } else {
        translated.get(crossing).cloned().ok_or_else(|| {
            log::error!("no translated body for crossing {crossing:?}");
            ApiError::ServerError
        })?
    };
    if let Some(limit) = adm.output_clamp {
        crate::tokens::clamp_output(&mut j, limit);
    }
    Ok(j)
}

fn to_bytes(j: &Value) -> Result<Bytes, ApiError> {
    serde_json::to_vec(j)
        .map(Bytes::from)
        .map_err(|_| ApiError::ServerError)
}

/// `anthropic-beta: a,b` as Bedrock's body field `anthropic_beta: ["a","b"]`.
fn beta_list(header: &str) -> Value {
    Value::Array(
        header
            .split(',')
            .map(str::trim)
            .filter(|b| !b.is_empty())
            .map(Value::from)
            .collect(),
    )
}

/// Gemini's output ceiling is `generationConfig.maxOutputTokens`.
fn clamp_gemini_output(j: &mut Value, limit: u64) {
    let Some(config) = j.get_mut("generationConfig").and_then(Value::as_object_mut) else {
        return;
    };
    let over = config
        .get("maxOutputTokens")
        .and_then(Value::as_u64)
        .is_some_and(|n| n > limit);
    if over {
        config.insert("maxOutputTokens".into(), Value::from(limit));
    }
}

/// The dialect a cloud style's answers are read in ([`Dialect`]), `None` for the others.
pub fn dialect(style: ProviderStyle, header: &crate::http1::Fields) -> Option<Dialect> {
    match style {
        ProviderStyle::Bedrock => Some(Dialect::Aws {
            error_type: header
                .get("x-amzn-errortype")
                .and_then(|v| v.to_str().ok())
                .map(errors::aws_error_name),
        }),
        ProviderStyle::VertexAnthropic => Some(Dialect::Google),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_are_encoded_as_path_segments() {
        assert_eq!(
            segment("anthropic.claude-3-5-sonnet-20241022-v2:0", SEGMENT).to_string(),
            "anthropic.claude-3-5-sonnet-20241022-v2%3A0"
        );
        assert_eq!(
            segment("claude-sonnet-4@20250514", VERTEX_SEGMENT).to_string(),
            "claude-sonnet-4@20250514"
        );
        assert_eq!(
            segment("replay:a/b@whole#1", SEGMENT).to_string(),
            "replay%3Aa%2Fb%40whole%231"
        );
        assert_eq!(beta_list(" a, b ,,"), serde_json::json!(["a", "b"]));
    }

    #[test]
    fn gemini_output_is_clamped_in_its_generation_config() {
        let mut j = serde_json::json!({"generationConfig": {"maxOutputTokens": 9000}});
        clamp_gemini_output(&mut j, 100);
        assert_eq!(j["generationConfig"]["maxOutputTokens"], 100);
        clamp_gemini_output(&mut j, 200);
        assert_eq!(j["generationConfig"]["maxOutputTokens"], 100);
    }
}
