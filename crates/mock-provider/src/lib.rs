//! Mock model provider used by the gateway's tests and benchmarks.
//!
//! It speaks just enough of the OpenAI and Anthropic HTTP APIs for the gateway
//! to proxy real-looking traffic (JSON bodies, SSE streams, binary audio) and
//! lets tests provoke failures through the request's `model` value or an
//! `x-mock-status` header, and make it quote the credential it received back in many encodings
//! (`echo-key:<form>`, see `faults.rs`). A model named with `tools` calls the tool
//! `get_weather` on every endpoint until the conversation ends with the tool's result, then
//! answers with text, so clients' tool loops run one round trip and end. Every request can be
//! recorded in memory and read
//! back through `/__mock/requests`, so tests can prove what the gateway sent
//! upstream. `POST /__mock/fail` scripts the next few answers' status (a
//! provider failing N times, then well again). It doubles as the benchmark baseline, hence
//! plain hyper, small request parsing, and hand-formatted hot-path stream deltas.
//!
//! On start it prints `LISTENING <addr>` on stdout so a parent process can
//! bind to port 0 and learn the real port.

mod anthropic;
mod body;
mod cloud;
mod endpoints;
mod faults;
mod openai;
mod recording;
mod render;
mod replay;
mod reply;
mod request;
mod tls;

use std::convert::Infallible;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use body::BoxedBody;
use endpoints::model_reply;
use faults::{
    echo_key_reply, failure_reply, forced_status, select_behaviour, Behaviour, Failure, SLOW_DELAY,
};
use recording::{control_reply, lock, make_record, unix_millis, Config, State};
use render::{internal_error, render};
use reply::{error_value, not_found, Reply};
use request::{ends_with_tool_result, RequestInfo, Route};

/// Largest request body accepted; tests push multi-megabyte bodies through
/// the gateway and check they arrive intact.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// Command line; every knob is per process so a test can start one mock per
/// scenario.
#[derive(Parser, Debug, Clone)]
#[command(name = "mock-provider", about = "Mock OpenAI/Anthropic provider")]
struct Cli {
    /// Address to bind; port 0 picks a free port (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Number of content deltas in streamed answers.
    #[arg(long, default_value_t = 20)]
    chunks: usize,
    /// Pause between SSE events, in milliseconds.
    #[arg(long, default_value_t = 0)]
    chunk_delay_ms: u64,
    /// Delay before every answer (headers included), in milliseconds.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Do not keep request records (benchmarks); /__mock/stats still counts.
    #[arg(long)]
    no_record: bool,
    /// Tokio worker threads.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Directory of recorded provider answers (`<name>.http`), replayed for the model
    /// `replay:<name>[@whole|@every-N|@awkward]` (see `mock_provider/replay.rs`).
    #[arg(long)]
    fixtures: Option<std::path::PathBuf>,
    /// PEM certificate chain: serve HTTPS instead of HTTP (with `--tls-key`).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<String>,
    /// PEM private key for `--tls-cert`.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<String>,
    /// Azure OpenAI: the `api-key` its paths (`/openai/...`) accept; unset, any is.
    #[arg(long)]
    azure_key: Option<String>,
    /// Gemini: the `x-goog-api-key` its paths (`/v1beta/models/...`) accept; unset, any is.
    #[arg(long)]
    gemini_key: Option<String>,
    /// Bedrock: the access key id SigV4 signatures must be made with (`/model/...`); unset,
    /// nothing is checked.
    #[arg(long, requires = "aws_secret_access_key")]
    aws_access_key_id: Option<String>,
    /// Bedrock: the secret the signatures are checked with.
    #[arg(long, requires = "aws_access_key_id")]
    aws_secret_access_key: Option<String>,
    /// Bedrock: the session token requests must carry (`x-amz-security-token`).
    #[arg(long, requires = "aws_access_key_id")]
    aws_session_token: Option<String>,
    /// Bedrock: the region signatures must be scoped to.
    #[arg(long, requires = "aws_access_key_id")]
    aws_region: Option<String>,
    /// Vertex AI: the service account's public key (PEM) that `POST /token` checks assertions
    /// with; the Vertex paths then want a token it issued. Unset, nothing is checked.
    #[arg(long, requires = "gcp_client_email")]
    gcp_public_key: Option<String>,
    /// Vertex AI: the service account's email (the assertions' issuer).
    #[arg(long, requires = "gcp_public_key")]
    gcp_client_email: Option<String>,
    /// Vertex AI: how long the access tokens `POST /token` issues live, in seconds.
    #[arg(long, default_value_t = 3599)]
    gcp_token_seconds: u64,
}

