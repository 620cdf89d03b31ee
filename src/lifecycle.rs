//! The process around the server: the listen addresses are checked before Pingora gets them,
//! the pid file exists exactly while this process serves, and it belongs to one deployment.
//!
//! One pid file per serving deployment: a second gateway started with the same
//! `server.pid_file` (two instances sharing a data directory) would overwrite the first's pid,
//! so `kill -HUP "$(cat …)"` would reach only one, and they would share the upgrade socket too.
//! A lock on `<pid_file>.lock`, held while a process serves and released by the kernel when it
//! dies however it dies, tells a live owner from a stale file: the second start is refused. The
//! one exception is a graceful upgrade's new process (`GATEWAY_UPGRADE=1`), which starts while
//! its predecessor still holds the lock: it takes the pid file over once it has the listeners
//! and the lock once the predecessor exits.
//!
//! Pingora binds its listeners on each service's own runtime and, when an address is taken,
//! retries for about thirty seconds and then panics inside that runtime while the rest of the
//! process keeps running. Binding each address once up front turns that into an error at start
//! that names the address. Pingora writes `pid_file` only when it daemonises; a foreground run
//! writes it here, so `kill -HUP $(cat data/gateway.pid)` works either way.

use std::fs::{File, OpenOptions, TryLockError};
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

/// Whether stderr is the very file stdout is (one terminal, one journald stream): the
/// listening line, printed on stdout for scripts, is then not logged again on stderr.
pub fn stderr_is_stdout() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let id = |fd: std::os::fd::BorrowedFd<'_>| {
        fd.try_clone_to_owned()
            .map(File::from)
            .and_then(|f| f.metadata())
            .map(|m| (m.dev(), m.ino()))
            .ok()
    };
    let out = id(std::io::stdout().as_fd());
    out.is_some() && out == id(std::io::stderr().as_fd())
}

/// The claim of a serving process on its pid file: the lock on `<pid_file>.lock`, held for the
/// life of the process (the kernel releases it at exit, a crash and SIGKILL included).
pub struct PidLock {
    _held: File,
}

impl PidLock {
    /// Takes the lock of `pid_file` before the process serves. Refused, naming the key and the
    /// live owner, when another process holds it, unless `upgrading`: then the holder is the
    /// predecessor this process takes the listeners from, and the lock is taken (by a thread
    /// that waits for it) once the predecessor exits. `None` only in that case, until then.
    pub fn acquire(pid_file: &Path, upgrading: bool) -> Result<Option<PidLock>, String> {
        if let Some(dir) = pid_file.parent().filter(|d| !d.as_os_str().is_empty()) {
            gateway_core::util::create_private_dir(dir)?;
        }
        let path = lock_path(pid_file);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        match file.try_lock() {
            Ok(()) => Ok(Some(PidLock { _held: file })),
            Err(TryLockError::WouldBlock) if upgrading => {
                std::thread::Builder::new()
                    .name("pid-lock".into())
                    .spawn(move || {
                        // Blocks until the predecessor exits; then held until this one does.
                        if file.lock().is_ok() {
                            std::mem::forget(file);
                        }
                    })
                    .map_err(|e| format!("cannot wait for {}: {e}", path.display()))?;
                Ok(None)
            }
            Err(TryLockError::WouldBlock) => {
                let owner = std::fs::read_to_string(pid_file)
                    .ok()
                    .and_then(|t| t.trim().parse::<u32>().ok())
                    .map(|pid| format!(" (pid {pid})"))
                    .unwrap_or_default();
                Err(format!(
                    "another gateway{owner} is serving with server.pid_file {}: give each \
                     instance its own server.pid_file and server.upgrade_sock, or stop that one \
                     first (a graceful upgrade starts the new process with GATEWAY_UPGRADE=1)",
                    pid_file.display()
                ))
            }
            Err(TryLockError::Error(e)) => Err(format!("cannot lock {}: {e}", path.display())),
        }
    }
}

/// `data/gateway.pid` → `data/gateway.pid.lock`. Never removed: a process waiting for the lock
/// must find the same file the holder locked.
fn lock_path(pid_file: &Path) -> PathBuf {
    let mut name = pid_file.as_os_str().to_os_string();
    name.push(".lock");
    PathBuf::from(name)
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
            gateway_core::util::create_private_dir(dir)?;
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
    fn a_held_pid_file_is_refused_unless_upgrading() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("gateway.pid");
        let first = PidLock::acquire(&path, false).expect("first");
        assert!(first.is_some());
        std::fs::write(&path, "4242\n").expect("pid");
        let err = PidLock::acquire(&path, false).err().unwrap_or_default();
        assert!(
            err.contains("server.pid_file") && err.contains("pid 4242"),
            "{err}"
        );
        drop(first);
        let again = PidLock::acquire(&path, false).expect("free");
        assert!(again.is_some());
        // The new process of an upgrade starts while its predecessor holds the lock.
        assert!(matches!(PidLock::acquire(&path, true), Ok(None)));
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
