//! How the engine connects to a server: timeouts, reconnect policy, TLS, and URL hygiene.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use redis::aio::ConnectionManagerConfig;
use redis::{Client, RedisResult};
use tokio::time::Instant;

use crate::plumbing::deadlines::{Bound, Deadlines};

/// Connection settings shared by every server of a locker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
    /// A server whose `maxmemory-policy` can evict keys is refused at connect, not only warned
    /// about (see `LockerBuilder::require_noeviction`).
    pub require_noeviction: bool,
}

/// The connection manager of a server's commands: reconnects quickly after a fault. Its replies
/// are not bounded by redis-rs: the engine bounds every request itself (`Node::bounded`), with
/// one timer, and an acquire attempt on one server is bounded as a whole, its request included,
/// so that request needs no second timer. (A response timeout never makes redis-rs reconnect,
/// so nothing else changes.)
pub(crate) fn command_config(settings: Settings) -> ConnectionManagerConfig {
    manager_config(settings).set_response_timeout(None)
}

/// A connection manager that reconnects quickly after a fault and bounds every reply.
pub(crate) fn manager_config(settings: Settings) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(settings.connect_timeout))
        .set_response_timeout(Some(settings.response_timeout))
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(20))
        .set_max_delay(Duration::from_millis(500))
}

/// Bounds a request by `limit` with a runtime timer of its own (the rare requests: connecting,
/// subscribing, renewing); a timeout becomes an I/O timeout error.
pub(crate) fn bounded<T, F: Future<Output = RedisResult<T>>>(
    limit: Duration,
    request: F,
) -> Bounded<tokio::time::Timeout<F>> {
    Bounded {
        request: tokio::time::timeout(limit, request),
        limit,
    }
}

/// Bounds a request by `limit` in the locker's schedule of bounds (the requests of every call:
/// see `deadlines`); a timeout becomes an I/O timeout error.
pub(crate) fn bounded_in<T, F: Future<Output = RedisResult<T>>>(
    deadlines: &Deadlines,
    limit: Duration,
    request: F,
) -> Bounded<Bound<'_, F>> {
    Bounded {
        request: deadlines.bound(Instant::now() + limit, request),
        limit,
    }
}

pin_project_lite::pin_project! {
    /// A request bounded by a time limit (see [`bounded`] and [`bounded_in`]). A future of its
    /// own, not an `async fn`: one that takes a future keeps it twice, and this one is in every
    /// request.
    pub(crate) struct Bounded<R> {
        #[pin]
        request: R,
        limit: Duration,
    }
}

impl<T, E, R: Future<Output = Result<RedisResult<T>, E>>> Future for Bounded<R> {
    type Output = RedisResult<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let limit = *this.limit;
        this.request.poll(cx).map(|out| {
            out.unwrap_or_else(|_| {
                Err(redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no reply within {limit:?}"),
                )))
            })
        })
    }
}

/// A client for `info`; with the `tls` feature and a root certificate, `rediss://` servers are
/// verified against that certificate instead of the system's trust store.
pub(crate) fn open_client(
    info: redis::ConnectionInfo,
    tls_root_cert: Option<&[u8]>,
) -> RedisResult<Client> {
    #[cfg(feature = "tls")]
    if let Some(root) = tls_root_cert {
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(root.to_vec()),
        };
        return Client::build_with_tls(info, certs);
    }
    #[cfg(not(feature = "tls"))]
    let _ = tls_root_cert;
    Client::open(info)
}

/// A recent round trip to one server, in µs: the largest sample, decaying by 1/8 per sample.
#[derive(Debug, Default)]
pub(crate) struct RoundTrip(std::sync::atomic::AtomicU64);

impl RoundTrip {
    pub(crate) fn get(&self) -> Duration {
        Duration::from_micros(self.0.load(std::sync::atomic::Ordering::Relaxed))
    }

    pub(crate) fn record(&self, sample: Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        let sample = sample.as_micros() as u64;
        let _ = self
            .0
            .fetch_update(Relaxed, Relaxed, |old| Some(sample.max(old - old / 8)));
    }
}
