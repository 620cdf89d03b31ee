//! Sign-in mail: one message with the 6-digit code and the magic link, as plain text and HTML,
//! delivered by the configured transport.
//!
//! - `smtp`: `lettre` over SMTP. `smtps://host[:465]` is TLS from the first byte;
//!   `smtp://host[:25]` upgrades with STARTTLS when the server offers it, and
//!   `?tls=required` / `?tls=none` make that mandatory / plaintext (trusted local relays).
//!   Credentials come only from `SMTP_USERNAME` / `SMTP_PASSWORD`, never from the file.
//! - `file`: one `.eml` per message in `outbox_dir` (development and tests), mode 0600.
//! - `log`: logs that a mail went out, never its code or link.

use std::path::Path;
use std::time::Duration;

use lettre::message::header::{ContentTransferEncoding, ContentType};
use lettre::message::{Body, Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use gateway_core::config::{MailConfig, MailTransport};

pub const SMTP_USERNAME_ENV: &str = "SMTP_USERNAME";
pub const SMTP_PASSWORD_ENV: &str = "SMTP_PASSWORD";

/// A whole SMTP exchange may take this long before the sign-in answers with an error.
const SMTP_TIMEOUT: Duration = Duration::from_secs(15);

/// What a sign-in mail says.
pub struct SignInMail<'a> {
    pub to: &'a str,
    pub code: &'a str,
    pub link: &'a str,
    pub code_ttl: Duration,
    pub link_ttl: Duration,
}

/// Why a mail could not go out. The text is for the log only and never holds the code or link.
#[derive(Debug, thiserror::Error)]
pub enum MailError {
    #[error("no mail transport configured")]
    NotConfigured,
    #[error("cannot build message: {0}")]
    Build(String),
    #[error("smtp: {0}")]
    Smtp(String),
    #[error("outbox: {0}")]
    File(String),
}

/// Sends the sign-in mail with the configured transport.
pub async fn send_sign_in(cfg: &MailConfig, mail: &SignInMail<'_>) -> Result<(), MailError> {
    let transport = cfg.transport.as_ref().ok_or(MailError::NotConfigured)?;
    let message = build(&cfg.from, mail)?;
    match transport {
        MailTransport::Smtp { url } => send_smtp(url, message).await,
        MailTransport::File { dir } => write_eml(dir, &message),
        MailTransport::Log => {
            let domain = mail.to.rsplit('@').next().unwrap_or("");
            log::info!("sign-in mail sent (log transport) to a recipient at {domain}");
            Ok(())
        }
    }
}

fn minutes(d: Duration) -> u64 {
    d.as_secs().div_ceil(60).max(1)
}

/// The plain-text part. The code stands alone on its line so mail clients and people can pick
/// it out; the link is on its own line so it stays clickable.
fn text_body(mail: &SignInMail<'_>) -> String {
    format!(
        "Your sign-in code is:\n\n{code}\n\nIt expires in {cm} minutes.\n\n\
         Or sign in with this link (valid for {lm} minutes):\n\n{link}\n\n\
         If you did not ask to sign in, ignore this message.\n",
        code = mail.code,
        link = mail.link,
        cm = minutes(mail.code_ttl),
        lm = minutes(mail.link_ttl),
    )
}

fn html_body(mail: &SignInMail<'_>) -> String {
    let link = html_escape(mail.link);
    format!(
        "<!doctype html><html><body style=\"font-family:sans-serif\">\
         <p>Your sign-in code is:</p>\
         <p style=\"font-size:28px;font-weight:bold;letter-spacing:4px\">{code}</p>\
         <p>It expires in {cm} minutes.</p>\
         <p>Or <a href=\"{link}\">sign in with this link</a> (valid for {lm} minutes):<br>{link}</p>\
         <p>If you did not ask to sign in, ignore this message.</p>\
         </body></html>\n",
        code = html_escape(mail.code),
        cm = minutes(mail.code_ttl),
        lm = minutes(mail.link_ttl),
    )
}

/// Minimal HTML escaping for text and attribute values.
pub fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A part in 7bit when it is ASCII with lines within RFC 5322's 998 characters, so the outbox
/// and any mail source view show the code and link verbatim (lettre would pick
/// quoted-printable for the long link line, which splits it). Anything else: lettre's choice.
fn part(content_type: ContentType, text: String) -> SinglePart {
    let crlf = text.replace("\r\n", "\n").replace('\n', "\r\n");
    let seven_bit = crlf.is_ascii()
        && !crlf.bytes().any(|b| b == 0)
        && crlf
            .split("\r\n")
            .all(|line| line.len() <= 998 && !line.contains('\r'));
    let body = if seven_bit {
        Body::dangerous_pre_encoded(crlf.into_bytes(), ContentTransferEncoding::SevenBit)
    } else {
        Body::new(text)
    };
    SinglePart::builder().header(content_type).body(body)
}

fn build(from: &str, mail: &SignInMail<'_>) -> Result<Message, MailError> {
    let from: Mailbox = from
        .parse()
        .map_err(|e| MailError::Build(format!("from address: {e}")))?;
    let to: Mailbox = mail
        .to
        .parse()
        .map_err(|e| MailError::Build(format!("recipient address: {e}")))?;
    Message::builder()
        .from(from)
        .to(to)
        .subject("Your sign-in code")
        .multipart(
            MultiPart::alternative()
                .singlepart(part(ContentType::TEXT_PLAIN, text_body(mail)))
                .singlepart(part(ContentType::TEXT_HTML, html_body(mail))),
        )
        .map_err(|e| MailError::Build(e.to_string()))
}

