//! A private three-master Redis Cluster on free loopback ports, for tests that run the shared
//! mode on a cluster: three `redis-server --cluster-enabled yes` in a temporary directory,
//! joined by `redis-cli --cluster create … --cluster-replicas 0`. Killed when dropped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisCluster {
    children: Vec<Child>,
    pub ports: Vec<u16>,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

fn start_node(dir: &Path, port: u16, bus: u16) -> Child {
    let node_dir = dir.join(port.to_string());
    std::fs::create_dir_all(&node_dir).expect("node dir");
    Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args([
            "--cluster-enabled",
            "yes",
            "--cluster-port",
            &bus.to_string(),
        ])
        .args(["--cluster-config-file", "nodes.conf"])
        .args(["--cluster-node-timeout", "5000"])
        .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
        .arg("--dir")
        .arg(&node_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start redis-server (is it installed?)")
}

fn answers(port: u16, command: &str, expect: &str) -> bool {
    let Ok(mut c) = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
    else {
        return false;
    };
    let mut cmd = redis::cmd(command.split(' ').next().unwrap_or(command));
    for arg in command.split(' ').skip(1) {
        cmd.arg(arg);
    }
    cmd.query::<String>(&mut c)
        .map(|s| s.contains(expect))
        .unwrap_or(false)
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        if ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("redis cluster: {what}");
}

impl RedisCluster {
    /// Starts three masters and joins them; returns once every node reports the cluster ok.
    pub fn start() -> RedisCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let mut cluster = RedisCluster {
            children: vec![],
            ports: ports.clone(),
            _dir: dir,
        };
        for &port in &ports {
            let child = start_node(cluster._dir.path(), port, free_port());
            cluster.children.push(child);
        }
        for &port in &ports {
            wait_for("a node did not answer PING", || {
                answers(port, "PING", "PONG")
            });
        }
        let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create (is redis-cli installed?)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for &port in &ports {
            wait_for("the cluster did not become ok", || {
                answers(port, "CLUSTER INFO", "cluster_state:ok")
            });
        }
        cluster
    }

    /// The seed nodes, as `storage.redis_cluster_nodes` takes them.
    pub fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// `redis_cluster_nodes = [...]`, a line of the `[storage]` section.
    pub fn storage_toml(&self) -> String {
        let list: Vec<String> = self.urls().iter().map(|u| format!("\"{u}\"")).collect();
        format!("redis_cluster_nodes = [{}]", list.join(", "))
    }

    /// Empties every node (as a restart without persistence does).
    pub fn flush_all(&self) {
        for &port in &self.ports {
            assert!(answers(port, "FLUSHALL", "OK"), "FLUSHALL on node {port}");
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
