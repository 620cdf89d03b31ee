//! Replay mode: answers with a recorded provider response, byte for byte, cut into frames at the
//! places a parser is most likely to get wrong.
//!
//! Started with `--fixtures DIR`, the mock answers any request whose `model` is
//! `replay:<name>` or `replay:<name>@<chunking>` (optionally followed by `#<tag>`) with the file `DIR/<name>.http`: a raw HTTP
//! response (status line, headers, a blank line, then the body exactly as the provider sends
//! it). The model name is the selector because it is the one thing a gateway always forwards
//! (a test sets it through a model's `upstream_model`). Chunkings:
//!
//! - `whole` (the default): the body in one frame, with a `content-length`;
//! - `every-N`: frames of N bytes, chunked;
//! - `awkward`: chunked, cut inside every multi-byte UTF-8 character, three bytes into every
//!   line (mid-field: `dat|a:`) and between the two line ends that close every event.
//!
//! The fixture's own `content-length` and `transfer-encoding` are dropped: the framing is the
//! mock's, the headers and the body are the provider's.
//!
//! A Bedrock stream (`content-type: application/vnd.amazon.eventstream`) is binary; its fixture
//! writes each message as two lines (its headers as a JSON object, then its payload), which the
//! mock encodes into the binary framing. Cut `awkward`ly, its frames end inside every message's
//! prelude, inside its headers and one byte before its end.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{Response, StatusCode};

use crate::body::{full_body, paced_body, BoxedBody, Step};

/// The prefix of a `model` that asks for a replay.
const PREFIX: &str = "replay:";

/// How the body is cut into frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunking {
    Whole,
    Every(usize),
    Awkward,
}

impl Chunking {
    fn parse(s: &str) -> Option<Chunking> {
        match s {
            "" | "whole" => Some(Chunking::Whole),
            "awkward" => Some(Chunking::Awkward),
            other => other
                .strip_prefix("every-")
                .and_then(|n| n.parse().ok())
                .filter(|n| *n > 0)
                .map(Chunking::Every),
        }
    }
}

/// A fixture read from disk, ready to send.
#[derive(Debug)]
pub struct Recorded {
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
    chunking: Chunking,
    /// Where each message of a binary event stream starts in `body`.
    messages: Option<Vec<usize>>,
}

/// What a replay request gets: the recording, or why there is none.
#[derive(Debug)]
pub enum Answer {
    Recorded(Recorded),
    /// No such fixture, a bad name or chunking, or an unreadable file.
    Refused(StatusCode, String),
}

/// The replay answer for a request naming `model`, or `None` when the request is not a replay
/// (or the mock has no fixture directory).
pub fn answer(dir: Option<&Path>, model: &str) -> Option<Answer> {
    let spec = model.strip_prefix(PREFIX)?;
    // `#tag` tells apart deployments that replay the same fixture (the gateway cools failing
    // deployments down by name); the mock ignores it.
    let spec = spec.split_once('#').map_or(spec, |(s, _)| s);
    let Some(dir) = dir else {
        return Some(Answer::Refused(
            StatusCode::NOT_FOUND,
            "replay requested but the mock was started without --fixtures".into(),
        ));
    };
    let (name, chunking) = spec.split_once('@').unwrap_or((spec, ""));
    let Some(chunking) = Chunking::parse(chunking) else {
        return Some(Answer::Refused(
            StatusCode::BAD_REQUEST,
            format!("unknown chunking {chunking:?}"),
        ));
    };
    // Names are relative paths of plain segments: nothing may climb out of the directory.
    let safe = !name.is_empty()
        && name.split('/').all(|seg| {
            !seg.is_empty()
                && seg != ".."
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        });
    if !safe {
        return Some(Answer::Refused(
            StatusCode::BAD_REQUEST,
            format!("bad fixture name {name:?}"),
        ));
    }
    let path: PathBuf = dir.join(format!("{name}.http"));
    let raw = match std::fs::read(&path) {
        Ok(raw) => raw,
        Err(e) => {
            return Some(Answer::Refused(
                StatusCode::NOT_FOUND,
                format!("fixture {}: {e}", path.display()),
            ))
        }
    };
    Some(match parse(&raw, chunking) {
        Ok(rec) => Answer::Recorded(rec),
        Err(e) => Answer::Refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("fixture {}: {e}", path.display()),
        ),
    })
}

