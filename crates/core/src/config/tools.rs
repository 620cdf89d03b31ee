//! `[tools]`: the providers behind the server-side tools.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::check::{Checker, ConfigError};
use super::file::ToolsFile;
use super::providers::Provider;

#[derive(Debug, Clone, Default)]
pub struct ToolsConfig {
    pub search: Option<Arc<Provider>>,
    pub web_fetch: Option<Arc<Provider>>,
}

pub(super) fn validate(
    c: &Checker,
    f: ToolsFile,
    providers: &BTreeMap<String, Arc<Provider>>,
) -> Result<ToolsConfig, ConfigError> {
    let tool = |k: &str, v: &Option<String>| -> Result<Option<Arc<Provider>>, ConfigError> {
        match v.as_deref().filter(|s| !s.is_empty()) {
            None => Ok(None),
            Some(name) => {
                let p = providers
                    .get(name)
                    .ok_or_else(|| c.err(k, format!("no [[providers]] named {name:?}")))?;
                // The tools are passed through as the client sent them.
                if !p.style.is_direct() {
                    return Err(c.err(
                        k,
                        format!(
                            "provider {name:?} is {:?}: tools need an \"openai\" or \"anthropic\" provider",
                            p.style.as_str()
                        ),
                    ));
                }
                Ok(Some(Arc::clone(p)))
            }
        }
    };
    Ok(ToolsConfig {
        search: tool("tools.search_provider", &f.search_provider)?,
        web_fetch: tool("tools.web_fetch_provider", &f.web_fetch_provider)?,
    })
}