/// Read a request body to its end, keeping none of it.
async fn discard_body(mut body: Incoming) -> Result<(), Reply> {
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            return Err(Reply::json(
                StatusCode::BAD_REQUEST,
                &error_value("could not read request body", "invalid_request_error"),
            ));
        }
    }
    Ok(())
}

/// Read the whole request body, refusing more than `MAX_BODY_BYTES`.
async fn read_body(body: Incoming) -> Result<Bytes, Reply> {
    match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(Reply::json(
            StatusCode::PAYLOAD_TOO_LARGE,
            &error_value("request body too large", "invalid_request_error"),
        )),
        Err(_) => Err(Reply::json(
            StatusCode::BAD_REQUEST,
            &error_value("could not read request body", "invalid_request_error"),
        )),
    }
}

/// Work out the reply and its behaviour for one request.
async fn answer(
    route: Route,
    parts: &http::request::Parts,
    body: Incoming,
    state: &State,
) -> (Reply, Behaviour) {
    let received_ms = unix_millis();
    if route == Route::Traces && route.method_allowed(&parts.method) {
        // A trace export is read and let go frame by frame, never gathered: the sink stands in
        // for a collector on another machine, so it takes as little of the shared cores as it
        // can.
        let reply = match discard_body(body).await {
            Ok(()) => control_reply(route, &parts.method, &Bytes::new(), state),
            Err(reply) => reply,
        };
        return (reply, Behaviour::default());
    }
    let body = match read_body(body).await {
        Ok(body) => body,
        Err(reply) => return (reply, Behaviour::default()),
    };
    if route.is_control() && route.method_allowed(&parts.method) {
        return (
            control_reply(route, &parts.method, &body, state),
            Behaviour::default(),
        );
    }
    if state.config.record && !route.is_control() {
        let record = make_record(parts, &body, received_ms);
        lock(&state.records).push(record);
    }
    if route != Route::Health {
        if let Some(s) = state.take_scripted() {
            let mut reply = failure_reply(Failure::Status(
                StatusCode::from_u16(s.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            ));
            if let Reply::Json { retry_after, .. } = &mut reply {
                *retry_after = s.retry_after;
            }
            return (reply, Behaviour::default());
        }
    }
    if parts.uri.path() == "/token" && parts.method == http::Method::POST {
        if let Some(account) = &state.config.clouds.google {
            let host = parts
                .headers
                .get(http::header::HOST)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let reply = cloud::oauth::token_endpoint(account, &state.google_tokens, host, &body);
            return (reply, Behaviour::default());
        }
    }
    if let Some(call) = cloud::CloudCall::parse(parts.uri.path()) {
        return cloud::answer(&call, parts, &body, state);
    }
    let info = RequestInfo::parse(&body);
    if let Some(recorded) = replay::answer(state.config.fixtures.as_deref(), info.model()) {
        return (Reply::Replay(recorded), Behaviour::default());
    }
    let mut behaviour = select_behaviour(info.model(), forced_status(&parts.headers));
    if behaviour.tools && ends_with_tool_result(route, &body) {
        behaviour.tools = false;
    }
    let mut delay = state.config.latency;
    if behaviour.slow {
        delay += SLOW_DELAY;
    }
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let reply = if route == Route::NotFound {
        not_found()
    } else if !route.method_allowed(&parts.method) {
        Reply::json(
            StatusCode::METHOD_NOT_ALLOWED,
            &error_value("method not allowed", "invalid_request_error"),
        )
    } else if let Some(failure) = behaviour.failure {
        failure_reply(failure)
    } else if let Some(echo) = echo_key_reply(info.model(), &parts.headers) {
        echo
    } else {
        model_reply(route, &info, &body, &behaviour, &state.config)
    };
    (reply, behaviour)
}

async fn handle(
    req: Request<Incoming>,
    state: Arc<State>,
) -> Result<Response<BoxedBody>, Infallible> {
    let (parts, body) = req.into_parts();
    let route = Route::from_path(parts.uri.path());
    let (reply, behaviour) = answer(route, &parts, body, &state).await;
    let response = render(reply, &behaviour, state.config.chunk_delay).unwrap_or_else(|e| {
        eprintln!("mock-provider: cannot build response: {e}");
        internal_error()
    });
    if route.counts_as_served() {
        state.count_served(parts.uri.path());
    }
    Ok(response)
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    state: Arc<State>,
    tls: Option<pingora_rustls::TlsAcceptor>,
) {
    // Small SSE frames must leave immediately, not wait for Nagle.
    let _ = stream.set_nodelay(true);
    match tls {
        None => serve_io(stream, state).await,
        Some(acceptor) => match acceptor.accept(stream).await {
            Ok(stream) => serve_io(stream, state).await,
            // Untrusting clients hang up here; that is what TLS tests provoke.
            Err(e) => eprintln!("mock-provider: TLS handshake failed: {e}"),
        },
    }
}

async fn serve_io<S>(stream: S, state: Arc<State>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| handle(req, Arc::clone(&state)));
    // Errors here are clients going away or our own deliberate cuts.
    let _ = http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

async fn accept_loop(
    listener: TcpListener,
    state: Arc<State>,
    tls: Option<pingora_rustls::TlsAcceptor>,
) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                state.connections.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(serve_connection(stream, Arc::clone(&state), tls.clone()));
            }
            Err(e) => {
                // Typically EMFILE under load: back off instead of spinning.
                eprintln!("mock-provider: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Resolve on SIGINT or SIGTERM so the process exits 0 when a test kills it.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn run(cli: Cli) -> io::Result<()> {
    if let Some(dir) = &cli.fixtures {
        replay::check_dir(dir)?;
    }
    let tls = match (&cli.tls_cert, &cli.tls_key) {
        (Some(cert), Some(key)) => Some(tls::acceptor(cert, key)?),
        _ => None,
    };
    let clouds = cloud_credentials(&cli)?;
    let listener = TcpListener::bind(cli.listen)
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {}: {e}", cli.listen)))?;
    let addr = listener.local_addr()?;
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "LISTENING {addr}")?;
    stdout.flush()?;
    drop(stdout);
    let state = Arc::new(State::new(Config {
        chunks: cli.chunks,
        chunk_delay: Duration::from_millis(cli.chunk_delay_ms),
        latency: Duration::from_millis(cli.latency_ms),
        record: !cli.no_record,
        fixtures: cli.fixtures.clone(),
        clouds,
    }));
    tokio::select! {
        _ = accept_loop(listener, state, tls) => {}
        _ = shutdown_signal() => {}
    }
    Ok(())
}

