//! `[mail]`: how sign-in codes are sent.

use std::path::PathBuf;

use super::check::{Checker, ConfigError};
use super::file::MailFile;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MailTransport {
    Smtp { url: String },
    File { dir: PathBuf },
    Log,
}

#[derive(Debug, Clone)]
pub struct MailConfig {
    /// `None`: no transport configured, sign-in answers `email_not_configured`.
    pub transport: Option<MailTransport>,
    pub from: String,
}

pub(super) fn validate(c: &Checker, f: MailFile) -> Result<MailConfig, ConfigError> {
    let transport = match f.transport.as_deref().unwrap_or("") {
        "" => None,
        "smtp" => {
            let url = f.smtp_url.clone().unwrap_or_default();
            if !(url.starts_with("smtp://") || url.starts_with("smtps://")) {
                return Err(c.err(
                    "mail.smtp_url",
                    "transport \"smtp\" needs smtp_url = \"smtp://host:port\" or smtps://",
                ));
            }
            Some(MailTransport::Smtp { url })
        }
        "file" => Some(MailTransport::File {
            dir: PathBuf::from(f.outbox_dir.clone().unwrap_or_else(|| "data/outbox".into())),
        }),
        "log" => Some(MailTransport::Log),
        other => {
            return Err(c.err(
                "mail.transport",
                format!("must be \"smtp\", \"file\" or \"log\", got {other:?}"),
            ))
        }
    };
    Ok(MailConfig {
        transport,
        from: f
            .from
            .unwrap_or_else(|| "Gateway <no-reply@localhost>".into()),
    })
}
