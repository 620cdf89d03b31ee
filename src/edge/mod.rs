//! Builds and runs the process: the storage runtime, the shared state, the Pingora server with
//! its listeners (the developer API here, the site proxy in `site_proxy`, the admin app in
//! `admin_app`), and an orderly shutdown (`drain`).
//!
//! Shutdown: SIGTERM or SIGINT stops the listeners (Pingora's graceful terminate); in-flight
//! requests then get up to `server.shutdown_drain_seconds` to finish. A drain monitor ends the
//! process as soon as nothing is in flight, after flushing the usage writer, so an idle gateway
//! stops at once and a busy one loses no usage record. SIGQUIT is Pingora's graceful upgrade.

mod admin_app;
mod drain;
mod site_proxy;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use pingora_core::listeners::{L4BufferSettings, ListenerConfig};
use pingora_core::server::configuration::{Opt, ServerConf};
use pingora_core::server::{RunArgs, Server};
use pingora_core::services::listening::Service;

use gateway_core::config::{Config, EdgeLimits};
use gateway_core::identity::IdentityCache;
use gateway_core::secrets::Secrets;
use gateway_core::state::{AppState, SharedState};
use gateway_core::storage::{redact_url, storage_runtime, Db};
use gateway_core::usage::UsageSink;
use gateway_devapi::affinity::ThreadAffine;
use gateway_devapi::conn_limits::Limiter;
use gateway_devapi::routing::Routing;
use gateway_devapi::state::{ApiState, SharedApiState};
use gateway_devapi::tokens::TokenCounter;
use gateway_devapi::upstream::UpstreamPool;
use gateway_devapi::DevApi;

use admin_app::AdminApp;
use drain::{spawn_drain_monitor, Signals};
use site_proxy::SiteEdge;

/// Write buffer of a developer connection. With Pingora's default (1,460 bytes) the response
/// header (with its rate-limit headers) and a non-streamed answer over ~1 KB did not fit
/// together, so the header went out in a `send` of its own. 16 KiB holds the header with a
/// typical answer; larger writes still go straight through. (Streams are unaffected: Pingora
/// flushes a chunked response's header by itself. The benchmark's 400-byte answer already fit,
/// so the benchmark does not show this.)
const CLIENT_WRITE_BUFFER: usize = 16 * 1024;

/// Ports chosen for `:0` listen addresses, held (bound, not listening) for the life of the
/// process. Releasing a chosen port before Pingora binds it let another process on the same
/// machine be given the same port in between (seen in CI: one test's site requests answered by
/// another test's developer API); a bound socket keeps the kernel from handing the port out
/// again, and since it never listens and sets `SO_REUSEADDR` like Pingora's listener, Pingora
/// can still bind and listen on it.
static HELD_PORTS: std::sync::Mutex<Vec<socket2::Socket>> = std::sync::Mutex::new(Vec::new());

/// A listen address with port 0 gets a concrete free port now, so it can be reported.
fn concrete_addr(addr: &str) -> Result<String, String> {
    let parsed: SocketAddr = addr
        .parse()
        .map_err(|_| format!("bad listen address {addr:?}"))?;
    if parsed.port() != 0 {
        return Ok(addr.to_string());
    }
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(parsed),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
    .map_err(|e| format!("cannot bind {addr}: {e}"))?;
    socket
        .set_reuse_address(true)
        .and_then(|()| socket.bind(&parsed.into()))
        .map_err(|e| format!("cannot bind {addr}: {e}"))?;
    let real = socket
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .ok_or_else(|| format!("cannot bind {addr}: no local address"))?;
    HELD_PORTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(socket);
    Ok(real.to_string())
}

/// Descriptors kept for everything that is not a client connection: listeners, upstream and
/// database pools, the log, files.
const RESERVED_DESCRIPTORS: u64 = 512;

