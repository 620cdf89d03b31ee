//! Taking a base URL (`server.site_origin`, `providers[].base_url`) apart.

/// Splits `http(s)://host[:port][/path]` into its parts.
pub(super) fn parse_base_url(url: &str) -> Result<(bool, String, u16, String), String> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(format!("must start with http:// or https://, got {url:?}"));
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.is_empty() || authority.contains('@') {
        return Err(format!("needs a host (and no credentials), got {url:?}"));
    }
    let (host, port) = if let Some(stripped) = authority.strip_prefix('[') {
        let end = stripped
            .find(']')
            .ok_or_else(|| format!("bad IPv6 host in {url:?}"))?;
        let host = &stripped[..end];
        // Only an IPv6 address goes in brackets: anything else there (`[h:80]`) would be a
        // name whose text is not what a `Host` header or a lookup would say.
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("bad IPv6 host in {url:?}"));
        }
        let after = &stripped[end + 1..];
        let port = match after.strip_prefix(':') {
            Some(p) => parse_port(p).ok_or_else(|| format!("bad port in {url:?}"))?,
            None if after.is_empty() => {
                if tls {
                    443
                } else {
                    80
                }
            }
            None => return Err(format!("bad host in {url:?}")),
        };
        (host.to_string(), port)
    } else {
        let (host, port) = match authority.rsplit_once(':') {
            // `::1:80` or `a:b:80`: an address with colons is written in brackets.
            Some((h, _)) if h.contains(':') => {
                return Err(format!("an IPv6 host goes in brackets, got {url:?}"))
            }
            Some((h, p)) => (
                h,
                parse_port(p).ok_or_else(|| format!("bad port in {url:?}"))?,
            ),
            None => (authority, if tls { 443 } else { 80 }),
        };
        // A name or an IPv4 address: brackets, spaces and the like would reach a `Host`
        // header and a lookup as they are written.
        if !host.chars().all(host_char) {
            return Err(format!(
                "bad host in {url:?}: a name is written in ASCII (an international one in its \
                 xn-- form), an IPv6 address in brackets"
            ));
        }
        (host.to_string(), port)
    };
    if host.is_empty() || url.contains('?') || url.contains('#') {
        return Err(format!("must be a plain base URL, got {url:?}"));
    }
    Ok((tls, host, port, path.trim_end_matches('/').to_string()))
}

/// A port: digits only (`u16`'s parse also takes a leading `+`).
fn parse_port(text: &str) -> Option<u16> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// What a host name or IPv4 address is written with (RFC 3986's unreserved characters and
/// sub-delimiters; no percent-encoding).
fn host_char(ch: char) -> bool {
    ch.is_ascii_alphanumeric() || "-._~!$&'()*+,;=".contains(ch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_url_parts() {
        for (url, parts) in [
            ("https://api.openai.com", (true, "api.openai.com", 443, "")),
            (
                "http://127.0.0.1:9000/proxy/",
                (false, "127.0.0.1", 9000, "/proxy"),
            ),
            ("http://[::1]", (false, "::1", 80, "")),
            (
                "https://[2001:db8::1]:8443/v1",
                (true, "2001:db8::1", 8443, "/v1"),
            ),
        ] {
            let (tls, host, port, path) = parts;
            assert_eq!(
                parse_base_url(url).unwrap(),
                (tls, host.into(), port, path.into()),
                "{url}"
            );
        }
        for bad in [
            "http://[h:80]",
            "http://[example.com]:80",
            "http://[]",
            "http://[::1",
            "http://::1:80",
            "http://a:b:80",
            "http://a[b]",
            "http://a[b]:80",
            "http://x]:80",
            "http://ex ample.com",
            "http://host:+80",
            "http://host:",
            "http://[::1]:+80",
        ] {
            assert!(parse_base_url(bad).is_err(), "{bad}");
        }
        assert!(parse_base_url("ftp://x").is_err());
        assert!(parse_base_url("http://u:p@x").is_err());
    }
}
