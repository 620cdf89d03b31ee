//! `gateway`: CLI dispatch. `serve` (the default) runs the edge; the other commands are the
//! operator tools of CONTRACT §1.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::io::Write;
use std::process::ExitCode;

use admin::Output;
use clap::Parser;
use cli::{Cli, Command};
use gateway_core::config::Config;

mod admin;
mod cli;
mod edge;
mod lifecycle;

/// jemalloc instead of glibc's allocator: the request path makes many small, short-lived
/// allocations on several threads, where glibc's malloc/free is costly. (mimalloc was as fast
/// at allocating but returns freed pages to the kernel within milliseconds, and faulting them
/// back in costs more than it saves.) It also stands in for C's `malloc`
/// (the `unprefixed_malloc_on_supported_platforms` feature): SQLite allocates and frees every
/// bound text of every usage event.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's start-up options (its `malloc_conf`; the `MALLOC_CONF` environment variable
/// still overrides them). Pingora gives every HTTP/1 body reader a 64 KiB buffer, a
/// request and free per request above jemalloc's default thread-cache limit (32 KiB), so each
/// went through the arena's extent bookkeeping under its lock: raising the limit to 128 KiB
/// serves them from the thread's cache.
#[allow(non_upper_case_globals)]
#[export_name = "malloc_conf"]
pub static malloc_conf: &[u8; 18] = b"tcache_max:131072\0";

fn main() -> ExitCode {
    pingora::tls::install_default_crypto_provider();
    gateway_core::logging::init();
    let cli = Cli::parse();
    let cfg = match Config::load(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => match edge::serve(cfg) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        command => match cli::run_admin(&cfg, command) {
            Ok(output) => {
                let mut out = std::io::stdout().lock();
                let _ = match output {
                    Output::Json(v) => writeln!(out, "{v}"),
                    Output::Text(t) => out.write_all(t.as_bytes()),
                };
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
