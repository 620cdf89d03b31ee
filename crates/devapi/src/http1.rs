//! Reading a provider's HTTP/1.1 answer: the head parsed by `httparse` into its fields
//! ([`Fields`], whose values share one copy of the head), then the body as its framing says
//! (`content-length`, `chunked`, or until the connection closes), handed on as it arrives.
//!
//! Why not Pingora's client session: it keeps a case-preserving copy of every header name
//! beside the map (each name title-cased into a new allocation and parsed back), which no part
//! of the gateway reads, and its body reader re-checks its state on every read. The answer's
//! head is read once per request, on every request.
//!
//! Everything here reads hostile input: the head is bounded (`MAX_HEAD`), chunk sizes and
//! trailers are bounded, and framing that does not parse is an error, never a guess.

use std::mem::MaybeUninit;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures::FutureExt;
use http::HeaderValue;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The most bytes an answer's head (status line and header fields) may take.
const MAX_HEAD: usize = 64 * 1024;
const MAX_HEADERS: usize = 128;
/// Informational (1xx) heads skipped before the answer's own, at most.
const MAX_INFORMATIONAL: usize = 5;
/// A chunk-size line or a trailer field longer than this is refused.
const MAX_LINE: usize = 8 * 1024;
/// Bytes asked of the socket per read.
const READ_SIZE: usize = 16 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("timed out")]
    Timeout,
    #[error("{0}")]
    Io(String),
    /// The connection ended (closed or reset) before any byte of an answer: a pooled
    /// connection the provider had already closed, which another may retry.
    #[error("connection closed before any answer: {0}")]
    NothingArrived(String),
    /// The bytes are not an HTTP/1.1 answer (or its framing).
    #[error("invalid answer: {0}")]
    Invalid(&'static str),
}

/// How the body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    /// This many bytes are left.
    Length(u64),
    Chunked(Chunk),
    /// The connection closing ends it (no length, not chunked).
    UntilClose,
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// A chunk-size line is next.
    Size,
    /// This many bytes of the chunk's data are left.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// Trailer fields, until an empty line.
    Trailers,
}

/// An answer whose head has arrived; its body is read with [`Response::next_chunk`].
pub struct Response<S> {
    stream: S,
    /// Read from the stream and not handed on yet.
    buf: BytesMut,
    pub status: u16,
    pub headers: Fields,
    body: Body,
    keep_alive: bool,
    /// Applies to each read that has to wait.
    pub read_timeout: Option<Duration>,
}

impl<S: AsyncRead + Unpin> Response<S> {
    /// Reads the answer's head (skipping informational answers) from `stream`, all of it
    /// within `timeout`. On an error the stream is dropped (closed).
    pub async fn read_head(mut stream: S, timeout: Option<Duration>) -> Result<Self, ReadError> {
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut buf = BytesMut::with_capacity(READ_SIZE);
        let mut skipped = 0;
        let mut arrived = false;
        loop {
            if let Some(parsed) = parse_head(&mut buf)? {
                let (status, version, headers) = parsed;
                if status == 101 {
                    // The gateway never asks to switch protocols.
                    return Err(ReadError::Invalid("101 Switching Protocols unasked"));
                }
                if (100..200).contains(&status) {
                    skipped += 1;
                    if skipped > MAX_INFORMATIONAL {
                        return Err(ReadError::Invalid("too many informational answers"));
                    }
                    continue;
                }
                let body = framing(status, &headers)?;
                // Both framings named is a message to read once and not trust further
                // (RFC 9112 §6.3): the connection is not reused.
                let both = headers.contains_key("transfer-encoding")
                    && headers.contains_key("content-length");
                let keep_alive = version == 1
                    && body != Body::UntilClose
                    && !both
                    && !has_token(&headers, "connection", "close");
                return Ok(Response {
                    stream,
                    buf,
                    status,
                    headers,
                    body,
                    keep_alive,
                    read_timeout: timeout,
                });
            }
            if buf.len() >= MAX_HEAD {
                return Err(ReadError::Invalid("head too large"));
            }
            buf.reserve(READ_SIZE);
            let read = stream.read_buf(&mut buf);
            let read = match deadline {
                Some(at) => tokio::time::timeout_at(at, read)
                    .await
                    .map_err(|_| ReadError::Timeout)?,
                None => read.await,
            };
            match read {
                Ok(0) if !arrived => return Err(ReadError::NothingArrived("closed".into())),
                Ok(0) => {
                    return Err(ReadError::Io(
                        "connection closed before the answer's head".into(),
                    ))
                }
                Ok(_) => arrived = true,
                Err(e) if !arrived => return Err(ReadError::NothingArrived(e.to_string())),
                Err(e) => return Err(ReadError::Io(e.to_string())),
            }
        }
    }

