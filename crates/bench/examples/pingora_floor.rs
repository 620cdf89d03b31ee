//! What the project's shape allows the developer API: Pingora proxies with none of the gateway's
//! logic, to bench beside nginx and the gateway in one run (scripts/bench_floor).
//!
//! It separates what comes with a `pingora-proxy` service on the bench machine from what the
//! gateway's own work costs. Its modes:
//!
//! - `proxy`: the stock `ProxyHttp` path, `upstream_peer` returning the mock provider and
//!   nothing else (Pingora's own upstream pool, its request and response filters);
//! - `respond`: the downstream half only: read the request body, answer a fixed chat completion
//!   from `request_filter` without any upstream (what Pingora costs before a provider is asked);
//! - `lean`: Pingora's downstream half with the leanest upstream exchange there can be: the
//!   body forwarded in one write over a per-thread pool of plain keep-alive TCP connections,
//!   the answer read until its `content-length` is in and relayed with a two-header response.
//!   No client library, no header copying, no timeouts: the cheapest proxy this shape allows,
//!   i.e. what is left for everything else a gateway does;
//! - `client`: as `lean`, but the answer is read through pingora-core's HTTP/1 client session
//!   (`HttpSession::read_response`, `read_body_bytes`, `reuse`) as the gateway's
//!   src/proxy/upstream.rs does: what that client costs over the leanest read.
//!
//! A mode may carry `+N` (e.g. `client+10`): N µs of busy work on the worker thread per request,
//! standing in for a gateway's own work, to find how much of it a throughput ratio leaves room
//! for once the machine's other processes react to the slower proxy.
//!
//! All run as the gateway runs: one single-threaded event loop per worker (`work_stealing =
//! false`), the connection moved to the reactor of the thread serving it (`ThreadAffine`), no
//! downstream modules, jemalloc with the gateway's thread-cache setting.
//!
//! usage: cargo run --release --example pingora_floor -- MODE LISTEN UPSTREAM [THREADS]
//!        e.g. pingora_floor proxy 127.0.0.1:9181 127.0.0.1:9000 2

use async_trait::async_trait;
use bytes::Bytes;
use gateway_devapi::affinity::ThreadAffine;
use pingora_core::listeners::{L4BufferSettings, ListenerConfig};
use pingora_core::modules::http::HttpModules;
use pingora_core::server::configuration::{Opt, ServerConf};
use pingora_core::server::Server;
use pingora_core::services::listening::Service;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::Result;
use pingora_http::ResponseHeader;
use pingora_proxy::{ProxyHttp, Session};

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The gateway's jemalloc setting (src/main.rs), so allocation costs compare like for like.
#[allow(non_upper_case_globals)]
#[export_name = "malloc_conf"]
pub static malloc_conf: &[u8; 18] = b"tcache_max:131072\0";

/// What the mock provider answers for a non-streamed chat completion, near enough in size.
const ANSWER: &[u8] = br#"{"id":"chatcmpl-floor","object":"chat.completion","created":1700000000,"model":"mock-gpt","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! This is a mock reply from the fast upstream."},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":12,"total_tokens":24}}"#;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Proxy,
    Respond,
    Lean,
    Client,
}

