//! How commands reach one logical server: a direct connection, a Redis Cluster connection (which
//! routes each command to the node of its key's slot and follows MOVED and ASK), or the primary
//! that Sentinel names (found again after a failover).

use std::pin::Pin;
use std::task::{Context, Poll};

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};
use std::sync::Arc;

use crate::transport::cluster::ClusterLink;
use crate::transport::in_process::InProcess;
use crate::transport::sentinel::SentinelLink;

/// The way to one logical server.
pub(crate) enum Link {
    /// One server at a fixed address (also each node of Redlock).
    Direct(ConnectionManager),
    /// A Redis Cluster: one lock lives in one slot, so the cluster is one logical server.
    Cluster(Box<ClusterLink>),
    /// The primary that a set of Sentinels names.
    Sentinel(Arc<SentinelLink>),
    /// A server in this process (`Locker::in_memory`).
    InProcess(Arc<InProcess>),
}

/// A connection to send one request on (cheap to clone).
#[derive(Clone)]
pub(crate) enum Conn {
    Direct(ConnectionManager),
    Cluster(ClusterConnection),
    InProcess(Arc<InProcess>),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Direct(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
            Self::InProcess(server) => Box::pin(std::future::ready(server.run(cmd))),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Direct(c) => c.req_packed_commands(cmd, offset, count),
            Self::Cluster(c) => c.req_packed_commands(cmd, offset, count),
            Self::InProcess(server) => {
                Box::pin(std::future::ready(server.run_pipeline(cmd, offset)))
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Direct(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
            Self::InProcess(_) => 0,
        }
    }
}

impl Link {
    /// One server at a fixed address, over `conn`.
    pub(crate) fn new_direct(conn: ConnectionManager) -> Self {
        Self::Direct(conn)
    }

    /// A Redis Cluster, reached through `cluster`.
    pub(crate) fn new_cluster(cluster: ClusterLink) -> Self {
        Self::Cluster(Box::new(cluster))
    }

    /// The primary that `sentinels` name (shared: its owner also hears of each switch).
    pub(crate) fn new_sentinel(sentinels: Arc<SentinelLink>) -> Self {
        Self::Sentinel(sentinels)
    }

    /// The server in this process, `server`.
    pub(crate) fn new_in_process(server: Arc<InProcess>) -> Self {
        Self::InProcess(server)
    }

    /// A connection for the next request (the cluster connects, and Sentinel names its primary,
    /// on first use).
    pub(crate) async fn conn(&self) -> RedisResult<Conn> {
        match self {
            Self::Direct(c) => Ok(Conn::Direct(c.clone())),
            Self::Cluster(c) => c.conn().await.map(Conn::Cluster),
            Self::Sentinel(s) => s.conn().await.map(Conn::Direct),
            Self::InProcess(server) => Ok(Conn::InProcess(Arc::clone(server))),
        }
    }

    /// `request`, from whose outcome this link learns (see [`Self::check_for_failover`]).
    pub(crate) fn watch_for_failover<F>(&self, request: F) -> FailoverWatch<'_, F> {
        FailoverWatch {
            request,
            link: self,
        }
    }

    /// Learns from a request's outcome: behind Sentinel, an error that may mean a failover makes
    /// the link ask the Sentinels for the primary again.
    pub(crate) fn check_for_failover<T>(&self, result: &RedisResult<T>) {
        if let (Self::Sentinel(s), Err(e)) = (self, result) {
            s.suspect(e);
        }
    }

    /// The cluster behind this link, if it is a Redis Cluster: its requests that span the
    /// cluster (renewal rounds by primary, SCAN, set-up checks) go through it.
    pub(crate) fn cluster(&self) -> Option<&ClusterLink> {
        match self {
            Self::Cluster(c) => Some(c),
            _ => None,
        }
    }

    /// The address of the server that answers right now, where it moves (the primary Sentinel
    /// names); `None` where the link's own address says it.
    pub(crate) fn current_primary(&self) -> Option<String> {
        match self {
            Self::Sentinel(s) => s.primary_addr(),
            _ => None,
        }
    }
}

pin_project_lite::pin_project! {
    /// A request whose outcome its link learns from. A future of its own, not an `async fn`: one
    /// that takes a future keeps it twice, and this one is in every request.
    pub(crate) struct FailoverWatch<'a, F> {
        #[pin]
        request: F,
        link: &'a Link,
    }
}

impl<T, F: Future<Output = RedisResult<T>>> Future for FailoverWatch<'_, F> {
    type Output = RedisResult<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let out = std::task::ready!(this.request.poll(cx));
        this.link.check_for_failover(&out);
        Poll::Ready(out)
    }
}