    /// The next piece of the body; `Ok(None)` at its end.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>, ReadError> {
        loop {
            if let Some(piece) = self.take_buffered()? {
                return Ok(Some(piece));
            }
            if self.body == Body::Done {
                return Ok(None);
            }
            let n = fill(&mut self.stream, &mut self.buf, self.read_timeout).await?;
            if n == 0 {
                return self.closed();
            }
        }
    }

    /// The next piece of the body if it has already arrived; `None` when a read would wait.
    /// Such a read cannot wait, so no timer is set for it.
    pub fn ready_chunk(&mut self) -> Option<Result<Option<Bytes>, ReadError>> {
        loop {
            match self.take_buffered() {
                Ok(Some(piece)) => return Some(Ok(Some(piece))),
                Ok(None) if self.body == Body::Done => return Some(Ok(None)),
                Ok(None) => {}
                Err(e) => return Some(Err(e)),
            }
            self.buf.reserve(READ_SIZE);
            let read =
                tokio::task::unconstrained(self.stream.read_buf(&mut self.buf)).now_or_never()?;
            match read {
                Ok(0) => return Some(self.closed()),
                Ok(_) => {}
                Err(e) => return Some(Err(ReadError::Io(e.to_string()))),
            }
        }
    }

    /// Whether the whole body has been read.
    pub fn is_body_done(&self) -> bool {
        self.body == Body::Done
    }

    /// The connection, when another request may use it: the body read to its end, nothing
    /// read past it, and neither side asked to close.
    pub fn reusable(self) -> Option<S> {
        (self.keep_alive && self.body == Body::Done && self.buf.is_empty()).then_some(self.stream)
    }

    /// The first `n` buffered bytes, copied out: the buffer is then the reader's alone again and
    /// the next read reuses it, where a piece split off would keep it shared and make every
    /// read of a stream allocate a new one. Pieces are small (a stream's event, a JSON answer).
    fn take(&mut self, n: usize) -> Bytes {
        let piece = Bytes::copy_from_slice(&self.buf[..n]);
        self.buf.advance(n);
        piece
    }

    /// The peer closed the connection: the end of a body that runs until then, an error for
    /// any other.
    fn closed(&mut self) -> Result<Option<Bytes>, ReadError> {
        if self.body == Body::UntilClose {
            self.body = Body::Done;
            Ok(None)
        } else {
            Err(ReadError::Io(
                "connection closed before the answer's end".into(),
            ))
        }
    }

    /// Body bytes already read, as the framing allows; `None` when more must be read first
    /// (or the body is done).
    fn take_buffered(&mut self) -> Result<Option<Bytes>, ReadError> {
        loop {
            match self.body {
                Body::Done => return Ok(None),
                Body::UntilClose => {
                    let n = self.buf.len();
                    return Ok((n > 0).then(|| self.take(n)));
                }
                Body::Length(left) => {
                    if self.buf.is_empty() {
                        return Ok(None);
                    }
                    let n = left.min(self.buf.len() as u64);
                    let piece = self.take(n as usize);
                    self.body = if n == left {
                        Body::Done
                    } else {
                        Body::Length(left - n)
                    };
                    return Ok(Some(piece));
                }
                // httparse reads a line without digits as size 0: refused here.
                Body::Chunked(Chunk::Size)
                    if self.buf.first().is_some_and(|b| !b.is_ascii_hexdigit()) =>
                {
                    return Err(ReadError::Invalid("chunk size"))
                }
                Body::Chunked(Chunk::Size) => match httparse::parse_chunk_size(&self.buf) {
                    Ok(httparse::Status::Complete((used, size))) => {
                        self.buf.advance(used);
                        self.body = Body::Chunked(if size == 0 {
                            Chunk::Trailers
                        } else {
                            Chunk::Data(size)
                        });
                    }
                    Ok(httparse::Status::Partial) if self.buf.len() < MAX_LINE => return Ok(None),
                    _ => return Err(ReadError::Invalid("chunk size")),
                },
                Body::Chunked(Chunk::Data(left)) => {
                    if self.buf.is_empty() {
                        return Ok(None);
                    }
                    let n = left.min(self.buf.len() as u64);
                    let piece = self.take(n as usize);
                    self.body = Body::Chunked(if n == left {
                        Chunk::DataEnd
                    } else {
                        Chunk::Data(left - n)
                    });
                    return Ok(Some(piece));
                }
                Body::Chunked(Chunk::DataEnd) => {
                    if self.buf.len() < 2 {
                        return Ok(None);
                    }
                    if &self.buf[..2] != b"\r\n" {
                        return Err(ReadError::Invalid("chunk data not followed by CRLF"));
                    }
                    self.buf.advance(2);
                    self.body = Body::Chunked(Chunk::Size);
                }
                Body::Chunked(Chunk::Trailers) => {
                    let Some(end) = memchr::memmem::find(&self.buf, b"\r\n") else {
                        if self.buf.len() >= MAX_LINE {
                            return Err(ReadError::Invalid("trailer field too long"));
                        }
                        return Ok(None);
                    };
                    self.buf.advance(end + 2);
                    if end == 0 {
                        self.body = Body::Done;
                    }
                }
            }
        }
    }
}

