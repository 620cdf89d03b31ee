//! Live reload: the config file is watched (and re-read on SIGHUP); a new file is validated
//! whole before one atomic swap, so in-flight requests finish on the snapshot they started
//! with and a broken file changes nothing. Settings bound at start (listen addresses, database
//! and Redis URLs, secrets directory) need a restart; a change to them is logged and ignored.
//!
//! A file is taken only once it has stopped changing: after a burst of events settles, it
//! must read the same twice [`STABLE_FOR`] apart. So a truncate-then-write (an editor saving in
//! place, `cat > file`) is read whole, not in between. A file that is empty, incomplete (no
//! provider or model) or does not parse is refused like any invalid one: the running config
//! stays, and the next change to the file is tried again.
//!
//! A file cut short for good (a writer that died, a full disk) is still valid TOML when the cut
//! falls at a section boundary, and every section after it would silently return to its
//! defaults. So a new file that lacks a top-level section the running config has is refused
//! too ([`lost_sections`]); returning a section to its defaults takes its header with nothing
//! under it. Writing configs by rename (a temporary file, then `mv`) avoids both.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};

use super::Config;
use crate::state::SharedState;

/// What changed in settings that only a restart applies.
fn restart_only_changes(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut out = Vec::new();
    if old.server.api_listen != new.server.api_listen {
        out.push("server.api_listen");
    }
    if old.server.site_listen != new.server.site_listen {
        out.push("server.site_listen");
    }
    if old.server.admin_listen != new.server.admin_listen {
        out.push("server.admin_listen");
    }
    if old.server.threads != new.server.threads {
        out.push("server.threads");
    }
    if old.storage.database_url != new.storage.database_url {
        out.push("storage.database_url");
    }
    if old.storage.redis_url != new.storage.redis_url {
        out.push("storage.redis_url");
    }
    if old.storage.redis_cluster_nodes != new.storage.redis_cluster_nodes {
        out.push("storage.redis_cluster_nodes");
    }
    if old.storage.redis_timeout != new.storage.redis_timeout
        || old.storage.redis_outage != new.storage.redis_outage
        || old.storage.database_timeout != new.storage.database_timeout
    {
        out.push("storage.redis_timeout_ms, redis_outage, database_timeout_ms");
    }
    if old.secrets.dir != new.secrets.dir || old.secrets.dev_generate != new.secrets.dev_generate {
        out.push("secrets");
    }
    if old.telemetry != new.telemetry.with_ratio(old.telemetry.sample_ratio) {
        out.push("telemetry (all but sample_ratio)");
    }
    out
}

/// The top-level sections the running config has and the new one lacks, as `[name]`.
fn lost_sections(old: &Config, new: &Config) -> Vec<String> {
    old.sections
        .difference(&new.sections)
        .map(|s| format!("[{s}]"))
        .collect()
}

/// A burst of events (truncate, write, rename, chmod) settles this long into one reload.
const DEBOUNCE: Duration = Duration::from_millis(150);
/// The file must read the same twice this far apart before it is validated.
const STABLE_FOR: Duration = Duration::from_millis(300);
/// A file still changing after this many reads is left for its next change.
const MAX_READS: usize = 20;

/// The file's bytes once two reads `STABLE_FOR` apart agree; `None` if it kept changing.
async fn read_when_stable(path: &Path) -> std::io::Result<Option<String>> {
    let mut last = tokio::fs::read(path).await?;
    for _ in 0..MAX_READS {
        tokio::time::sleep(STABLE_FOR).await;
        let now = tokio::fs::read(path).await?;
        if now == last {
            return Ok(Some(String::from_utf8_lossy(&now).into_owned()));
        }
        last = now;
    }
    Ok(None)
}

/// Reads the file once it is stable, validates it and swaps it in. `last` is the text the
/// previous reload read: unless `forced` (SIGHUP), the same text again is not reloaded again
/// (the events of one save often span two debounce windows). Returns whether a new config
/// went live.
async fn reload(state: &SharedState, path: &Path, forced: bool, last: &mut Option<String>) -> bool {
    let text = match read_when_stable(path).await {
        Ok(Some(text)) if !forced && last.as_deref() == Some(text.as_str()) => return false,
        Ok(Some(text)) => last.insert(text),
        Ok(None) => {
            log::error!(
                "config reload refused, keeping the running config: {} kept changing; \
                 it is tried again at its next change",
                path.display()
            );
            crate::metrics::config_reload("error");
            return false;
        }
        Err(e) => {
            log::error!(
                "config reload refused, keeping the running config: {}: cannot read: {e}",
                path.display()
            );
            crate::metrics::config_reload("error");
            return false;
        }
    };
    swap_in(state, path, text)
}