/// The credentials the clouds' paths check, from the command line.
fn cloud_credentials(cli: &Cli) -> io::Result<cloud::CloudCredentials> {
    let aws = match (&cli.aws_access_key_id, &cli.aws_secret_access_key) {
        (Some(id), Some(secret)) => Some(cloud::sigv4::AwsCredentials {
            access_key_id: id.clone(),
            secret_access_key: secret.clone(),
            session_token: cli.aws_session_token.clone(),
            region: cli.aws_region.clone(),
        }),
        _ => None,
    };
    let google = match (&cli.gcp_public_key, &cli.gcp_client_email) {
        (Some(key), Some(email)) => Some(Arc::new(cloud::oauth::GoogleAccount::load(
            key,
            email.clone(),
            cli.gcp_token_seconds.max(1),
        )?)),
        _ => None,
    };
    Ok(cloud::CloudCredentials {
        azure_key: cli.azure_key.clone(),
        gemini_key: cli.gemini_key.clone(),
        aws,
        google,
    })
}

/// Runs the mock provider with the process's command line (the `mock-provider` binary).
pub fn main() {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.workers.max(1))
        .enable_all()
        .build()
        .expect("mock-provider: failed to build the tokio runtime");
    if let Err(e) = runtime.block_on(run(cli)) {
        eprintln!("mock-provider: {e}");
        std::process::exit(1);
    }
    // Do not wait for in-flight (possibly slow) responses on shutdown.
    runtime.shutdown_background();
}

#[cfg(test)]
mod tests;
