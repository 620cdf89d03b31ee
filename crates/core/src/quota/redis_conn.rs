//! The connection to Redis: one server (`storage.redis_url`) through the `redis` crate's
//! connection manager, or a Redis Cluster (`storage.redis_cluster_nodes`) through its cluster
//! client, behind one type the engine's scripts run on.
//!
//! Every script touches the keys of one account only, and those keys share one hash tag (the
//! account id, `account_keys`), so a cluster routes each call to the one node that holds them.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// Where the shared state lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server (or a proxy in front of several).
    Single(String),
    /// The seed nodes of a Redis Cluster; the client learns the rest of the topology.
    Cluster(Vec<String>),
}

impl RedisTarget {
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisTarget::Cluster(_))
    }
}

/// A live connection of either kind. Cloning is cheap: both kinds multiplex one connection
/// (per node) among their clones.
#[derive(Clone)]
pub enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Opens connections to the target: once at start, then again after an outage (the keeper's
/// probes), each bounded by the call deadline.
#[derive(Clone)]
pub enum Connector {
    Single(redis::Client, ConnectionManagerConfig),
    /// The cluster's client, and a client of its first seed node for pub/sub (a cluster
    /// carries a `PUBLISH` to every node).
    Cluster(ClusterClient, redis::Client),
}

impl Connector {
    /// `timeout`: the deadline of one call; `connect`: of opening a connection.
    pub fn new(
        target: &RedisTarget,
        timeout: Duration,
        connect: Duration,
    ) -> Result<Connector, String> {
        match target {
            RedisTarget::Single(url) => {
                let client =
                    redis::Client::open(url.as_str()).map_err(|e| format!("redis url: {e}"))?;
                // One attempt per reconnect: the manager's own backoff (seconds, growing)
                // would keep every caller waiting on it; the breaker and the keeper's probes
                // pace retries instead.
                let config = ConnectionManagerConfig::new()
                    .set_number_of_retries(0)
                    .set_response_timeout(timeout)
                    .set_connection_timeout(connect);
                Ok(Connector::Single(client, config))
            }
            RedisTarget::Cluster(nodes) => {
                // Retries stay: a cluster answers MOVED while slots migrate, and following the
                // redirect is one. Each call is still bounded by the engine's deadline.
                let client = ClusterClient::builder(nodes.iter().map(String::as_str))
                    .retries(2)
                    .min_retry_wait(5)
                    .max_retry_wait(50)
                    .connection_timeout(connect)
                    .response_timeout(timeout)
                    .build()
                    .map_err(|e| format!("redis cluster nodes: {e}"))?;
                let seed = nodes.first().ok_or("redis cluster nodes: none given")?;
                let seed = redis::Client::open(seed.as_str())
                    .map_err(|e| format!("redis cluster node: {e}"))?;
                Ok(Connector::Cluster(client, seed))
            }
        }
    }

    pub async fn connect(&self) -> redis::RedisResult<Conn> {
        match self {
            Connector::Single(client, config) => {
                ConnectionManager::new_with_config(client.clone(), config.clone())
                    .await
                    .map(Conn::Single)
            }
            Connector::Cluster(client, _) => client.get_async_connection().await.map(Conn::Cluster),
        }
    }

    /// A client to open a pub/sub connection with.
    pub fn pubsub_client(&self) -> &redis::Client {
        match self {
            Connector::Single(client, _) | Connector::Cluster(_, client) => client,
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, Connector::Cluster(..))
    }
}