thread_local! {
    /// Idle upstream connections of this worker thread (`lean` mode): each worker is a
    /// single-threaded runtime, so a socket stays on the reactor it was registered with.
    static IDLE: std::cell::RefCell<Vec<tokio::net::TcpStream>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The same for `client` mode, as Pingora streams.
    static IDLE_STREAMS: std::cell::RefCell<Vec<pingora_core::protocols::Stream>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The request head and body in one buffer.
fn request_wire(upstream: &str, body: &[u8]) -> Vec<u8> {
    let mut wire = Vec::with_capacity(160 + body.len());
    wire.extend_from_slice(b"POST /v1/chat/completions HTTP/1.1\r\nhost: ");
    wire.extend_from_slice(upstream.as_bytes());
    wire.extend_from_slice(b"\r\ncontent-type: application/json\r\ncontent-length: ");
    wire.extend_from_slice(itoa::Buffer::new().format(body.len()).as_bytes());
    wire.extend_from_slice(b"\r\n\r\n");
    wire.extend_from_slice(body);
    wire
}

/// A new keep-alive connection to the upstream (`lean` and `client` modes).
async fn dial(upstream: &str) -> std::io::Result<tokio::net::TcpStream> {
    let conn = tokio::net::TcpStream::connect(upstream).await?;
    conn.set_nodelay(true)?;
    Ok(conn)
}

/// One request (`client` mode): written in one write, the answer read with pingora-core's
/// HTTP/1 client session, the connection handed back to the per-thread list.
async fn client_exchange(upstream: &str, body: &[u8]) -> Result<Bytes> {
    use pingora_core::protocols::http::v1::client::HttpSession;
    use pingora_error::{Error, ErrorType};
    use tokio::io::AsyncWriteExt;
    let mut stream = match IDLE_STREAMS.with(|idle| idle.borrow_mut().pop()) {
        Some(stream) => stream,
        None => {
            let conn = dial(upstream)
                .await
                .map_err(|e| Error::because(ErrorType::ConnectError, "client", e))?;
            let stream: pingora_core::protocols::Stream =
                Box::new(pingora_core::protocols::l4::stream::Stream::from(conn));
            stream
        }
    };
    let write_err = |e| Error::because(ErrorType::WriteError, "client", e);
    stream
        .write_all(&request_wire(upstream, body))
        .await
        .map_err(write_err)?;
    stream.flush().await.map_err(write_err)?;
    let mut session = Box::new(HttpSession::new(stream));
    session.read_response().await?;
    let mut answer = bytes::BytesMut::new();
    while let Some(chunk) = session.read_body_bytes().await? {
        answer.extend_from_slice(&chunk);
    }
    session.respect_keepalive();
    if let Some(stream) = session.reuse().await {
        IDLE_STREAMS.with(|idle| idle.borrow_mut().push(stream));
    }
    Ok(answer.freeze())
}

/// One request over a pooled connection (`lean` mode): the request head and body in one write,
/// the answer read until its head has parsed and `content-length` bytes of body followed.
/// Returns the body. Only what the bench's mock answers is handled: a `content-length` body
/// (chunked is an error) and up to 16 headers; the status is not looked at.
async fn lean_exchange(upstream: &str, body: &[u8]) -> std::io::Result<Bytes> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = match IDLE.with(|idle| idle.borrow_mut().pop()) {
        Some(conn) => conn,
        None => dial(upstream).await?,
    };
    conn.write_all(&request_wire(upstream, body)).await?;
    let mut buf = bytes::BytesMut::with_capacity(4096);
    loop {
        if conn.read_buf(&mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut head = httparse::Response::new(&mut headers);
        let httparse::Status::Complete(head_len) = head
            .parse(&buf)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?
        else {
            continue;
        };
        let length = head
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
            .and_then(|h| std::str::from_utf8(h.value).ok()?.parse::<usize>().ok())
            .ok_or(std::io::ErrorKind::InvalidData)?;
        if buf.len() >= head_len + length {
            let mut answer = buf.split_to(head_len + length);
            IDLE.with(|idle| idle.borrow_mut().push(conn));
            return Ok(answer.split_off(head_len).freeze());
        }
    }
}

struct Floor {
    mode: Mode,
    upstream: String,
    /// Busy work per request (`+N` after the mode).
    spin: std::time::Duration,
}

#[async_trait]
impl ProxyHttp for Floor {
    type CTX = ();

    fn new_ctx(&self) {}

    /// The gateway registers none either (Pingora's default adds compression at level 0).
    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    async fn request_filter(&self, session: &mut Session, _ctx: &mut ()) -> Result<bool> {
        if !self.spin.is_zero() {
            let start = std::time::Instant::now();
            while start.elapsed() < self.spin {
                std::hint::spin_loop();
            }
        }
        if self.mode == Mode::Proxy {
            return Ok(false);
        }
        let mut body = bytes::BytesMut::new();
        while let Some(chunk) = session.read_request_body().await? {
            body.extend_from_slice(&chunk);
        }
        let answer = match self.mode {
            Mode::Lean => lean_exchange(&self.upstream, &body).await.map_err(|e| {
                pingora_error::Error::because(pingora_error::ErrorType::ReadError, "lean", e)
            })?,
            Mode::Client => client_exchange(&self.upstream, &body).await?,
            _ => Bytes::from_static(ANSWER),
        };
        let mut head = ResponseHeader::build(200, Some(3))?;
        head.insert_header("content-type", "application/json")?;
        head.insert_header("content-length", answer.len())?;
        session.write_response_header(Box::new(head), false).await?;
        session.write_response_body(Some(answer), true).await?;
        Ok(true)
    }

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(
            self.upstream.as_str(),
            false,
            String::new(),
        )))
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage =
        "usage: pingora_floor proxy|respond|lean|client[+BUSY_US] LISTEN UPSTREAM [THREADS]";
    let (Some(mode), Some(listen), Some(upstream)) = (args.first(), args.get(1), args.get(2))
    else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let (mode, spin_us) = match mode.split_once('+') {
        Some((mode, us)) => match us.parse::<u64>() {
            Ok(us) => (mode, us),
            Err(_) => {
                eprintln!("busy work {us:?} is not a whole number of µs; {usage}");
                std::process::exit(2);
            }
        },
        None => (mode.as_str(), 0),
    };
    let mode = match mode {
        "proxy" => Mode::Proxy,
        "respond" => Mode::Respond,
        "lean" => Mode::Lean,
        "client" => Mode::Client,
        other => {
            eprintln!("unknown mode {other:?}; {usage}");
            std::process::exit(2);
        }
    };
    let threads = args.get(3).and_then(|t| t.parse().ok()).unwrap_or(2);
    let conf = ServerConf {
        threads,
        work_stealing: false,
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    let proxy = pingora_proxy::http_proxy(
        &server.configuration,
        Floor {
            mode,
            upstream: upstream.clone(),
            spin: std::time::Duration::from_micros(spin_us),
        },
    );
    let mut svc = Service::new("floor".to_string(), ThreadAffine::new(proxy, 16 * 1024));
    svc.add_listener(ListenerConfig::tcp(listen).l4_buffer(L4BufferSettings::unbuffered()));
    server.add_service(svc);
    println!("pingora floor ({}) listening on {listen}", args[0]);
    server.run_forever();
}
