//! AWS Signature Version 4, checked the way AWS checks it: the canonical request rebuilt from
//! what arrived (method, the path as sent, the query, the headers the signature names, the
//! body's digest), the signing key derived from the secret the mock knows, the signature
//! recomputed and compared. Written from AWS's published algorithm rather than with the
//! gateway's signing library, so a mistake in how the gateway uses it cannot cancel out here.

use std::time::SystemTime;

use hmac::{Hmac, Mac};
use http::HeaderMap;
use sha2::{Digest, Sha256};

/// The credentials the mock accepts, and the region and service requests must be signed for.
#[derive(Debug, Clone)]
pub(crate) struct AwsCredentials {
    pub(crate) access_key_id: String,
    pub(crate) secret_access_key: String,
    pub(crate) session_token: Option<String>,
    pub(crate) region: Option<String>,
}

/// Why a request's signature is refused: AWS's error name and message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) error_type: &'static str,
    pub(crate) message: String,
}

fn refuse(error_type: &'static str, message: impl Into<String>) -> Refusal {
    Refusal {
        error_type,
        message: message.into(),
    }
}

const MISMATCH: &str = "The request signature we calculated does not match the signature you \
    provided. Check your AWS Secret Access Key and signing method. Consult the service \
    documentation for details.";

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// RFC 3986 encoding as SigV4 wants it: everything but unreserved characters.
fn uri_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The canonical URI of a service other than S3: each segment of the path as it was sent,
/// encoded again.
fn canonical_uri(path: &str) -> String {
    if path.is_empty() {
        return "/".into();
    }
    path.split('/')
        .map(uri_encode)
        .collect::<Vec<_>>()
        .join("/")
}

/// The canonical query: each name and value decoded, encoded, sorted.
fn canonical_query(query: Option<&str>) -> String {
    let mut pairs: Vec<(String, String)> = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .map(|(k, v)| (uri_encode(&k), uri_encode(&v)))
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// Seconds since the epoch of an `x-amz-date` (`20250101T120000Z`).
fn amz_seconds(v: &str) -> Option<i64> {
    let format = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    let t = time::PrimitiveDateTime::parse(v, format).ok()?;
    Some(t.assume_utc().unix_timestamp())
}

/// A request as it arrived, for its signature to be checked.
pub(crate) struct Arrived<'a> {
    pub(crate) method: &'a str,
    /// The path as sent (still percent-encoded).
    pub(crate) path: &'a str,
    pub(crate) query: Option<&'a str>,
    pub(crate) headers: &'a HeaderMap,
    pub(crate) body: &'a [u8],
}

