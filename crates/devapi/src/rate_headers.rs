//! The `x-ratelimit-*` headers: the per-minute windows a request was reserved against
//! ([`RateView`]), rendered for the client. OpenAI-style headers
//! (`x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, where tokens are input tokens) plus
//! explicit input and output token headers on every answer, and Anthropic's
//! `anthropic-ratelimit-*` beside them on style-B answers ([`anthropic`]).

use std::sync::OnceLock;

use http::{HeaderName, HeaderValue};

use gateway_core::quota::RateView;

/// The headers as a list, for the gateway's own answers (a relayed answer gets them through
/// [`map`]).
pub fn list(rate: &RateView) -> Vec<(HeaderName, HeaderValue)> {
    let mut h = Vec::with_capacity(12);
    each(rate, |name, value| h.push((name.clone(), value)));
    h
}

/// A header map holding the headers of [`list`], for a relayed answer (which adds the
/// provider's headers to it). Every relayed answer carries twelve of these, and a map hashes
/// each name it is given byte by byte. So the names are hashed once: each set of windows has a template map, built on first
/// use, that is cloned (names and hashes copied, not computed) and given this view's
/// values in place, in the order [`each`] yields them for that set.
pub fn map(rate: &RateView) -> http::HeaderMap {
    static TEMPLATES: [OnceLock<http::HeaderMap>; 8] = [const { OnceLock::new() }; 8];
    let set = usize::from(rate.requests.is_some())
        | usize::from(rate.input_tokens.is_some()) << 1
        | usize::from(rate.output_tokens.is_some()) << 2;
    let template = TEMPLATES[set].get_or_init(|| {
        // Room for the provider's headers too: a clone keeps the index table's size, so
        // adding them does not rebuild it.
        // Empty values: a template never holds a request's numbers.
        let mut map = http::HeaderMap::with_capacity(32);
        each(rate, |name, _| {
            map.append(name.clone(), HeaderValue::from_static(""));
        });
        map
    });
    let mut map = template.clone();
    let mut slots = map.values_mut();
    each(rate, |_, value| {
        if let Some(slot) = slots.next() {
            *slot = value;
        }
    });
    map
}

