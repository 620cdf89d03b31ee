//! Providers over TLS: the mock provider serves HTTPS with a certificate from a CA made at test
//! time; the gateway trusts it through the provider's `ca_file` (or `SSL_CERT_FILE`), sends the
//! provider's host name as SNI, pools its TLS connections, and gives the client the same answers
//! as over plain HTTP. A certificate from another CA fails with a log line that says so.

mod common;

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::*;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use serde_json::{json, Value};

/// A CA's certificate and key.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let cert = params.self_signed(&key).unwrap();
    Ca { cert, key }
}

/// Writes the test CA, another CA nobody configured to trust, and a `localhost` certificate
/// signed by the test CA. Returns the paths (ca, other ca, cert, key).
fn pki(dir: &Path) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
    let test_ca = ca("gateway test CA");
    let other_ca = ca("some other CA");
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let cert = params.signed_by(&key, &test_ca.cert, &test_ca.key).unwrap();
    let paths = (
        dir.join("ca.pem"),
        dir.join("other-ca.pem"),
        dir.join("cert.pem"),
        dir.join("key.pem"),
    );
    std::fs::write(&paths.0, test_ca.cert.pem()).unwrap();
    std::fs::write(&paths.1, other_ca.cert.pem()).unwrap();
    std::fs::write(&paths.2, cert.pem()).unwrap();
    std::fs::write(&paths.3, key.serialize_pem()).unwrap();
    (paths.0, paths.1, paths.2, paths.3)
}

/// The mock provider serving HTTPS on the address `localhost` resolves to first (as the gateway
/// will dial it).
struct TlsMock {
    child: Child,
    port: u16,
    root: reqwest::Certificate,
}

impl TlsMock {
    fn start(cert: &Path, key: &Path, ca: &Path) -> TlsMock {
        let ip: IpAddr = ("localhost", 0)
            .to_socket_addrs()
            .unwrap()
            .next()
            .unwrap()
            .ip();
        let listen = std::net::SocketAddr::new(ip, 0).to_string();
        let mut child = Command::new(env!("CARGO_BIN_EXE_mock-provider"))
            .args(["--listen", &listen, "--tls-cert"])
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr: std::net::SocketAddr = line
            .trim()
            .strip_prefix("LISTENING ")
            .unwrap_or_else(|| panic!("mock said {line:?}"))
            .parse()
            .unwrap();
        let root = reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap();
        TlsMock {
            child,
            port: addr.port(),
            root,
        }
    }

    fn url(&self) -> String {
        format!("https://localhost:{}", self.port)
    }

