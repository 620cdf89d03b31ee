//! The process around the server (CONTRACT §1): the listen addresses are checked before Pingora
//! gets them, and the pid file exists exactly while this process serves.
//!
//! Pingora binds its listeners on each service's own runtime and, when an address is taken,
//! retries for about thirty seconds and then panics inside that runtime while the rest of the
//! process keeps running. Binding each address once up front turns that into an error at start
//! that names the address. Pingora writes `pid_file` only when it daemonises; a foreground run
//! writes it here, so `kill -HUP $(cat data/gateway.pid)` works either way.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Binds each `(what, address)` pair the way Pingora's listener will (`SO_REUSEADDR`, so a port
/// in `TIME_WAIT` still passes) and releases it at once. The first address that cannot be bound
/// is the error, e.g. `cannot listen on api_listen 127.0.0.1:8080: Address in use`.
pub fn check_bindable(addrs: &[(&str, &str)]) -> Result<(), String> {
    for (what, addr) in addrs {
        let parsed: SocketAddr = addr
            .parse()
            .map_err(|_| format!("{what}: bad listen address {addr:?}"))?;
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(parsed),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )
        .and_then(|s| s.set_reuse_address(true).map(|()| s))
        .map_err(|e| format!("cannot listen on {what} {addr}: {e}"))?;
        socket
            .bind(&parsed.into())
            .map_err(|e| format!("cannot listen on {what} {addr}: {e}"))?;
    }
    Ok(())
}

/// The pid file of a serving process. Dropping it does nothing: a process that exits without
/// going through [`PidFile::remove`] (a crash, SIGKILL) leaves its file behind, which the next
/// start overwrites.
pub struct PidFile {
    path: PathBuf,
    pid: u32,
}

impl PidFile {
    /// Writes this process's pid to `path` (through a temporary file and a rename, so a reader
    /// never sees a half-written number).
    pub fn write(path: &Path) -> Result<PidFile, String> {
        let pid = std::process::id();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let tmp = path.with_extension(format!("pid.{pid}.tmp"));
        std::fs::write(&tmp, format!("{pid}\n"))
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                format!("cannot write pid file {}: {e}", path.display())
            })?;
        Ok(PidFile {
            path: path.to_path_buf(),
            pid,
        })
    }

    /// Removes the file if it still holds this process's pid. After a graceful upgrade the new
    /// process has written its own pid there, and the old one must leave that in place.
    pub fn remove(&self) {
        let ours = std::fs::read_to_string(&self.path)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
            == Some(self.pid);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listening_port_is_refused_by_name() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = taken.local_addr().expect("addr").to_string();
        let err = check_bindable(&[("site_listen", &addr)]).expect_err("taken");
        assert!(err.contains("site_listen") && err.contains(&addr), "{err}");
        drop(taken);
        check_bindable(&[("site_listen", &addr)]).expect("free again");
        assert!(check_bindable(&[("api_listen", "nonsense")])
            .expect_err("bad")
            .contains("api_listen"));
    }

    #[test]
    fn the_pid_file_is_removed_only_while_it_is_ours() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("run/gateway.pid");
        let pid = PidFile::write(&path).expect("write");
        assert_eq!(
            std::fs::read_to_string(&path).expect("read").trim(),
            std::process::id().to_string()
        );
        pid.remove();
        assert!(!path.exists());
        // Another process took the file over (a graceful upgrade): it stays.
        let pid = PidFile::write(&path).expect("write");
        std::fs::write(&path, "1\n").expect("overwrite");
        pid.remove();
        assert!(path.exists());
    }
}