/// Raises the open-file limit to its hard maximum and lowers `max_connections` to fit under it
/// with [`RESERVED_DESCRIPTORS`] to spare (each client connection holds one descriptor), so the
/// cap, not the kernel, refuses the excess and the listeners keep answering.
fn fit_descriptors(mut limits: EdgeLimits) -> EdgeLimits {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    let soft = unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return limits;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
        lim.rlim_cur
    };
    let room = soft.saturating_sub(RESERVED_DESCRIPTORS).max(1) as usize;
    if limits.max_connections > room {
        log::warn!(
            "server.limits.max_connections {} is above what the open-file limit ({soft}) \
             allows; using {room}",
            limits.max_connections
        );
        limits.max_connections = room;
        limits.max_connections_per_address = limits.max_connections_per_address.min(room);
    }
    limits
}

/// Builds the shared state on `rt`.
pub fn build_state(cfg: Config, rt: &tokio::runtime::Runtime) -> Result<SharedState, String> {
    let secrets = Secrets::load(&cfg.secrets)?;
    if secrets.key_pepper.is_none() {
        log::warn!(
            "GATEWAY_KEY_PEPPER is not set: the developer API answers key_secret_not_configured"
        );
    }
    let db = rt
        .block_on(Db::connect_with_timeout(
            &cfg.storage.database_url,
            cfg.storage.database_timeout,
        ))
        .map_err(|e| format!("database {}: {e}", redact_url(&cfg.storage.database_url)))?;
    if let Some(secret) = &secrets.session_secret {
        let key = gateway_site::twofactor::SeedKey::derive(secret.expose());
        match rt.block_on(gateway_site::twofactor::seal_plaintext_seeds(&db, &key)) {
            Ok(0) => {}
            Ok(n) => log::info!("sealed {n} plaintext two-factor seeds"),
            Err(e) => log::warn!("cannot seal plaintext two-factor seeds: {e}"),
        }
    }
    let journal = match &cfg.storage.usage_journal {
        Some(path) => {
            let database = rt
                .block_on(db.meta().identity(&cfg.storage.database_url))
                .map_err(|e| format!("database identity: {e}"))?;
            let journal = gateway_core::journal::open(path.clone(), database)?;
            journal.spawn_syncer(cfg.storage.usage_flush);
            Some(journal)
        }
        None => None,
    };
    let usage = UsageSink::start(
        db.clone(),
        rt.handle(),
        cfg.storage.usage_batch_size,
        cfg.storage.usage_flush,
        journal.clone(),
    );
    let items = gateway_core::response_items::ItemRegistry::start(
        db.clone(),
        rt.handle(),
        cfg.storage.usage_flush,
        cfg.storage.responses_retention,
        cfg.storage.database_timeout,
    );
    let identity = Arc::new(IdentityCache::new(cfg.storage.database_timeout));
    rt.spawn(identity.clone().run_feed(db.clone()));
    let backend = match cfg.storage.redis_target() {
        Some(target) => {
            let prefix = std::env::var("GATEWAY_REDIS_PREFIX").unwrap_or_else(|_| "gw:".into());
            let settings = gateway_core::quota::shared::Settings {
                timeout: cfg.storage.redis_timeout,
                outage: cfg.storage.redis_outage,
                db_timeout: cfg.storage.database_timeout,
                usage: Some(usage.clone()),
            };
            let shared = rt.block_on(gateway_core::quota::shared::Shared::connect(
                &target, &prefix, settings,
            ))?;
            log::info!(
                "quota and limits shared through {}",
                if target.is_cluster() {
                    "a Redis Cluster"
                } else {
                    "Redis"
                }
            );
            gateway_core::quota::Backend::Shared(Box::new(shared))
        }
        None => gateway_core::quota::Backend::Local(gateway_core::quota::local::Local::in_process(
            cfg.storage.database_timeout,
        )),
    };
    let quota = gateway_core::quota::Engine::new(backend, db.clone());
    // Before any request: what stopped processes of this database left in the journal is
    // recorded (their interrupted requests charged through the quota engine) first.
    if let Some(journal) = &journal {
        rt.block_on(journal.recover(&db, &quota))?;
        rt.spawn(
            journal
                .clone()
                .recover_every(db.clone(), quota.clone(), Duration::from_secs(5)),
        );
    }
    rt.spawn(quota.clone().run_maintenance(cfg.quota.reservation_timeout));
    for p in cfg.providers.values() {
        if let (Some(var), None) = (&p.api_key_env, &p.api_key) {
            log::warn!(
                "provider {}: {var} is not set; its deployments are not tried",
                p.name
            );
        }
    }
    let state: SharedState = Arc::new(AppState {
        config: ArcSwap::from_pointee(cfg),
        db,
        rt: rt.handle().clone(),
        key_hasher: secrets
            .key_pepper
            .as_ref()
            .and_then(|p| gateway_core::apikey::KeyHasher::new(p.expose())),
        secrets,
        identity,
        usage,
        quota,
        items,
    });
    Ok(state)
}

