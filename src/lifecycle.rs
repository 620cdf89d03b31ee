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
//!
//! The account service listens on a private Unix socket, one per process (during a graceful
//! upgrade the old and the new process both serve). It sits beside the upgrade socket, in the
//! deployment's own directory; a process killed without its clean exit leaves the file behind,
//! so each start removes the files of processes that no longer run ([`site_socket`]).

use std::fs::{File, OpenOptions, TryLockError};
use std::net::SocketAddr;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// The account service's socket is `gateway-site-<pid>.sock` (earlier versions added
/// `-<random>` and kept it in the temporary directory).
const SITE_SOCKET_PREFIX: &str = "gateway-site-";
/// A Unix socket path holds at most 107 bytes (`sun_path` with its terminating NUL).
const MAX_SOCKET_PATH: usize = 107;

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

/// The path of this process's account-service socket: `gateway-site-<pid>.sock` in the
/// directory of `upgrade_sock` (the deployment's own, `data/` by default), or in the temporary
/// directory when that path would be too long for a socket. Sockets left there, and in the
/// temporary directory, by processes that no longer run are removed first.
pub fn site_socket(upgrade_sock: &Path) -> PathBuf {
    let pid = std::process::id();
    let dir = upgrade_sock
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let temp = std::env::temp_dir();
    sweep_stale_site_sockets(dir);
    if temp != dir {
        sweep_stale_site_sockets(&temp);
    }
    let path = dir.join(format!("{SITE_SOCKET_PREFIX}{pid}.sock"));
    if path.as_os_str().len() <= MAX_SOCKET_PATH {
        return path;
    }
    log::warn!(
        "{} is too long for a Unix socket; the account service listens in {} instead",
        path.display(),
        temp.display()
    );
    temp.join(format!(
        "{SITE_SOCKET_PREFIX}{pid}-{}.sock",
        gateway_core::util::random_base62(8)
    ))
}

/// Removes the account-service sockets in `dir` whose process is gone. Only sockets with the
/// service's name are touched, and only when their pid names no running process: a live
/// process's socket (a graceful upgrade's old process, another deployment's) stays. Failures
/// (another user's file in a shared directory) are left alone.
fn sweep_stale_site_sockets(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(site_socket_pid) else {
            continue;
        };
        let is_socket = entry.file_type().is_ok_and(|t| t.is_socket());
        if is_socket && !process_runs(pid) && std::fs::remove_file(entry.path()).is_ok() {
            log::info!("removed {}, left by process {pid}", entry.path().display());
        }
    }
}

/// The pid in a socket name `gateway-site-<pid>.sock` or `gateway-site-<pid>-<random>.sock`.
fn site_socket_pid(name: &str) -> Option<i32> {
    let rest = name
        .strip_prefix(SITE_SOCKET_PREFIX)?
        .strip_suffix(".sock")?;
    let digits = rest.split_once('-').map_or(rest, |(pid, _)| pid);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<i32>().ok().filter(|pid| *pid > 0)
}

/// True unless no process has the id `pid` (signal 0 probes without signalling; a process of
/// another user answers `EPERM`, which still means it runs).
fn process_runs(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists and may be signalled;
    // `pid` is positive, so it names one process, never a group.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
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
    fn site_socket_names_give_their_pid() {
        assert_eq!(site_socket_pid("gateway-site-123.sock"), Some(123));
        assert_eq!(site_socket_pid("gateway-site-123-AbC9.sock"), Some(123));
        for other in [
            "gateway-site-.sock",
            "gateway-site-0.sock",
            "gateway-site--5.sock",
            "gateway-site-12a.sock",
            "gateway-site-99999999999.sock",
            "gateway-site-123.sock.bak",
            "upgrade.sock",
        ] {
            assert_eq!(site_socket_pid(other), None, "{other}");
        }
        assert!(process_runs(i32::try_from(std::process::id()).unwrap()));
        assert!(
            process_runs(1),
            "init runs (and belongs to another user or to us)"
        );
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