/// Validates `text` as the file at `path` and swaps it in. Returns whether it is live.
fn swap_in(state: &SharedState, path: &Path, text: &str) -> bool {
    let mut new = match Config::from_file_text(path, text) {
        Ok(c) => c,
        Err(e) => {
            log::error!("config reload refused, keeping the running config: {e}");
            crate::metrics::config_reload("error");
            return false;
        }
    };
    let old = state.config();
    let lost = lost_sections(&old, &new);
    if !lost.is_empty() {
        log::error!(
            "config reload refused, keeping the running config: {}: {} missing, which the \
             running config has; is the file cut short? (write configs by rename; to return a \
             section to its defaults, keep its header)",
            path.display(),
            lost.join(", ")
        );
        crate::metrics::config_reload("error");
        return false;
    }
    for key in restart_only_changes(&old, &new) {
        log::warn!("config reload: {key} changed; it takes effect only after a restart");
    }
    // Keep the values the running process is bound to.
    new.server.api_listen = old.server.api_listen.clone();
    new.server.site_listen = old.server.site_listen.clone();
    new.server.admin_listen = old.server.admin_listen.clone();
    new.server.threads = old.server.threads;
    new.storage.database_url = old.storage.database_url.clone();
    new.storage.redis_url = old.storage.redis_url.clone();
    new.storage.redis_cluster_nodes = old.storage.redis_cluster_nodes.clone();
    new.storage.redis_timeout = old.storage.redis_timeout;
    new.storage.redis_outage = old.storage.redis_outage;
    new.storage.database_timeout = old.storage.database_timeout;
    new.secrets = old.secrets.clone();
    // The exporter is built at start; only the sampling ratio is read live.
    new.telemetry = old.telemetry.with_ratio(new.telemetry.sample_ratio);
    state.config.store(Arc::new(new));
    log::info!("config reloaded from {}", path.display());
    crate::metrics::config_reload("ok");
    true
}

/// Watches `path` (through its directory, since editors replace files) and SIGHUP; reloads on
/// either, debounced. Runs on the storage runtime until the process ends.
pub fn spawn(state: SharedState, path: PathBuf) {
    // `true`: SIGHUP, reload even an unchanged file.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<bool>();
    let file_name = path.file_name().map(|n| n.to_os_string());
    let watch_tx = tx.clone();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(ev) = event {
            let ours = ev
                .paths
                .iter()
                .any(|p| p.file_name().map(|n| n.to_os_string()) == file_name);
            if ours && !ev.kind.is_access() {
                let _ = watch_tx.send(false);
            }
        }
    });
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let watcher = match watcher {
        Ok(mut w) => match w.watch(&dir, RecursiveMode::NonRecursive) {
            Ok(()) => Some(w),
            Err(e) => {
                log::warn!("cannot watch {}: {e}; reload with SIGHUP", dir.display());
                None
            }
        },
        Err(e) => {
            log::warn!("cannot watch the config file: {e}; reload with SIGHUP");
            None
        }
    };
    let rt = state.rt.clone();
    rt.spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut hup) = signal(SignalKind::hangup()) {
            while hup.recv().await.is_some() {
                log::info!("SIGHUP: reloading the config");
                let _ = tx.send(true);
            }
        }
    });
    state.rt.clone().spawn(async move {
        let _keep = watcher;
        let mut last = None;
        while let Some(mut forced) = rx.recv().await {
            tokio::time::sleep(DEBOUNCE).await;
            while let Ok(f) = rx.try_recv() {
                forced |= f;
            }
            reload(&state, &path, forced, &mut last).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_only_fields_are_detected() {
        let a = Config::from_str(Path::new("a.toml"), "").unwrap();
        let b = Config::from_str(
            Path::new("a.toml"),
            "[server]\napi_listen = \"127.0.0.1:9999\"\n[storage]\ndatabase_url = \"sqlite://x.db\"\n",
        )
        .unwrap();
        assert_eq!(
            restart_only_changes(&a, &b),
            vec!["server.api_listen", "storage.database_url"]
        );
    }

    #[test]
    fn sections_the_new_file_lacks_are_named() {
        let base = "[server]\n[storage]\n[[providers]]\nname = \"p\"\nstyle = \"openai\"\n\
                    base_url = \"http://127.0.0.1:9\"\n[[models]]\nid = \"m\"\nprovider = \"p\"\n";
        let file = |text: &str| Config::from_file_text(Path::new("gw.toml"), text).unwrap();
        let whole = file(&format!("{base}[tools]\n[payment]\nlot_days = 7\n"));
        let cut = file(base);
        assert_eq!(lost_sections(&whole, &cut), ["[payment]", "[tools]"]);
        assert!(
            lost_sections(&cut, &whole).is_empty(),
            "a section added is no loss"
        );
        let emptied = file(&format!("{base}[tools]\n[payment]\n"));
        assert!(
            lost_sections(&whole, &emptied).is_empty(),
            "a bare header keeps it"
        );
    }
}
