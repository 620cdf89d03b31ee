//! Server-sent events framing: a provider's byte stream cut into events.
//!
//! The gateway sits in the middle of a byte stream: it must not delay or alter what the client
//! sees beyond dropping the usage-only chunk the client never asked for. So the parser hands
//! back every event with its exact bytes; what the events say (usage, completion, delivered
//! text) is read by [`crate::usage`] without owning the stream.
//!
//! The parser takes hostile input from the network: nothing here panics, every loop is bounded
//! by the input, and every buffer has a cap.

use bytes::Bytes;

/// A single event larger than this is not a real model event; buffering it
/// would let one misbehaving upstream grow a worker's memory without bound.
pub const MAX_EVENT_BYTES: usize = 1024 * 1024;

const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// One blank-line-terminated block of the stream.
///
/// Every input byte ends up in exactly one event's `raw` (comment-only blocks
/// and stray blank lines included), so concatenating the `raw` of everything
/// `feed` and `finish` return reproduces the input, except for events dropped
/// for exceeding [`MAX_EVENT_BYTES`]. That is what lets the caller forward or
/// drop whole events without re-serializing anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, if the block had one.
    pub event: Option<String>,
    /// The `data:` lines joined by `\n`; empty for comment-only blocks.
    pub data: String,
    /// The exact bytes of the block, including its terminating blank line; empty from a parser
    /// made by [`SseParser::without_raw`].
    pub raw: Bytes,
}

/// Incremental SSE parser that accepts arbitrary chunk boundaries.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Raw bytes of the pending event, including its complete lines.
    raw: Vec<u8>,
    /// Offset in `raw` where the current (unterminated) line starts.
    line_start: usize,
    event: Option<String>,
    data: String,
    has_data: bool,
    /// The previous byte was a `\r` line ending; a following `\n` belongs to
    /// the same line ending.
    after_cr: bool,
    /// A blank line ended with `\r` at a chunk boundary. Dispatch waits for the
    /// next byte so a split `\r\n` still lands inside this event's `raw`.
    dispatch_after_cr: bool,
    /// Dropping an oversized event until its blank line.
    discarding: bool,
    /// Only meaningful while discarding: the current line has content.
    discard_line_nonempty: bool,
    /// No line has been completed yet, so a leading BOM is still possible.
    at_stream_start: bool,
    started: bool,
    /// The caller relays the provider's bytes itself and reads only `event` and `data`.
    skip_raw: bool,
}

/// Buffers grown past this are not kept for the next event: one large event must not pin its
/// size for the rest of a stream.
const KEPT_CAPACITY: usize = 64 * 1024;