/// Splits a raw HTTP response into status, headers and body. The head may use `\n` or `\r\n`
/// line ends; the body is taken as it is.
fn parse(raw: &[u8], chunking: Chunking) -> Result<Recorded, String> {
    let (head, body) = split_head(raw).ok_or("no blank line after the headers")?;
    let head = std::str::from_utf8(head).map_err(|_| "head is not UTF-8")?;
    let mut lines = head.lines();
    let status_line = lines.next().ok_or("empty head")?;
    let code = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let status = StatusCode::from_u16(code).map_err(|e| e.to_string())?;
    let mut headers = Vec::new();
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| format!("bad header line {line:?}"))?;
        let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|e| e.to_string())?;
        if name == CONTENT_LENGTH || name == TRANSFER_ENCODING {
            continue;
        }
        let value = HeaderValue::from_str(value.trim()).map_err(|e| e.to_string())?;
        headers.push((name, value));
    }
    let event_stream = headers.iter().any(|(n, v)| {
        n == http::header::CONTENT_TYPE
            && v.as_bytes()
                .starts_with(crate::cloud::eventstream::CONTENT_TYPE.as_bytes())
    });
    let (body, messages) = if event_stream {
        let (encoded, starts) = crate::cloud::eventstream::encode_fixture(body)?;
        (encoded, Some(starts))
    } else {
        (Bytes::copy_from_slice(body), None)
    };
    Ok(Recorded {
        status,
        headers,
        body,
        chunking,
        messages,
    })
}

fn split_head(raw: &[u8]) -> Option<(&[u8], &[u8])> {
    let crlf = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    let lf = raw.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let (at, len) = match (crlf, lf) {
        (Some(a), Some(b)) => std::cmp::min_by_key(a, b, |x| x.0),
        (a, b) => a.or(b)?,
    };
    Some((&raw[..at], &raw[at + len..]))
}

/// Where `awkward` cuts `body`: inside every multi-byte UTF-8 character, three bytes into every
/// line, and between the two line ends that close an event.
fn awkward_cuts(body: &[u8]) -> BTreeSet<usize> {
    let mut cuts = BTreeSet::new();
    let mut line_start = 0;
    for (i, &b) in body.iter().enumerate() {
        if b >= 0xC0 {
            cuts.insert(i + 1);
        }
        if b == b'\n' {
            line_start = i + 1;
            // `\n\n` or `\n\r\n`: the event's end, cut between its two line ends.
            if body.get(i + 1) == Some(&b'\n') || body.get(i + 1) == Some(&b'\r') {
                cuts.insert(i + 1);
            }
        } else if i == line_start + 2 {
            cuts.insert(i + 1);
        }
    }
    cuts.retain(|&c| c > 0 && c < body.len());
    cuts
}

/// Where `awkward` cuts a binary event stream: inside each message's prelude, inside its
/// headers, and one byte before its end.
fn message_cuts(body: &[u8], starts: &[usize]) -> BTreeSet<usize> {
    let mut cuts = BTreeSet::new();
    for (i, start) in starts.iter().enumerate() {
        let end = starts.get(i + 1).copied().unwrap_or(body.len());
        cuts.extend([start + 3, start + 14, end.saturating_sub(1)]);
    }
    cuts.retain(|&c| c > 0 && c < body.len());
    cuts
}

/// The body's frames for a chunking.
fn frames(body: &Bytes, chunking: Chunking, messages: Option<&[usize]>) -> Vec<Bytes> {
    let cuts: Vec<usize> = match (chunking, messages) {
        (Chunking::Whole, _) => Vec::new(),
        (Chunking::Every(n), _) => (n..body.len()).step_by(n).collect(),
        (Chunking::Awkward, Some(starts)) => message_cuts(body, starts).into_iter().collect(),
        (Chunking::Awkward, None) => awkward_cuts(body).into_iter().collect(),
    };
    let mut out = Vec::with_capacity(cuts.len() + 1);
    let mut start = 0;
    for cut in cuts.into_iter().chain(std::iter::once(body.len())) {
        if cut > start {
            out.push(body.slice(start..cut));
            start = cut;
        }
    }
    out
}