/// Calls `f` with each header. The limit and remaining numbers are written into one
/// buffer that every value is a slice of: two allocations per answer instead of one per
/// number, plus one more for each value shared by two headers. `tokens` and
/// `input-tokens` describe the same window: its values are rendered once and shared.
fn each(rate: &RateView, mut f: impl FnMut(&'static HeaderName, HeaderValue)) {
    let windows = [rate.requests, rate.input_tokens, rate.output_tokens];
    let mut text = Vec::with_capacity(6 * 20);
    let mut spans = [(0usize, 0usize, 0usize); 3];
    for (window, span) in windows.iter().zip(spans.iter_mut()) {
        if let Some(v) = window {
            let start = text.len();
            text.extend_from_slice(itoa::Buffer::new().format(v.limit).as_bytes());
            let mid = text.len();
            text.extend_from_slice(itoa::Buffer::new().format(v.remaining).as_bytes());
            *span = (start, mid, text.len());
        }
    }
    let text = bytes::Bytes::from(text);
    // Digits only: a slice is always a valid header value.
    let value = |from: usize, to: usize| HeaderValue::from_maybe_shared(text.slice(from..to));
    let names = [
        &RATE_HEADERS[0..1],
        &RATE_HEADERS[1..3],
        &RATE_HEADERS[3..4],
    ];
    for ((window, (start, mid, end)), names) in windows.iter().zip(spans).zip(names) {
        let Some(v) = window else { continue };
        let (Ok(limit), Ok(remaining)) = (value(start, mid), value(mid, end)) else {
            continue;
        };
        let reset = reset_value(v.reset_secs);
        for [limit_name, remaining_name, reset_name] in names {
            f(limit_name, limit.clone());
            f(remaining_name, remaining.clone());
            f(reset_name, reset.clone());
        }
    }
}

/// A 429 for the per-minute window `what` (`requests`, `input tokens`, `output tokens`): the
/// window's reset is when it admits the request again, the `retry-after` the answer carries
/// and its message names, so the headers tell one wait. A window's reset is otherwise the end
/// of the current minute, which for a sliding window that is over its limit comes before the
/// request would be admitted.
pub fn refused(rate: &mut RateView, what: &str, retry_after_secs: u64) {
    let window = match what {
        "requests" => &mut rate.requests,
        "input tokens" => &mut rate.input_tokens,
        "output tokens" => &mut rate.output_tokens,
        _ => return,
    };
    if let Some(w) = window {
        w.remaining = 0;
        w.reset_secs = retry_after_secs;
    }
}

/// Anthropic's `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`
/// for a style-B answer at `now_unix` (seconds): the reset is the RFC 3339 time the window
/// refills, as Anthropic sends it. `tokens` is the more restrictive of the input and output
/// windows (the one with fewer tokens left), as Anthropic defines it.
pub fn anthropic(rate: &RateView, now_unix: i64) -> Vec<(HeaderName, HeaderValue)> {
    let tokens = match (rate.input_tokens, rate.output_tokens) {
        (Some(i), Some(o)) => Some(if o.remaining < i.remaining { o } else { i }),
        (i, o) => i.or(o),
    };
    let windows = [
        (rate.requests, &ANTHROPIC_HEADERS[0]),
        (tokens, &ANTHROPIC_HEADERS[1]),
        (rate.input_tokens, &ANTHROPIC_HEADERS[2]),
        (rate.output_tokens, &ANTHROPIC_HEADERS[3]),
    ];
    let mut h = Vec::with_capacity(12);
    for (window, [limit, remaining, reset]) in windows {
        let Some(w) = window else { continue };
        let at = now_unix.saturating_add(i64::try_from(w.reset_secs).unwrap_or(i64::MAX));
        let Some(at) = rfc3339(at) else { continue };
        h.push((limit.clone(), HeaderValue::from(w.limit)));
        h.push((remaining.clone(), HeaderValue::from(w.remaining)));
        h.push((reset.clone(), at));
    }
    h
}

/// `2026-11-28T20:06:46Z` for a unix time in seconds.
fn rfc3339(unix: i64) -> Option<HeaderValue> {
    let t = time::OffsetDateTime::from_unix_timestamp(unix).ok()?;
    let text = t
        .format(&time::format_description::well_known::Rfc3339)
        .ok()?;
    HeaderValue::from_str(&text).ok()
}

/// `x-ratelimit-reset-*` values of a per-minute window (`0s` to `60s`), never allocated.
const RESET_VALUES: [&str; 61] = [
    "0s", "1s", "2s", "3s", "4s", "5s", "6s", "7s", "8s", "9s", "10s", "11s", "12s", "13s", "14s",
    "15s", "16s", "17s", "18s", "19s", "20s", "21s", "22s", "23s", "24s", "25s", "26s", "27s",
    "28s", "29s", "30s", "31s", "32s", "33s", "34s", "35s", "36s", "37s", "38s", "39s", "40s",
    "41s", "42s", "43s", "44s", "45s", "46s", "47s", "48s", "49s", "50s", "51s", "52s", "53s",
    "54s", "55s", "56s", "57s", "58s", "59s", "60s",
];

fn reset_value(secs: u64) -> HeaderValue {
    match RESET_VALUES.get(secs as usize) {
        Some(v) => HeaderValue::from_static(v),
        None => {
            let mut s = itoa::Buffer::new().format(secs).to_string();
            s.push('s');
            HeaderValue::from_str(&s).unwrap_or(HeaderValue::from_static("0s"))
        }
    }
}

/// `x-ratelimit-{limit,remaining,reset}-*` for requests, tokens (input), input and output tokens.
/// Built at compile time: `HeaderName::from_static` called at run time validates every byte of
/// its name, twelve names on every response.
static RATE_HEADERS: [[HeaderName; 3]; 4] = [
    [
        HeaderName::from_static("x-ratelimit-limit-requests"),
        HeaderName::from_static("x-ratelimit-remaining-requests"),
        HeaderName::from_static("x-ratelimit-reset-requests"),
    ],
    [
        HeaderName::from_static("x-ratelimit-limit-tokens"),
        HeaderName::from_static("x-ratelimit-remaining-tokens"),
        HeaderName::from_static("x-ratelimit-reset-tokens"),
    ],
    [
        HeaderName::from_static("x-ratelimit-limit-input-tokens"),
        HeaderName::from_static("x-ratelimit-remaining-input-tokens"),
        HeaderName::from_static("x-ratelimit-reset-input-tokens"),
    ],
    [
        HeaderName::from_static("x-ratelimit-limit-output-tokens"),
        HeaderName::from_static("x-ratelimit-remaining-output-tokens"),
        HeaderName::from_static("x-ratelimit-reset-output-tokens"),
    ],
];

/// `anthropic-ratelimit-{limit,remaining,reset}-*` for requests, tokens, input and output
/// tokens.
static ANTHROPIC_HEADERS: [[HeaderName; 3]; 4] = [
    [
        HeaderName::from_static("anthropic-ratelimit-requests-limit"),
        HeaderName::from_static("anthropic-ratelimit-requests-remaining"),
        HeaderName::from_static("anthropic-ratelimit-requests-reset"),
    ],
    [
        HeaderName::from_static("anthropic-ratelimit-tokens-limit"),
        HeaderName::from_static("anthropic-ratelimit-tokens-remaining"),
        HeaderName::from_static("anthropic-ratelimit-tokens-reset"),
    ],
    [
        HeaderName::from_static("anthropic-ratelimit-input-tokens-limit"),
        HeaderName::from_static("anthropic-ratelimit-input-tokens-remaining"),
        HeaderName::from_static("anthropic-ratelimit-input-tokens-reset"),
    ],
    [
        HeaderName::from_static("anthropic-ratelimit-output-tokens-limit"),
        HeaderName::from_static("anthropic-ratelimit-output-tokens-remaining"),
        HeaderName::from_static("anthropic-ratelimit-output-tokens-reset"),
    ],
];

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_core::quota::limits::WindowView;

    fn window(limit: u64, remaining: u64, reset_secs: u64) -> Option<WindowView> {
        Some(WindowView {
            limit,
            remaining,
            reset_secs,
        })
    }

    #[test]
    fn rate_headers_carry_each_windows_numbers() {
        let view = RateView {
            requests: window(60, 59, 12),
            input_tokens: window(100_000, 98_765, 7),
            output_tokens: window(u64::MAX, 0, 75),
        };
        let listed: Vec<(String, String)> = list(&view)
            .into_iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("?").to_string()))
            .collect();
        let expected = [
            ("x-ratelimit-limit-requests", "60"),
            ("x-ratelimit-remaining-requests", "59"),
            ("x-ratelimit-reset-requests", "12s"),
            ("x-ratelimit-limit-tokens", "100000"),
            ("x-ratelimit-remaining-tokens", "98765"),
            ("x-ratelimit-reset-tokens", "7s"),
            ("x-ratelimit-limit-input-tokens", "100000"),
            ("x-ratelimit-remaining-input-tokens", "98765"),
            ("x-ratelimit-reset-input-tokens", "7s"),
            ("x-ratelimit-limit-output-tokens", "18446744073709551615"),
            ("x-ratelimit-remaining-output-tokens", "0"),
            ("x-ratelimit-reset-output-tokens", "75s"),
        ];
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        assert_eq!(listed, expected);

        // The map form holds the same headers.
        let mapped = map(&view);
        assert_eq!(mapped.len(), 12);
        for (name, value) in &expected {
            assert_eq!(mapped[name.as_str()], value.as_str(), "{name}");
        }
    }

    #[test]
    fn header_maps_from_templates_hold_each_views_own_values() {
        // Every set of windows, each seen twice with different numbers: the second map must
        // hold its own values, not the ones the template was built from.
        for set in 0..8u64 {
            for round in 0..2u64 {
                let w = |bit: u64, base: u64| {
                    (set >> bit & 1 == 1)
                        .then(|| window(base + round, base / 2 + round, bit * 10 + round))
                        .flatten()
                };
                let view = RateView {
                    requests: w(0, 100),
                    input_tokens: w(1, 2_000),
                    output_tokens: w(2, 30_000),
                };
                let from_map: Vec<(HeaderName, HeaderValue)> = map(&view)
                    .iter()
                    .map(|(n, v)| (n.clone(), v.clone()))
                    .collect();
                assert_eq!(from_map, list(&view), "set {set} round {round}");
            }
        }
    }

    #[test]
    fn anthropic_headers_name_the_tighter_token_window_and_reset_times() {
        let view = RateView {
            requests: window(60, 59, 12),
            input_tokens: window(100_000, 98_765, 7),
            output_tokens: window(20_000, 19_000, 75),
        };
        // 2026-11-28T20:00:00Z
        let now = 1_795_896_000;
        let listed: Vec<(String, String)> = anthropic(&view, now)
            .into_iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("?").to_string()))
            .collect();
        let expected = [
            ("anthropic-ratelimit-requests-limit", "60"),
            ("anthropic-ratelimit-requests-remaining", "59"),
            ("anthropic-ratelimit-requests-reset", "2026-11-28T20:00:12Z"),
            ("anthropic-ratelimit-tokens-limit", "20000"),
            ("anthropic-ratelimit-tokens-remaining", "19000"),
            ("anthropic-ratelimit-tokens-reset", "2026-11-28T20:01:15Z"),
            ("anthropic-ratelimit-input-tokens-limit", "100000"),
            ("anthropic-ratelimit-input-tokens-remaining", "98765"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                "2026-11-28T20:00:07Z",
            ),
            ("anthropic-ratelimit-output-tokens-limit", "20000"),
            ("anthropic-ratelimit-output-tokens-remaining", "19000"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2026-11-28T20:01:15Z",
            ),
        ];
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        assert_eq!(listed, expected);

        // Only an input window: it is the tokens window too.
        let view = RateView {
            requests: None,
            input_tokens: window(5, 4, 1),
            output_tokens: None,
        };
        let names: Vec<String> = anthropic(&view, now)
            .iter()
            .map(|(n, _)| n.to_string())
            .collect();
        assert_eq!(names.len(), 6);
        assert!(names.contains(&"anthropic-ratelimit-tokens-remaining".to_string()));
        assert!(anthropic(&RateView::default(), now).is_empty());
    }

    #[test]
    fn windows_without_limits_add_no_headers() {
        let view = RateView {
            requests: None,
            input_tokens: None,
            output_tokens: window(5, 4, 1),
        };
        let names: Vec<String> = list(&view).iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(
            names,
            [
                "x-ratelimit-limit-output-tokens",
                "x-ratelimit-remaining-output-tokens",
                "x-ratelimit-reset-output-tokens"
            ]
        );
        assert!(list(&RateView::default()).is_empty());
    }
}