/// Reads more of the stream into `buf`: the bytes read (0: the peer closed).
async fn fill<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    timeout: Option<Duration>,
) -> Result<usize, ReadError> {
    buf.reserve(READ_SIZE);
    let read = stream.read_buf(buf);
    let n = match timeout {
        Some(t) => tokio::time::timeout(t, read)
            .await
            .map_err(|_| ReadError::Timeout)?,
        None => read.await,
    };
    n.map_err(|e| ReadError::Io(e.to_string()))
}

/// An answer head's fields in the order they came: each name as sent (in any case) and each
/// value as bytes of one copy of the head. Looked up by a case-insensitive scan: an answer
/// carries a dozen fields, of which the gateway reads a few and passes on fewer
/// (`sanitize::client_header_name`), so naming and hashing every one into an `http::HeaderMap`
/// cost more than the lookups it served, and a `HeaderValue` is made only for a field passed
/// on ([`Fields::header_value`]).
#[derive(Debug, Clone, Default)]
pub struct Fields {
    head: Bytes,
    /// Each field's name and value, as ranges of `head`.
    fields: Vec<(std::ops::Range<usize>, std::ops::Range<usize>)>,
}

/// One field's value as the head carries it: bytes `httparse` accepts in a value (tab, space,
/// visible ASCII, and obs-text, which `HeaderValue` accepts too).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FieldValue<'a>(&'a [u8]);

/// A field value that is not visible ASCII text.
#[derive(Debug)]
pub struct NotText;

impl<'a> FieldValue<'a> {
    pub fn as_bytes(self) -> &'a [u8] {
        self.0
    }

    /// The value as text, when it is visible ASCII (as `HeaderValue::to_str` reads it).
    pub fn to_str(self) -> Result<&'a str, NotText> {
        if self
            .0
            .iter()
            .all(|b| *b == b'\t' || (b' '..=b'~').contains(b))
        {
            std::str::from_utf8(self.0).map_err(|_| NotText)
        } else {
            Err(NotText)
        }
    }
}

impl std::fmt::Debug for FieldValue<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self.0))
    }
}

impl PartialEq<str> for FieldValue<'_> {
    fn eq(&self, other: &str) -> bool {
        self.0 == other.as_bytes()
    }
}

impl PartialEq<&str> for FieldValue<'_> {
    fn eq(&self, other: &&str) -> bool {
        self.0 == other.as_bytes()
    }
}