/// The hyper response for a replay answer; frames are paced like the mock's own streams.
pub fn render(answer: Answer, delay: Duration) -> Result<Response<BoxedBody>, http::Error> {
    let rec = match answer {
        Answer::Recorded(rec) => rec,
        Answer::Refused(status, message) => {
            let body = serde_json::json!({"error": {"message": message, "type": "mock_replay"}});
            return Response::builder()
                .status(status)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(full_body(Bytes::from(body.to_string())));
        }
    };
    let mut builder = Response::builder().status(rec.status);
    for (name, value) in rec.headers {
        builder = builder.header(name, value);
    }
    let body = match rec.chunking {
        Chunking::Whole => {
            builder = builder.header(CONTENT_LENGTH, rec.body.len());
            full_body(rec.body)
        }
        chunking => {
            let steps = frames(&rec.body, chunking, rec.messages.as_deref())
                .into_iter()
                .map(Step::Data)
                .collect();
            paced_body(steps, delay)
        }
    };
    builder.body(body)
}

/// Read errors of the fixture directory at start, so a typo fails loudly.
pub fn check_dir(dir: &Path) -> io::Result<()> {
    if std::fs::metadata(dir)?.is_dir() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "--fixtures {} is not a directory",
            dir.display()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunkings_parse() {
        assert_eq!(Chunking::parse(""), Some(Chunking::Whole));
        assert_eq!(Chunking::parse("every-7"), Some(Chunking::Every(7)));
        assert_eq!(Chunking::parse("every-0"), None);
        assert_eq!(Chunking::parse("awkward"), Some(Chunking::Awkward));
        assert_eq!(Chunking::parse("sideways"), None);
    }

    #[test]
    fn fixture_files_parse_with_either_line_end() {
        for raw in [
            &b"HTTP/1.1 429 Too Many Requests\nretry-after: 2\ncontent-length: 9\n\n{\"a\":\"\n\"}"[..],
            &b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 2\r\ncontent-length: 9\r\n\r\n{\"a\":\"\n\"}"[..],
        ] {
            let rec = parse(raw, Chunking::Whole).unwrap();
            assert_eq!(rec.status, StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(rec.headers.len(), 1, "content-length is the mock's own");
            assert_eq!(&rec.body[..], b"{\"a\":\"\n\"}");
        }
        assert!(parse(b"HTTP/1.1 200 OK\nbroken header\n\n{}", Chunking::Whole).is_err());
    }

    #[test]
    fn awkward_frames_cut_lines_events_and_characters() {
        let body = Bytes::from("data: {\"t\":\"é\"}\n\ndata: [DONE]\n\n");
        let frames = frames(&body, Chunking::Awkward, None);
        let joined: Vec<u8> = frames.iter().flat_map(|f| f.to_vec()).collect();
        assert_eq!(joined, body.to_vec());
        assert_eq!(&frames[0][..], b"dat");
        assert!(frames.iter().any(|f| f.ends_with(&[0xC3])), "{frames:?}");
        assert!(frames.iter().any(|f| &f[..] == b"\n"), "{frames:?}");
        assert!(frames.iter().all(|f| !f.is_empty()));
    }

    #[test]
    fn names_cannot_leave_the_directory() {
        let dir = Path::new("/nonexistent");
        for bad in [
            "replay:../etc/passwd",
            "replay:a//b",
            "replay:",
            "replay:a b",
        ] {
            assert!(
                matches!(
                    answer(Some(dir), bad),
                    Some(Answer::Refused(StatusCode::BAD_REQUEST, _))
                ),
                "{bad}"
            );
        }
        assert!(answer(Some(dir), "mock-gpt").is_none());
    }
}
