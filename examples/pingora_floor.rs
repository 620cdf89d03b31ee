//! The floor the project's shape puts under the developer API: a Pingora proxy with none of the
//! gateway's logic, to bench beside nginx and the gateway in one run (scripts/bench_floor).
//!
//! Issue 3 asks for 70% of nginx's throughput. This binary separates what comes with a
//! `pingora-proxy` service on the bench machine from what the gateway's own work costs. Two
//! modes:
//!
//! - `proxy`: the stock `ProxyHttp` path, `upstream_peer` returning the mock provider and
//!   nothing else (Pingora's own upstream pool, its request and response filters);
//! - `respond`: the downstream half only: read the request body, answer a fixed chat completion
//!   from `request_filter` without any upstream (what Pingora costs before a provider is asked).
//!
//! Both run as the gateway runs: one single-threaded event loop per worker (`work_stealing =
//! false`), the connection moved to the reactor of the thread serving it (`ThreadAffine`), no
//! downstream modules, jemalloc with the gateway's thread-cache setting.
//!
//! usage: cargo run --release --example pingora_floor -- MODE LISTEN UPSTREAM [THREADS]
//!        e.g. pingora_floor proxy 127.0.0.1:9181 127.0.0.1:9000 2

use async_trait::async_trait;
use bytes::Bytes;
use gateway::affinity::ThreadAffine;
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
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: &[u8; 18] = b"tcache_max:131072\0";

/// What the mock provider answers for a non-streamed chat completion, near enough in size.
const ANSWER: &[u8] = br#"{"id":"chatcmpl-floor","object":"chat.completion","created":1700000000,"model":"mock-gpt","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! This is a mock reply from the fast upstream."},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":12,"total_tokens":24}}"#;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Proxy,
    Respond,
}

struct Floor {
    mode: Mode,
    upstream: String,
}

#[async_trait]
impl ProxyHttp for Floor {
    type CTX = ();

    fn new_ctx(&self) {}

    /// The gateway registers none either (Pingora's default adds compression at level 0).
    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    async fn request_filter(&self, session: &mut Session, _ctx: &mut ()) -> Result<bool> {
        if self.mode == Mode::Proxy {
            return Ok(false);
        }
        while session.read_request_body().await?.is_some() {}
        let mut head = ResponseHeader::build(200, Some(3))?;
        head.insert_header("content-type", "application/json")?;
        head.insert_header("content-length", ANSWER.len())?;
        session.write_response_header(Box::new(head), false).await?;
        session
            .write_response_body(Some(Bytes::from_static(ANSWER)), true)
            .await?;
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
    let usage = "usage: pingora_floor proxy|respond LISTEN UPSTREAM [THREADS]";
    let (Some(mode), Some(listen), Some(upstream)) = (args.first(), args.get(1), args.get(2))
    else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let mode = match mode.as_str() {
        "proxy" => Mode::Proxy,
        "respond" => Mode::Respond,
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
        },
    );
    let mut svc = Service::new("floor".to_string(), ThreadAffine::new(proxy, 16 * 1024));
    svc.add_listener(ListenerConfig::tcp(listen).l4_buffer(L4BufferSettings::unbuffered()));
    server.add_service(svc);
    println!("pingora floor ({}) listening on {listen}", args[0]);
    server.run_forever();
}