impl Fields {
    /// The first value of the field `name` (case-insensitive).
    pub fn get(&self, name: &str) -> Option<FieldValue<'_>> {
        self.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }

    /// Every value of the field `name` (case-insensitive), in order.
    pub fn get_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = FieldValue<'a>> + 'a {
        self.iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Each field's name (as sent) and value, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], FieldValue<'_>)> {
        self.fields.iter().map(|(name, value)| {
            (
                &self.head[name.clone()],
                FieldValue(&self.head[value.clone()]),
            )
        })
    }

    /// `value` (one of these fields') as a header value sharing the head's bytes: for a field
    /// passed on. `None` for a value that is not one of these fields' or is not a valid header
    /// value.
    pub fn header_value(&self, value: FieldValue<'_>) -> Option<HeaderValue> {
        let start = (value.0.as_ptr() as usize).checked_sub(self.head.as_ptr() as usize)?;
        let end = start.checked_add(value.0.len())?;
        if end > self.head.len() {
            return None;
        }
        HeaderValue::from_maybe_shared(self.head.slice(start..end)).ok()
    }

    /// Fields from `(name, value)` pairs, as a head carrying them would give.
    #[cfg(test)]
    pub fn of(pairs: &[(&str, &str)]) -> Fields {
        let mut wire = String::from("HTTP/1.1 200 OK\r\n");
        for (name, value) in pairs {
            wire.push_str(&format!("{name}: {value}\r\n"));
        }
        wire.push_str("\r\n");
        let parsed = parse_head(&mut BytesMut::from(wire.as_bytes()));
        parsed.ok().flatten().map(|(_, _, f)| f).unwrap_or_default()
    }
}

type Head = (u16, u8, Fields);

/// A whole head at the start of `buf`, taken out of it: status, minor version, fields (values
/// share one copy of the head's bytes). `None`: not all of it has arrived.
fn parse_head(buf: &mut BytesMut) -> Result<Option<Head>, ReadError> {
    if buf.is_empty() {
        return Ok(None);
    }
    // Left uninitialised: httparse writes the fields it finds (zeroing all 128 on every parse
    // cost more than parsing a typical head).
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut []);
    let mut config = httparse::ParserConfig::default();
    config.allow_obsolete_multiline_headers_in_responses(true);
    let len = match config.parse_response_with_uninit_headers(&mut resp, buf, &mut fields) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(ReadError::Invalid("too many header fields"))
        }
        Err(_) => return Err(ReadError::Invalid("head does not parse")),
    };
    let status = resp.code.ok_or(ReadError::Invalid("no status"))?;
    let version = resp.version.unwrap_or(1);
    // httparse accepts only names made of token characters, so every name here is one HTTP
    // allows.
    let base = buf.as_ptr() as usize;
    let at = |s: &[u8]| s.as_ptr() as usize - base;
    let fields: Vec<(std::ops::Range<usize>, std::ops::Range<usize>)> = resp
        .headers
        .iter()
        .map(|f| {
            let (name, value) = (at(f.name.as_bytes()), at(f.value));
            (name..name + f.name.len(), value..value + f.value.len())
        })
        .collect();
    // Copied out (a few hundred bytes) so the read buffer stays the reader's alone. A value
    // folded over several lines (obsolete, but allowed in answers) keeps its line breaks in
    // httparse's view: they become spaces (RFC 9112 §5.2), so the field is kept, not dropped.
    let mut head = BytesMut::from(&buf[..len]);
    for (_, value) in &fields {
        for b in &mut head[value.clone()] {
            if *b == b'\r' || *b == b'\n' {
                *b = b' ';
            }
        }
    }
    let head = head.freeze();
    buf.advance(len);
    Ok(Some((status, version, Fields { head, fields })))
}

/// The body's framing (RFC 9112 §6.3): none for 204 and 304, chunked when the last transfer
/// coding says so, else `content-length` (several that differ are refused), else the rest of
/// the connection.
fn framing(status: u16, headers: &Fields) -> Result<Body, ReadError> {
    if matches!(status, 204 | 304) {
        return Ok(Body::Done);
    }
    if let Some(te) = headers.get_all("transfer-encoding").last() {
        let last = te
            .as_bytes()
            .rsplit(|b| *b == b',')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        return if last.eq_ignore_ascii_case(b"chunked") {
            Ok(Body::Chunked(Chunk::Size))
        } else {
            Ok(Body::UntilClose)
        };
    }
    let mut length: Option<u64> = None;
    for v in headers.get_all("content-length") {
        for part in v.as_bytes().split(|b| *b == b',') {
            let part = part.trim_ascii();
            if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
                return Err(ReadError::Invalid("content-length"));
            }
            let n = std::str::from_utf8(part)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or(ReadError::Invalid("content-length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(ReadError::Invalid("content-length values differ"));
            }
            length = Some(n);
        }
    }
    Ok(match length {
        Some(0) => Body::Done,
        Some(n) => Body::Length(n),
        None => Body::UntilClose,
    })
}