/// Appends `bytes` as text, invalid UTF-8 replaced by U+FFFD. Valid text (every provider's)
/// is checked by `str::from_utf8`, which runs a word at a time over ASCII; `from_utf8_lossy`
/// walks its input byte by byte even when there is nothing to replace.
fn push_lossy(dst: &mut String, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => dst.push_str(text),
        Err(_) => dst.push_str(&String::from_utf8_lossy(bytes)),
    }
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// A parser whose events carry no `raw` bytes, for callers that relay the chunks as they
    /// came or write events of their own: a copy of every event saved.
    pub fn without_raw() -> Self {
        Self {
            skip_raw: true,
            ..Self::default()
        }
    }

    /// Returns the events completed by this chunk. A blank line terminated by
    /// a lone `\r` at the very end of a chunk is held until the next byte (or
    /// `finish`), since it may be the first half of `\r\n`.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        if !self.started {
            self.started = true;
            self.at_stream_start = true;
        }
        let mut out = Vec::new();
        let mut rest = chunk;
        while !rest.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if rest[0] == b'\n' {
                    self.push_raw(b"\n");
                    self.line_start = self.raw.len();
                    rest = &rest[1..];
                    if self.dispatch_after_cr {
                        self.dispatch_after_cr = false;
                        self.dispatch(&mut out);
                    }
                    continue;
                }
                if self.dispatch_after_cr {
                    self.dispatch_after_cr = false;
                    self.dispatch(&mut out);
                }
            }
            // A line is a few hundred bytes of JSON: memchr finds its end a word at a time
            // rather than a byte at a time, on every line of every stream.
            match memchr::memchr2(b'\n', b'\r', rest) {
                None => {
                    self.push_line_bytes(rest);
                    rest = &[];
                }
                Some(i) => {
                    self.push_line_bytes(&rest[..i]);
                    let terminator = rest[i];
                    rest = &rest[i + 1..];
                    self.end_line(terminator, &mut out);
                }
            }
        }
        out
    }

    /// Flushes what the stream left unterminated, which a cut upstream
    /// connection typically does. The parser is reset and can be reused.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let mut out = Vec::new();
        if self.after_cr && self.dispatch_after_cr {
            self.dispatch(&mut out);
        } else if !self.discarding && self.line_start < self.raw.len() {
            self.process_line();
        }
        if !self.discarding && !self.raw.is_empty() {
            self.dispatch(&mut out);
        }
        *self = Self {
            skip_raw: self.skip_raw,
            ..Self::default()
        };
        out.pop()
    }

    fn push_raw(&mut self, bytes: &[u8]) {
        if self.discarding {
            return;
        }
        if self.raw.len().saturating_add(bytes.len()) > MAX_EVENT_BYTES {
            log::warn!(
                "dropping SSE event larger than {MAX_EVENT_BYTES} bytes (event: {:?})",
                self.event
            );
            self.start_discarding();
            return;
        }
        self.raw.extend_from_slice(bytes);
    }

    /// Callers set `discard_line_nonempty` for the position they are at.
    fn start_discarding(&mut self) {
        self.discard_line_nonempty = false;
        self.discarding = true;
        self.raw = Vec::new();
        self.line_start = 0;
        self.event = None;
        self.data = String::new();
        self.has_data = false;
    }

    fn push_line_bytes(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if self.discarding {
            self.discard_line_nonempty = true;
            return;
        }
        self.push_raw(bytes);
        if self.discarding {
            self.discard_line_nonempty = true;
        }
    }

    fn end_line(&mut self, terminator: u8, out: &mut Vec<SseEvent>) {
        let blank = if self.discarding {
            !std::mem::take(&mut self.discard_line_nonempty)
        } else {
            self.line_start == self.raw.len()
        };
        if !blank && !self.discarding {
            self.process_line();
        }
        self.push_raw(&[terminator]);
        // Whether or not that overflowed, a new line starts here.
        self.discard_line_nonempty = false;
        self.line_start = self.raw.len();
        if terminator == b'\r' {
            self.after_cr = true;
            if blank {
                self.dispatch_after_cr = true;
            }
        } else if blank {
            self.dispatch(out);
        }
    }

    /// Interprets the complete line at `raw[line_start..]` (no terminator).
    fn process_line(&mut self) {
        let mut line = self.raw.get(self.line_start..).unwrap_or_default();
        if std::mem::take(&mut self.at_stream_start) {
            line = line.strip_prefix(UTF8_BOM).unwrap_or(line);
        }
        if line.is_empty() || line[0] == b':' {
            return;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                push_lossy(&mut self.data, value);
                self.has_data = true;
            }
            b"event" => self.event = Some(String::from_utf8_lossy(value).into_owned()),
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        self.at_stream_start = false;
        if self.discarding {
            self.discarding = false;
            self.discard_line_nonempty = false;
            self.raw = Vec::new();
            self.line_start = 0;
            return;
        }
        // Copied out, and the buffers kept: the next event is about as long as this one, and a
        // buffer taken (left empty) grew again from nothing by doubling, five or six
        // reallocations an event for each of the two.
        let raw = if self.skip_raw {
            Bytes::new()
        } else {
            Bytes::copy_from_slice(&self.raw)
        };
        let data = self.data.clone();
        self.raw.clear();
        self.data.clear();
        if self.raw.capacity() > KEPT_CAPACITY {
            self.raw = Vec::new();
        }
        if self.data.capacity() > KEPT_CAPACITY {
            self.data = String::new();
        }
        self.line_start = 0;
        self.has_data = false;
        out.push(SseEvent {
            event: self.event.take(),
            data,
            raw,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_all(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for c in chunks {
            out.extend(p.feed(c));
        }
        out.extend(p.finish());
        out
    }

    fn whole(input: &[u8]) -> Vec<SseEvent> {
        feed_all(&[input])
    }

    fn bytewise(input: &[u8]) -> Vec<SseEvent> {
        let chunks: Vec<&[u8]> = input.chunks(1).collect();
        feed_all(&chunks)
    }

    fn concat_raw(events: &[SseEvent]) -> Vec<u8> {
        events.iter().flat_map(|e| e.raw.iter().copied()).collect()
    }

    fn data_events(events: &[SseEvent]) -> Vec<(Option<&str>, &str)> {
        events
            .iter()
            .filter(|e| !e.data.is_empty() || e.event.is_some())
            .map(|e| (e.event.as_deref(), e.data.as_str()))
            .collect()
    }

    const MIXED: &[u8] = "\u{feff}: hello\n\nevent: ping\ndata: {\"a\":1}\n\n\
data:line1\r\ndata: line2\r\n\r\n\
event: x\rdata: caf\u{e9} \u{1F600}\r\r\
data\n\n\
retry: 5\nid: 7\ndata: with id\n\n\
data: tail without blank"
        .as_bytes();

    #[test]
    fn every_split_matches_whole_feed() {
        let reference = whole(MIXED);
        assert_eq!(bytewise(MIXED), reference);
        for cut in 0..=MIXED.len() {
            let (a, b) = MIXED.split_at(cut);
            assert_eq!(feed_all(&[a, b]), reference, "cut at {cut}");
        }
        for size in 2..7 {
            let chunks: Vec<&[u8]> = MIXED.chunks(size).collect();
            assert_eq!(feed_all(&chunks), reference, "chunks of {size}");
        }
    }

    #[test]
    fn a_parser_without_raw_reads_the_same_events() {
        let reference = whole(MIXED);
        for size in 1..7 {
            let mut p = SseParser::without_raw();
            let mut got = Vec::new();
            for c in MIXED.chunks(size) {
                got.extend(p.feed(c));
            }
            got.extend(p.finish());
            assert_eq!(got.len(), reference.len(), "chunks of {size}");
            for (g, r) in got.iter().zip(&reference) {
                assert_eq!((&g.event, &g.data), (&r.event, &r.data), "chunks of {size}");
                assert!(g.raw.is_empty());
            }
            // `finish` resets the parser but keeps what it was made for.
            assert!(p.feed(b"data: again\n\n")[0].raw.is_empty());
        }
    }

    #[test]
    fn buffers_are_kept_between_events_unless_large() {
        let mut p = SseParser::new();
        let line = format!("data: {}\n\n", "x".repeat(300));
        assert_eq!(p.feed(line.as_bytes())[0].raw.len(), line.len());
        // Kept for the next event: it does not grow again from nothing.
        assert!(p.raw.capacity() >= line.len() && p.data.capacity() >= 300);
        let big = format!("data: {}\n\n", "y".repeat(KEPT_CAPACITY + 10));
        let evs = p.feed(big.as_bytes());
        assert_eq!(evs[0].data.len(), KEPT_CAPACITY + 10);
        // One large event does not pin its size for the rest of the stream.
        assert!(p.raw.capacity() <= KEPT_CAPACITY && p.data.capacity() <= KEPT_CAPACITY);
        let evs = p.feed(line.as_bytes());
        assert_eq!(&evs[0].raw[..], line.as_bytes());
        assert_eq!(evs[0].data.len(), 300);
    }

    #[test]
    fn raw_concatenation_reproduces_input() {
        assert_eq!(concat_raw(&whole(MIXED)), MIXED);
        assert_eq!(concat_raw(&bytewise(MIXED)), MIXED);
    }

    #[test]
    fn parses_fields_and_line_endings() {
        let events = whole(MIXED);
        assert_eq!(
            data_events(&events),
            vec![
                (Some("ping"), "{\"a\":1}"),
                (None, "line1\nline2"),
                (Some("x"), "caf\u{e9} \u{1F600}"),
                (None, "with id"),
                (None, "tail without blank"),
            ]
        );
        // The comment-only block is still an event, so its bytes survive.
        assert_eq!(&events[0].raw[..], "\u{feff}: hello\n\n".as_bytes());
        assert!(events[0].data.is_empty() && events[0].event.is_none());
        assert_eq!(&events[2].raw[..], b"data:line1\r\ndata: line2\r\n\r\n");
        // A bare `data` line is an (empty) data line.
        assert_eq!(&events[4].raw[..], b"data\n\n");
        assert_eq!(events[4].data, "");
    }

    #[test]
    fn crlf_split_between_cr_and_lf_stays_in_one_event() {
        let mut p = SseParser::new();
        assert!(p.feed(b"data: a\r\n\r").is_empty());
        let evs = p.feed(b"\ndata: b\r\n\r\n");
        assert_eq!(evs.len(), 2);
        assert_eq!(&evs[0].raw[..], b"data: a\r\n\r\n");
        assert_eq!(evs[0].data, "a");
        assert_eq!(&evs[1].raw[..], b"data: b\r\n\r\n");
        assert!(p.finish().is_none());
    }

    #[test]
    fn lone_cr_dispatch_is_released_by_next_byte_or_finish() {
        let mut p = SseParser::new();
        assert!(p.feed(b"data: a\r\r").is_empty());
        let evs = p.feed(b"data: b\r\r");
        assert_eq!(evs.len(), 1);
        assert_eq!(&evs[0].raw[..], b"data: a\r\r");
        let last = p.finish().expect("held event");
        assert_eq!(last.data, "b");
        assert_eq!(&last.raw[..], b"data: b\r\r");
    }

    #[test]
    fn multiline_data_and_field_edge_cases() {
        let evs = whole(b"data: one\ndata:two\ndata:  three\ndata\nevent:e\nevent: f\n\n");
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].data, "one\ntwo\n three\n");
        assert_eq!(evs[0].event.as_deref(), Some("f"));
    }

    #[test]
    fn utf8_split_inside_char() {
        let s = "data: héllo 😀\n\n".as_bytes();
        for cut in 0..s.len() {
            let (a, b) = s.split_at(cut);
            let evs = feed_all(&[a, b]);
            assert_eq!(evs.len(), 1);
            assert_eq!(evs[0].data, "héllo 😀");
        }
    }

    #[test]
    fn invalid_utf8_is_replaced_not_fatal() {
        let evs = whole(b"data: \xff\xfe ok\n\n");
        assert_eq!(evs.len(), 1);
        assert!(evs[0].data.ends_with(" ok"));
        assert_eq!(&evs[0].raw[..], b"data: \xff\xfe ok\n\n");
    }

    #[test]
    fn oversized_event_is_dropped_and_parsing_continues() {
        let mut p = SseParser::new();
        let mut events = p.feed(b"data: before\n\n");
        events.extend(p.feed(b"event: big\ndata: "));
        let blob = vec![b'x'; 64 * 1024];
        for _ in 0..40 {
            events.extend(p.feed(&blob));
        }
        // Multi-line oversized event: newlines inside must not end discarding.
        events.extend(p.feed(b"\ndata: more\n"));
        events.extend(p.feed(&blob));
        events.extend(p.feed(b"\n\ndata: after\n\n"));
        events.extend(p.finish());
        let data: Vec<&str> = events.iter().map(|e| e.data.as_str()).collect();
        assert_eq!(data, vec!["before", "after"]);
        assert!(p.raw.capacity() <= MAX_EVENT_BYTES);
    }

    #[test]
    fn event_just_under_cap_is_kept() {
        let payload = "y".repeat(MAX_EVENT_BYTES - 10);
        let input = format!("data: {payload}\n\n");
        assert!(input.len() <= MAX_EVENT_BYTES);
        let evs = whole(input.as_bytes());
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].data.len(), payload.len());
    }

    #[test]
    fn oversized_event_cut_by_eof_yields_nothing() {
        let mut p = SseParser::new();
        let blob = vec![b'z'; MAX_EVENT_BYTES + 1];
        assert!(p.feed(b"data: ").is_empty());
        assert!(p.feed(&blob).is_empty());
        assert!(p.finish().is_none());
        // Reusable after finish.
        let evs = p.feed(b"data: ok\n\n");
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].data, "ok");
    }

    #[test]
    fn huge_unterminated_input_stays_bounded() {
        let mut p = SseParser::new();
        let blob = vec![b'a'; 1024 * 1024];
        for _ in 0..8 {
            assert!(p.feed(&blob).is_empty());
        }
        assert!(p.raw.len() <= MAX_EVENT_BYTES);
        let mut p = SseParser::new();
        let newlines = vec![b'\n'; 100_000];
        let evs = p.feed(&newlines);
        assert_eq!(evs.len(), 100_000);
    }
}