/// Checks a request's SigV4 signature for `service_name`; `Ok` when it is AWS's to accept.
pub(crate) fn verify(
    creds: &AwsCredentials,
    service_name: &str,
    request: &Arrived<'_>,
    now: SystemTime,
) -> Result<(), Refusal> {
    let Arrived {
        method,
        path,
        query,
        headers,
        body,
    } = *request;
    let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    let Some(auth) = header("authorization") else {
        return Err(refuse(
            "MissingAuthenticationTokenException",
            "Missing Authentication Token",
        ));
    };
    let Some(fields) = auth.strip_prefix("AWS4-HMAC-SHA256 ") else {
        return Err(refuse(
            "IncompleteSignatureException",
            format!("Authorization header requires 'Credential' parameter. Authorization={auth}"),
        ));
    };
    let field = |name: &str| {
        fields
            .split(',')
            .map(str::trim)
            .find_map(|f| f.strip_prefix(name).and_then(|r| r.strip_prefix('=')))
    };
    let (Some(credential), Some(signed_headers), Some(signature)) = (
        field("Credential"),
        field("SignedHeaders"),
        field("Signature"),
    ) else {
        return Err(refuse(
            "IncompleteSignatureException",
            "Authorization header requires 'Credential', 'SignedHeaders' and 'Signature'.",
        ));
    };
    let scope: Vec<&str> = credential.split('/').collect();
    let [key_id, date, region, service, "aws4_request"] = scope[..] else {
        return Err(refuse(
            "IncompleteSignatureException",
            format!("Credential should be scoped to a valid region, not '{credential}'."),
        ));
    };
    if key_id != creds.access_key_id {
        return Err(refuse(
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        ));
    }
    match (&creds.session_token, header("x-amz-security-token")) {
        (Some(want), Some(got)) if want == got => {}
        (None, None) => {}
        _ => {
            return Err(refuse(
                "UnrecognizedClientException",
                "The security token included in the request is invalid.",
            ))
        }
    }
    let Some(amz_date) = header("x-amz-date") else {
        return Err(refuse(
            "IncompleteSignatureException",
            "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header.",
        ));
    };
    let Some(at) = amz_seconds(amz_date) else {
        return Err(refuse(
            "IncompleteSignatureException",
            format!("Date must be in ISO-8601 'basic format'. Got '{amz_date}'."),
        ));
    };
    let now_s = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    if (now_s - at).abs() > 300 {
        return Err(refuse(
            "InvalidSignatureException",
            format!(
                "Signature expired: {amz_date} is now earlier or later than 5 minutes from now."
            ),
        ));
    }
    if !amz_date.starts_with(date) || service != service_name {
        return Err(refuse("InvalidSignatureException", MISMATCH));
    }
    if creds.region.as_deref().is_some_and(|r| r != region) {
        return Err(refuse(
            "InvalidSignatureException",
            format!("Credential should be scoped to a valid region. Got '{region}'."),
        ));
    }
    let names: Vec<&str> = signed_headers.split(';').collect();
    if !names.contains(&"host") || !names.contains(&"x-amz-date") {
        return Err(refuse("InvalidSignatureException", MISMATCH));
    }
    let mut canonical_headers = String::new();
    for name in &names {
        let value = headers
            .get_all(*name)
            .iter()
            .map(|v| {
                String::from_utf8_lossy(v.as_bytes())
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect::<Vec<_>>()
            .join(",");
        canonical_headers.push_str(&format!("{name}:{value}\n"));
    }
    let canonical_request = format!(
        "{method}\n{}\n{}\n{canonical_headers}\n{signed_headers}\n{}",
        canonical_uri(path),
        canonical_query(query),
        hex::encode(Sha256::digest(body)),
    );
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{date}/{region}/{service}/aws4_request\n{}",
        hex::encode(Sha256::digest(canonical_request.as_bytes()))
    );
    let k_date = hmac(
        format!("AWS4{}", creds.secret_access_key).as_bytes(),
        date.as_bytes(),
    );
    let k_region = hmac(&k_date, region.as_bytes());
    let k_service = hmac(&k_region, service.as_bytes());
    let k_signing = hmac(&k_service, b"aws4_request");
    let expected = hex::encode(hmac(&k_signing, string_to_sign.as_bytes()));
    if expected != signature {
        return Err(refuse("InvalidSignatureException", MISMATCH));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's own worked example (the `get-vanilla` case of the SigV4 test suite):
    /// GET / with host and x-amz-date signed, for the service `service` in `us-east-1`.
    #[test]
    fn the_published_example_verifies() {
        let creds = AwsCredentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
            region: None,
        };
        let mut headers = HeaderMap::new();
        headers.insert("host", "example.amazonaws.com".parse().unwrap());
        headers.insert("x-amz-date", "20150830T123600Z".parse().unwrap());
        headers.insert(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
             SignedHeaders=host;x-amz-date, \
             Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
                .parse()
                .unwrap(),
        );
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_440_938_160);
        fn arrived(headers: &HeaderMap) -> Arrived<'_> {
            Arrived {
                method: "GET",
                path: "/",
                query: None,
                headers,
                body: b"",
            }
        }
        assert_eq!(verify(&creds, "service", &arrived(&headers), at), Ok(()));
        let refused = |h: &HeaderMap, service: &str| {
            verify(&creds, service, &arrived(h), at)
                .unwrap_err()
                .error_type
        };
        assert_eq!(refused(&headers, "bedrock"), "InvalidSignatureException");
        let mut tampered = headers.clone();
        tampered.insert("host", "other.amazonaws.com".parse().unwrap());
        assert_eq!(refused(&tampered, "service"), "InvalidSignatureException");
        let mut unsigned = headers.clone();
        unsigned.remove("authorization");
        assert_eq!(
            refused(&unsigned, "service"),
            "MissingAuthenticationTokenException"
        );
        assert_eq!(
            canonical_uri("/model/a%3A0/invoke"),
            "/model/a%253A0/invoke"
        );
        assert_eq!(canonical_query(Some("b=2&a=1 2")), "a=1%202&b=2");
    }
}