/// How an `smtp_url` asks to connect.
#[derive(Debug, PartialEq, Eq)]
struct SmtpTarget {
    host: String,
    port: u16,
    tls: TlsMode,
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum TlsMode {
    Wrapper,
    Required,
    Opportunistic,
    None,
}

fn parse_smtp_url(url: &str) -> Result<SmtpTarget, String> {
    let (implicit_tls, rest) = if let Some(r) = url.strip_prefix("smtps://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("smtp://") {
        (false, r)
    } else {
        return Err("smtp_url must start with smtp:// or smtps://".into());
    };
    let (authority, query) = match rest.split_once('?') {
        Some((a, q)) => (a, q),
        None => (rest, ""),
    };
    let authority = authority.trim_end_matches('/');
    if authority.contains('@') {
        log::warn!("credentials in mail.smtp_url are ignored; set SMTP_USERNAME/SMTP_PASSWORD");
    }
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let default_port = if implicit_tls { 465 } else { 25 };
    let (host, port) = if let Some(r) = authority.strip_prefix('[') {
        let (h, after) = r.split_once(']').ok_or("bad IPv6 host in smtp_url")?;
        (h, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| format!("bad port in smtp_url: {p:?}"))?,
        None => default_port,
    };
    if host.is_empty() {
        return Err("smtp_url needs a host".into());
    }
    let requested = form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "tls")
        .map(|(_, v)| v.to_string());
    let tls = match (implicit_tls, requested.as_deref()) {
        (true, _) => TlsMode::Wrapper,
        (false, Some("required")) => TlsMode::Required,
        (false, Some("none")) => TlsMode::None,
        (false, None | Some("opportunistic")) => TlsMode::Opportunistic,
        (false, Some(other)) => return Err(format!("unknown tls={other:?} in smtp_url")),
    };
    Ok(SmtpTarget {
        host: host.to_string(),
        port,
        tls,
    })
}

async fn send_smtp(url: &str, message: Message) -> Result<(), MailError> {
    let target = parse_smtp_url(url).map_err(MailError::Smtp)?;
    let params =
        || TlsParameters::new(target.host.clone()).map_err(|e| MailError::Smtp(e.to_string()));
    let tls = match target.tls {
        TlsMode::Wrapper => Tls::Wrapper(params()?),
        TlsMode::Required => Tls::Required(params()?),
        TlsMode::Opportunistic => Tls::Opportunistic(params()?),
        TlsMode::None => Tls::None,
    };
    let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(target.host.clone())
        .port(target.port)
        .tls(tls)
        .timeout(Some(SMTP_TIMEOUT));
    if let (Ok(user), Ok(pass)) = (
        std::env::var(SMTP_USERNAME_ENV),
        std::env::var(SMTP_PASSWORD_ENV),
    ) {
        if !user.is_empty() {
            builder = builder.credentials(Credentials::new(user, pass));
        }
    }
    let transport = builder.build();
    transport
        .send(message)
        .await
        .map(|_| ())
        .map_err(|e| MailError::Smtp(e.to_string()))
}

/// Writes the message as `<ms>-<random>.eml`: to a hidden temp name first, then renamed, so a
/// reader of the outbox never sees half a message.
fn write_eml(dir: &Path, message: &Message) -> Result<(), MailError> {
    {
        use std::os::unix::fs::DirBuilderExt;
        // 0700: the messages carry sign-in codes and links.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| MailError::File(format!("{}: {e}", dir.display())))?;
    }
    let name = format!(
        "{}-{}.eml",
        gateway_core::util::now_ms(),
        gateway_core::util::random_base62(8)
    );
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut f = opts.open(&tmp)?;
        f.write_all(&message.formatted())?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(&name))
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        MailError::File(format!("{}: {e}", dir.display()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smtp_urls() {
        let t = parse_smtp_url("smtp://127.0.0.1:2525").expect("plain");
        assert_eq!(
            (t.host.as_str(), t.port, t.tls),
            ("127.0.0.1", 2525, TlsMode::Opportunistic)
        );
        let t = parse_smtp_url("smtps://mail.example.com").expect("tls");
        assert_eq!((t.port, t.tls), (465, TlsMode::Wrapper));
        let t = parse_smtp_url("smtp://mail.example.com:587?tls=required").expect("starttls");
        assert_eq!((t.port, t.tls), (587, TlsMode::Required));
        let t = parse_smtp_url("smtp://relay?tls=none").expect("none");
        assert_eq!((t.port, t.tls), (25, TlsMode::None));
        let t = parse_smtp_url("smtp://[::1]:2525").expect("v6");
        assert_eq!((t.host.as_str(), t.port), ("::1", 2525));
        let t = parse_smtp_url("smtps://[::1]").expect("v6 default port");
        assert_eq!((t.host.as_str(), t.port), ("::1", 465));
        assert!(parse_smtp_url("smtp://h?tls=maybe").is_err());
        assert!(parse_smtp_url("http://h").is_err());
    }

    #[test]
    fn message_has_code_and_link_in_both_parts() {
        let mail = SignInMail {
            to: "a@example.com",
            code: "012345",
            link: "https://gw.example.com/api/auth/verify-link?token=abcdefghijklmnopqrstuvwxyz0123456789_-ABCDE",
            code_ttl: Duration::from_secs(600),
            link_ttl: Duration::from_secs(900),
        };
        let msg = build("Gateway <no-reply@example.com>", &mail).expect("build");
        let text = String::from_utf8(msg.formatted()).expect("utf8");
        assert!(text.contains("multipart/alternative"));
        assert!(text.contains("text/plain"));
        assert!(text.contains("text/html"));
        assert!(text.contains("\r\n012345\r\n"));
        assert_eq!(text.matches(mail.link).count(), 3, "{text}");
    }
}