/// Builds the developer API's state over the shared one on `rt`: the tokenizer, the upstream
/// pool (swept of idle connections) and the deployments' health.
pub fn build_api_state(
    state: SharedState,
    rt: &tokio::runtime::Runtime,
) -> Result<SharedApiState, String> {
    let tokens = Arc::new(TokenCounter::new().map_err(|e| format!("tokenizer: {e}"))?);
    let api = Arc::new(ApiState {
        shared: state,
        tokens,
        upstreams: UpstreamPool::new(),
        routing: Routing::new(),
        google_tokens: gateway_devapi::cloud::TokenCache::new(),
    });
    api.routing.register(&api.config());
    let sweeper = api.clone();
    rt.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(10));
        loop {
            tick.tick().await;
            sweeper.upstreams.sweep_idle();
        }
    });
    Ok(api)
}

/// `gateway serve`: runs until a shutdown signal.
pub fn serve(mut cfg: Config) -> Result<(), String> {
    let rt = storage_runtime()?;
    cfg.server.api_listen = concrete_addr(&cfg.server.api_listen)?;
    cfg.server.site_listen = concrete_addr(&cfg.server.site_listen)?;
    let api_listen = cfg.server.api_listen.clone();
    let site_listen = cfg.server.site_listen.clone();
    let drain = cfg.server.shutdown_drain;
    let limits = cfg.server.limits;
    let admin_listen = match &cfg.server.admin_listen {
        Some(a) => Some(concrete_addr(a)?),
        None => None,
    };
    cfg.server.admin_listen = admin_listen.clone();
    let config_path = cfg.path.clone();
    let upgrade_sock = cfg.server.upgrade_sock.clone();
    let pid_file = cfg.server.pid_file.clone();
    let panel_url = format!("{}/panel", cfg.server.site_origin.trim_end_matches('/'));
    let upgrading = std::env::var("GATEWAY_UPGRADE").is_ok_and(|v| v == "1");
    // Before anything else: a second gateway on this deployment's pid file is refused.
    let _pid_lock = crate::lifecycle::PidLock::acquire(&pid_file, upgrading)?;
    if !upgrading {
        // A graceful upgrade receives the listeners from the old process instead.
        let mut listeners = vec![
            ("api_listen", api_listen.as_str()),
            ("site_listen", &site_listen),
        ];
        if let Some(a) = &admin_listen {
            listeners.push(("admin_listen", a));
        }
        crate::lifecycle::check_bindable(&listeners)?;
    }
    for p in [&upgrade_sock, &pid_file] {
        if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
            gateway_core::util::create_private_dir(dir)?;
        }
    }
    gateway_core::metrics::init();
    let threads = cfg.server.threads;
    let conf = ServerConf {
        threads,
        grace_period_seconds: Some(drain.as_secs().max(1)),
        graceful_shutdown_timeout_seconds: Some(1),
        // One single-threaded event loop per worker thread: a connection (client or pooled
        // upstream) stays on the thread whose reactor registered it, so no request pays
        // cross-thread wake-ups.
        work_stealing: false,
        upgrade_sock: upgrade_sock.display().to_string(),
        pid_file: pid_file.display().to_string(),
        ..ServerConf::default()
    };
    let opt = Opt {
        upgrade: upgrading,
        ..Opt::default()
    };
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    // Take the listeners over first (a graceful upgrade hands them to us within seconds);
    // building the state (database, tokenizer) can take longer than the old process waits.
    server.bootstrap();
    let state = build_state(cfg, &rt)?;
    // Before either service starts: both read whether telemetry is on once.
    gateway_telemetry::start(&state, rt.handle().clone())?;
    let api_state = build_api_state(state.clone(), &rt)?;

    // The account service, on a private socket served by the storage runtime.
    let uds = crate::lifecycle::site_socket(&upgrade_sock);
    {
        let state = state.clone();
        let path = uds.clone();
        rt.spawn(async move {
            if let Err(e) = gateway_site::serve_uds(state, &path).await {
                log::error!("account service stopped: {e}");
            }
        });
    }

    let dev_api = DevApi::new(api_state);
    // Each connection is moved to the worker that serves it (see `affinity`), with the write
    // buffer in front of the moved socket; the accepted one needs no buffers. With a single
    // worker the move is needless but costs only a dup and two epoll_ctl per connection: one
    // code path for every thread count.
    // Both listeners share one set of connection counts: the descriptors they use are the
    // process's.
    let limiter = Limiter::new(fit_descriptors(limits));
    let mut api = Service::new(
        "developer-api".to_string(),
        ThreadAffine::new(dev_api, CLIENT_WRITE_BUFFER).limited(
            limiter.clone(),
            "developer API",
            gateway_devapi::conn_limits::API_HEAD_TOO_LARGE,
        ),
    );
    api.add_listener(ListenerConfig::tcp(&api_listen).l4_buffer(L4BufferSettings::unbuffered()));
    server.add_service(api);
    let site_proxy = pingora_proxy::http_proxy(
        &server.configuration,
        SiteEdge {
            socket: uds.clone(),
        },
    );
    let mut site = Service::new(
        "site".to_string(),
        ThreadAffine::new(site_proxy, CLIENT_WRITE_BUFFER).limited(
            limiter,
            "site",
            gateway_devapi::conn_limits::SITE_HEAD_TOO_LARGE,
        ),
    );
    site.add_listener(ListenerConfig::tcp(&site_listen).l4_buffer(L4BufferSettings::unbuffered()));
    server.add_service(site);

    if let Some(admin) = &admin_listen {
        let mut svc = pingora_core::services::listening::Service::new(
            "admin".to_string(),
            pingora_core::apps::http_app::HttpServer::new_app(AdminApp),
        );
        svc.add_tcp(admin);
        server.add_service(svc);
    }
    gateway_core::config::reload::spawn(state.clone(), config_path);

    // Written once the listeners are ours: during a graceful upgrade `bootstrap` returns only
    // after the old process handed them over, so until then the file still names the old one
    // (which `kill -QUIT "$(cat …)"` is aimed at).
    let pid = Arc::new(crate::lifecycle::PidFile::write(&pid_file)?);
    let phases = server.watch_execution_phase();
    spawn_drain_monitor(
        phases,
        state.clone(),
        rt.handle().clone(),
        drain,
        uds.clone(),
        pid.clone(),
    );

    let admin_note = admin_listen
        .as_deref()
        .map(|a| format!(" admin={a}"))
        .unwrap_or_default();
    let line = format!(
        "gateway listening api={api_listen} site={site_listen}{admin_note} panel={panel_url}"
    );
    println!("{line}");
    if !crate::lifecycle::stderr_is_stdout() {
        log::info!("{line}");
    }
    server.run(RunArgs {
        shutdown_signal: Box::new(Signals),
    });
    // Reached when the drain deadline passed with requests still in flight: they were dropped
    // and settled by their guards; write what they recorded.
    rt.block_on(state.usage.flush());
    rt.block_on(state.items.flush());
    gateway_devapi::accesslog::flush();
    gateway_telemetry::shutdown();
    let _ = std::fs::remove_file(&uds);
    pid.remove();
    Ok(())
}