    /// The mock's counters, read over HTTPS (each query is a connection and a handshake of its
    /// own).
    async fn stats(&self) -> Value {
        reqwest::Client::builder()
            .add_root_certificate(self.root.clone())
            .build()
            .unwrap()
            .get(format!("{}/__mock/stats", self.url()))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

impl Drop for TlsMock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn providers_toml(url: &str, trusted: Option<&Path>, untrusted: &Path) -> String {
    let ca = |p: Option<&Path>| match p {
        Some(p) => format!("ca_file = \"{}\"\n", p.display()),
        None => String::new(),
    };
    format!(
        r#"
[[providers]]
name = "tls"
style = "openai"
base_url = "{url}"
api_key_env = "MOCK_OPENAI_KEY"
{trusted}
[[providers]]
name = "tls-anthropic"
style = "anthropic"
base_url = "{url}"
api_key_env = "MOCK_ANTHROPIC_KEY"
{trusted}
[[providers]]
name = "tls-untrusted"
style = "openai"
base_url = "{url}"
{untrusted}
[[models]]
id = "tls-gpt"
provider = "tls"
context_window = 128000
max_output_tokens = 16384
default_output_tokens = 256

[[models]]
id = "tls-claude"
provider = "tls-anthropic"
context_window = 200000
max_output_tokens = 8192
default_output_tokens = 256

[[models]]
id = "tls-untrusted-gpt"
provider = "tls-untrusted"
"#,
        trusted = ca(trusted),
        untrusted = ca(Some(untrusted)),
    )
}

/// An answer with what differs between two runs (ids, timestamps) taken out; streams as the
/// list of their events.
fn normalized(body: &[u8], model: &str) -> Value {
    fn scrub(v: &mut Value) {
        match v {
            Value::Object(o) => {
                for k in ["id", "created", "created_at", "model"] {
                    o.remove(k);
                }
                o.values_mut().for_each(scrub);
            }
            Value::Array(a) => a.iter_mut().for_each(scrub),
            _ => {}
        }
    }
    let text = std::str::from_utf8(body).unwrap().replace(model, "MODEL");
    let mut v = match serde_json::from_str::<Value>(&text) {
        Ok(v) => v,
        Err(_) => Value::Array(
            text.split("\n\n")
                .filter(|b| !b.trim().is_empty())
                .map(|b| {
                    let data = b.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
                    serde_json::from_str(data).unwrap_or(json!(data))
                })
                .collect(),
        ),
    };
    scrub(&mut v);
    v
}

async fn call(gw: &Gateway, key: &str, path: &str, body: Value) -> (u16, Vec<u8>) {
    let mut req = client().post(gw.url(path)).json(&body);
    req = if path == "/v1/messages" {
        req.header("x-api-key", key)
            .header("anthropic-version", "2023-06-01")
    } else {
        req.bearer_auth(key)
    };
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.bytes().await.unwrap().to_vec())
}

#[tokio::test]
async fn a_provider_behind_tls_answers_as_over_plain_http() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, other_ca, cert, key) = pki(dir.path());
    let tls = TlsMock::start(&cert, &key, &ca);
    let plain = Mock::start(&[]);
    let gw = Gateway::start(
        &plain,
        Options::with_toml(providers_toml(&tls.url(), Some(&ca), &other_ca)),
    );
    let key = gw.user_with_key("tls@example.com", &[]);

    let chat = |stream: bool| {
        json!({"messages": [{"role": "user", "content": "hi"}], "stream": stream,
               "stream_options": {"include_usage": true}})
    };
    let messages = json!({"max_tokens": 64, "stream": true,
                          "messages": [{"role": "user", "content": "hi"}]});
    let cases = [
        ("mock-gpt", "tls-gpt", "/v1/chat/completions", chat(false)),
        ("mock-gpt", "tls-gpt", "/v1/chat/completions", chat(true)),
        (
            "claude-mock",
            "tls-claude",
            "/v1/messages",
            messages.clone(),
        ),
        // Translated both ways over TLS too.
        (
            "claude-mock",
            "tls-claude",
            "/v1/chat/completions",
            chat(true),
        ),
        ("mock-gpt", "tls-gpt", "/v1/messages", messages),
    ];
    for (plain_model, tls_model, path, body) in cases {
        let mut a = body.clone();
        a["model"] = json!(plain_model);
        let mut b = body;
        b["model"] = json!(tls_model);
        let (sa, ba) = call(&gw, &key, path, a).await;
        let (sb, bb) = call(&gw, &key, path, b).await;
        assert_eq!((sa, sb), (200, 200), "{path} {tls_model}");
        assert_eq!(
            normalized(&ba, plain_model),
            normalized(&bb, tls_model),
            "{path}: plain and TLS answers differ"
        );
    }
    // The provider's host name went out as SNI (the mock refuses handshakes without one, so
    // the answers above already needed it): the gateway's handshake, then this query's own.
    let names = tls.stats().await["tls_server_names"].clone();
    let names = names.as_array().unwrap();
    assert!(
        names.len() >= 2 && names.iter().all(|n| n == "localhost"),
        "{names:?}"
    );

    // TLS connections are pooled: eight more requests open at most one new connection per
    // gateway worker thread (each keeps its own pool, and a client connection lands on either)
    // plus the stats query's own, instead of one each.
    let before = tls.stats().await["connections"].as_u64().unwrap();
    for _ in 0..8 {
        let (s, _) = call(
            &gw,
            &key,
            "/v1/chat/completions",
            json!({"model": "tls-gpt", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
        assert_eq!(s, 200);
    }
    let after = tls.stats().await["connections"].as_u64().unwrap();
    assert!(
        after - before <= 3,
        "the gateway opened {} new TLS connections for 8 requests",
        after - before - 1
    );

    // A certificate that does not chain to the provider's CA: refused, and the log says why.
    let served = tls.stats().await["served"].as_u64().unwrap();
    let (s, body) = call(
        &gw,
        &key,
        "/v1/chat/completions",
        json!({"model": "tls-untrusted-gpt", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(s, 502, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "routing_unavailable");
    assert_eq!(tls.stats().await["served"].as_u64().unwrap(), served);
    let log = gw.log();
    assert!(
        log.contains(
            "deployment tls-untrusted/tls-untrusted-gpt failed: TLS handshake with localhost \
             failed: the provider's certificate is not trusted"
        ),
        "{log}"
    );
}

#[tokio::test]
async fn ssl_cert_file_trusts_a_private_ca_for_providers_without_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, other_ca, cert, key) = pki(dir.path());
    let tls = TlsMock::start(&cert, &key, &ca);
    let plain = Mock::start(&[]);
    let gw = Gateway::start(
        &plain,
        Options {
            extra_toml: providers_toml(&tls.url(), None, &other_ca),
            env: vec![("SSL_CERT_FILE".into(), ca.display().to_string())],
            ..Default::default()
        },
    );
    let key = gw.user_with_key("tls-env@example.com", &[]);
    let (s, body) = call(
        &gw,
        &key,
        "/v1/chat/completions",
        json!({"model": "tls-gpt", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
    // A provider's own ca_file still decides for that provider.
    let (s, _) = call(
        &gw,
        &key,
        "/v1/chat/completions",
        json!({"model": "tls-untrusted-gpt", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(s, 502);
}

#[test]
fn ca_file_is_checked_when_the_config_loads() {
    let dir = tempfile::tempdir().unwrap();
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "just text\n").unwrap();
    let bad_der = dir.path().join("bad.pem");
    std::fs::write(
        &bad_der,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let cases = [
        (
            "https://localhost:1",
            not_pem.display().to_string(),
            "holds no PEM certificate",
        ),
        (
            "https://localhost:1",
            bad_der.display().to_string(),
            "cannot be parsed",
        ),
        (
            "https://localhost:1",
            "/nonexistent/ca.pem".into(),
            "cannot read",
        ),
        (
            "http://localhost:1",
            not_pem.display().to_string(),
            "only used with an https",
        ),
    ];
    for (url, file, want) in cases {
        let path = dir.path().join("gateway.toml");
        std::fs::write(
            &path,
            format!(
                "[[providers]]\nname = \"p\"\nstyle = \"openai\"\nbase_url = \"{url}\"\n\
                 ca_file = \"{file}\"\n"
            ),
        )
        .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_gateway"))
            .args(["--config", path.to_str().unwrap(), "config", "check"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{url} {file}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("providers[0].ca_file") && err.contains(want),
            "{url} {file}: {err}"
        );
    }
}