/// Whether a comma-separated header lists `token` (case-insensitive).
fn has_token(headers: &Fields, name: &str, token: &str) -> bool {
    headers.get_all(name).any(|v| {
        v.as_bytes()
            .split(|b| *b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads a whole answer from `wire` delivered in pieces of `step` bytes.
    async fn read(wire: &[u8], step: usize) -> Result<(u16, Fields, Vec<u8>, bool), ReadError> {
        let (mut tx, rx) = tokio::io::duplex(64 * 1024);
        let wire = wire.to_vec();
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for piece in wire.chunks(step.max(1)) {
                tx.write_all(piece).await.unwrap();
                tokio::task::yield_now().await;
            }
            // Dropped: the peer closes.
        });
        let mut r = Response::read_head(rx, Some(Duration::from_secs(5))).await?;
        let mut body = Vec::new();
        while let Some(piece) = r.next_chunk().await? {
            assert!(!piece.is_empty());
            body.extend_from_slice(&piece);
        }
        writer.await.unwrap();
        let (status, headers) = (r.status, r.headers.clone());
        let reusable = r.reusable().is_some();
        Ok((status, headers, body, reusable))
    }

    #[tokio::test]
    async fn length_chunked_and_close_delimited_bodies_in_any_pieces() {
        for step in [1, 3, 7, 1000] {
            let (status, headers, body, reusable) = read(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}",
                step,
            )
            .await
            .unwrap();
            assert_eq!(
                (status, body.as_slice(), reusable),
                (200, &b"{\"a\":1}"[..], true)
            );
            assert_eq!(headers.get("content-type").unwrap(), "application/json");

            let (_, _, body, reusable) = read(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
                  5;ext=1\r\ndata:\r\n3\r\n x\n\r\n0\r\nx-trailer: t\r\n\r\n",
                step,
            )
            .await
            .unwrap();
            assert_eq!((body.as_slice(), reusable), (&b"data: x\n"[..], true));

            let (_, _, body, reusable) = read(b"HTTP/1.1 200 OK\r\n\r\nuntil the end", step)
                .await
                .unwrap();
            assert_eq!((body.as_slice(), reusable), (&b"until the end"[..], false));
        }
    }

    #[tokio::test]
    async fn informational_heads_are_skipped_and_close_is_respected() {
        let (status, _, body, reusable) = read(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 429 Too Many\r\nConnection: close\r\n\
              Content-Length: 2\r\nretry-after: 3\r\n\r\nno",
            5,
        )
        .await
        .unwrap();
        assert_eq!(
            (status, body.as_slice(), reusable),
            (429, &b"no"[..], false)
        );
        let (status, _, body, reusable) =
            read(b"HTTP/1.1 204 No Content\r\n\r\n", 4).await.unwrap();
        assert_eq!((status, body.len(), reusable), (204, 0, true));
    }

    #[tokio::test]
    async fn broken_framing_is_an_error_never_a_guess() {
        for wire in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXX0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
            b"not http at all\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Le",
            // A sign before the length, a chunk size with no hex digit, a protocol switch.
            b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n;x\r\nok\r\n0\r\n\r\n",
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
        ] {
            assert!(
                read(wire, 3).await.is_err(),
                "{}",
                String::from_utf8_lossy(wire)
            );
        }
        let mut huge = b"HTTP/1.1 200 OK\r\n".to_vec();
        huge.extend(std::iter::repeat_n(b'a', MAX_HEAD + 10));
        assert!(matches!(
            read(&huge, 4096).await,
            Err(ReadError::Invalid(_))
        ));
    }

    #[tokio::test]
    async fn ambiguous_framing_is_not_reused() {
        // Both framings: chunked wins, the connection is not reused.
        let (_, _, body, reusable) = read(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n\
              2\r\nok\r\n0\r\n\r\n",
            4,
        )
        .await
        .unwrap();
        assert_eq!((body.as_slice(), reusable), (&b"ok"[..], false));
        // A value folded over two lines is kept (unfolded), not dropped.
        let (_, headers, body, reusable) = read(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip,\r\n chunked\r\n\r\n\
              2\r\nok\r\n0\r\n\r\n",
            4,
        )
        .await
        .unwrap();
        assert_eq!(headers.get("Transfer-Encoding").unwrap(), "gzip,   chunked");
        assert_eq!((body.as_slice(), reusable), (&b"ok"[..], true));
    }

    #[tokio::test]
    async fn fields_are_found_in_any_case_in_the_order_they_came() {
        let (_, headers, _, _) = read(
            b"HTTP/1.1 200 OK\r\nX-Request-ID: a1\r\nVary: origin\r\nvary: accept\r\n\
              Content-Length: 2\r\n\r\nok",
            4,
        )
        .await
        .unwrap();
        assert_eq!(headers.get("x-request-id").unwrap(), "a1");
        assert_eq!(headers.get("VARY").unwrap(), "origin", "the first value");
        let vary: Vec<_> = headers.get_all("vary").collect();
        assert_eq!(vary, ["origin", "accept"]);
        assert!(headers.contains_key("content-length"));
        assert!(!headers.contains_key("content-type"));
        // A value passed on shares the head's bytes; another head's value is not these fields'.
        let id = headers.get("x-request-id").unwrap();
        assert_eq!(headers.header_value(id).unwrap(), "a1");
        assert!(Fields::of(&[("a", "b")]).header_value(id).is_none());
        let names: Vec<_> = headers.iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [&b"X-Request-ID"[..], b"Vary", b"vary", b"Content-Length"],
            "names as sent"
        );
    }

    #[test]
    fn a_value_is_text_only_when_it_is_visible_ascii() {
        assert_eq!(FieldValue(b"a b\tc").to_str().ok(), Some("a b\tc"));
        assert!(FieldValue("caf\u{e9}".as_bytes()).to_str().is_err());
        assert!(FieldValue(b"a\x7f").to_str().is_err());
    }

    #[tokio::test]
    async fn only_a_connection_that_sent_nothing_counts_as_stale() {
        assert!(matches!(
            read(b"", 1).await,
            Err(ReadError::NothingArrived(_))
        ));
        assert!(matches!(
            read(b"HTTP/1.1 200", 4).await,
            Err(ReadError::Io(_))
        ));
    }

    #[tokio::test]
    async fn the_first_byte_timeout_bounds_the_whole_head() {
        let (mut tx, rx) = tokio::io::duplex(1024);
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for b in b"HTTP/1.1 200 OK\r\nx-slow: aaaaaaaaaaaaaaaaaaaa\r\n\r\n" {
                if tx.write_all(&[*b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let r = Response::read_head(rx, Some(Duration::from_millis(200))).await;
        assert!(matches!(r, Err(ReadError::Timeout)));
    }

    #[tokio::test]
    async fn a_silent_peer_times_out() {
        let (_tx, rx) = tokio::io::duplex(1024);
        let r = Response::read_head(rx, Some(Duration::from_millis(50))).await;
        assert!(matches!(r, Err(ReadError::Timeout)));
    }

    #[tokio::test]
    async fn bytes_already_read_are_handed_on_without_waiting() {
        let (mut tx, rx) = tokio::io::duplex(1024);
        use tokio::io::AsyncWriteExt;
        tx.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
            .await
            .unwrap();
        let mut r = Response::read_head(rx, None).await.unwrap();
        assert_eq!(r.ready_chunk().unwrap().unwrap().unwrap(), "abc");
        assert!(r.ready_chunk().is_none(), "nothing more has arrived");
        tx.write_all(b"0\r\n\r\n").await.unwrap();
        assert!(r.ready_chunk().unwrap().unwrap().is_none(), "the end");
        assert!(r.reusable().is_some());
    }
}
