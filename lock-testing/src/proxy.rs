//! [`FaultProxy`]: a TCP proxy that injects network faults between a client and a server.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::{Instant, sleep_until};

/// Chunks read but not yet written, per direction of a connection, before the proxy stops
/// reading (TCP back-pressure then holds the rest in the kernel buffers).
const MAX_HELD_CHUNKS: usize = 1024;
/// Largest chunk read at once.
const CHUNK_SIZE: usize = 16 * 1024;

/// What happens to the bytes flowing through the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Pass,
    Delay(Duration),
    Blackhole,
}

struct Shared {
    mode: watch::Sender<Mode>,
    /// Bumped by `reset_all`; each connection resets itself when it changes.
    resets: watch::Sender<u64>,
    refuse: AtomicBool,
    connections: AtomicUsize,
    bytes: AtomicU64,
}

/// A TCP proxy on `127.0.0.1` in front of one upstream server, for fault injection.
///
/// Point the code under test at [`url`](Self::url) instead of the server's, then switch the
/// proxy's mode while traffic flows: [`pass`](Self::pass), [`delay`](Self::delay),
/// [`blackhole`](Self::blackhole); or cut connections with [`reset_all`](Self::reset_all) and
/// [`refuse`](Self::refuse). Modes apply at once to the connections already open and to new ones.
///
/// Built on tokio: [`start`](FaultProxy::start) must run inside a runtime (current-thread or
/// multi-thread), which then runs the proxy's tasks. All control methods are synchronous, take
/// `&self` and may be called from any thread. Dropping the proxy stops its listener and closes
/// every connection.
///
/// ```no_run
/// use std::time::Duration;
/// use lock_testing::{FaultProxy, RedisServer};
///
/// # async fn demo() -> redis::RedisResult<()> {
/// let server = RedisServer::start();
/// let proxy = FaultProxy::start(server.addr()).await;
/// let client = redis::Client::open(proxy.url())?;
/// let mut con = client.get_multiplexed_async_connection().await?;
///
/// proxy.delay(Duration::from_millis(200)); // every byte arrives 200 ms late, each way
/// let _: () = redis::cmd("PING").query_async(&mut con).await?;
///
/// proxy.blackhole(); // partition: nothing gets through, connections stay open...
/// proxy.pass(); // ...and the partition heals: held bytes are delivered in order
///
/// proxy.reset_all(); // every open connection is reset (RST)
/// # Ok(())
/// # }
/// ```
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    accept_task: AbortHandle,
}

impl FaultProxy {
    /// Listens on a free port of `127.0.0.1` and forwards every connection to `upstream`, in
    /// [`pass`](Self::pass) mode.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, or if no loopback port can be bound.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap_or_else(|e| panic!("FaultProxy: cannot bind 127.0.0.1:0: {e}"));
        let addr = listener
            .local_addr()
            .expect("local_addr of a bound listener");
        let shared = Arc::new(Shared {
            mode: watch::Sender::new(Mode::Pass),
            resets: watch::Sender::new(0),
            refuse: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            bytes: AtomicU64::new(0),
        });
        let accept_task = tokio::spawn(accept_loop(listener, upstream, Arc::clone(&shared)));
        FaultProxy {
            addr,
            upstream,
            shared,
            accept_task: accept_task.abort_handle(),
        }
    }

    /// `redis://127.0.0.1:PORT`, the URL clients should use instead of the server's.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// The proxy's listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Forwards bytes as soon as they are read (the initial mode). Also heals a
    /// [`blackhole`](Self::blackhole): the bytes it held are delivered first, in order.
    pub fn pass(&self) {
        self.shared.mode.send_replace(Mode::Pass);
    }

    /// Delivers each chunk of bytes, in either direction, `d` after the proxy read it. Order is
    /// preserved and delays do not add up: a request/reply round trip takes about `2 * d` more,
    /// and throughput is not limited.
    pub fn delay(&self, d: Duration) {
        self.shared.mode.send_replace(Mode::Delay(d));
    }

    /// Forwards nothing, in either direction, but keeps every connection open, like a network
    /// partition. Bytes read meanwhile are held and delivered in order when the mode goes back to
    /// [`pass`](Self::pass) or [`delay`](Self::delay) (a chunk being written when this is called
    /// may still get through).
    pub fn blackhole(&self) {
        self.shared.mode.send_replace(Mode::Blackhole);
    }

    /// Resets every connection the proxy has accepted so far: both sockets (client side and server
    /// side) are closed with `RST`, held bytes are dropped, and peers see "connection reset".
    /// Nothing more is forwarded on those connections; the sockets themselves are closed by the
    /// proxy's tasks right after this returns. New connections are accepted as usual.
    pub fn reset_all(&self) {
        self.shared
            .resets
            .send_modify(|generation| *generation += 1);
    }

    /// While `true`, new connections are accepted and immediately reset, as if the server were
    /// down; connections already open are unaffected.
    pub fn refuse(&self, refuse: bool) {
        self.shared.refuse.store(refuse, Ordering::SeqCst);
    }

    /// Client connections currently open through the proxy.
    pub fn connection_count(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Bytes written to either side so far, all connections together.
    pub fn bytes_forwarded(&self) -> u64 {
        self.shared.bytes.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // The accept task owns the connection tasks (a `JoinSet`): aborting it drops them all,
        // closing every socket and the listener.
        self.accept_task.abort();
    }
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream)
            .field("mode", &*self.shared.mode.borrow())
            .field("refuse", &self.shared.refuse.load(Ordering::SeqCst))
            .field("connections", &self.connection_count())
            .finish()
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    if shared.refuse.load(Ordering::SeqCst) {
                        abort_socket(&client);
                        continue;
                    }
                    // Subscribe now, so that a `reset_all` from here on reaches this connection.
                    let resets = shared.resets.subscribe();
                    connections.spawn(serve(client, upstream, Arc::clone(&shared), resets));
                }
                // E.g. out of file descriptors: do not spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Decrements the connection count however the connection ends (even if aborted).
struct ConnectionGuard(Arc<Shared>);

impl ConnectionGuard {
    fn new(shared: Arc<Shared>) -> Self {
        shared.connections.fetch_add(1, Ordering::SeqCst);
        ConnectionGuard(shared)
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Proxies one client connection until both directions are closed, an error occurs (then both
/// sides are reset) or `reset_all` is called.
async fn serve(
    mut client: TcpStream,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    mut resets: watch::Receiver<u64>,
) {
    let _guard = ConnectionGuard::new(Arc::clone(&shared));
    let mut server = tokio::select! {
        biased;
        _ = resets.changed() => return abort_socket(&client),
        connected = TcpStream::connect(upstream) => match connected {
            Ok(server) => server,
            // Upstream down: the client sees its connection reset.
            Err(_) => return abort_socket(&client),
        },
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);

    let clean = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        let bytes = &shared.bytes;
        let pump = async {
            tokio::try_join!(
                pipe(client_read, server_write, shared.mode.subscribe(), bytes),
                pipe(server_read, client_write, shared.mode.subscribe(), bytes),
            )
        };
        // `biased`: once `reset_all` has returned, every later poll of this connection sees the
        // reset before forwarding anything more.
        tokio::select! {
            biased;
            _ = resets.changed() => false,
            done = pump => done.is_ok(),
        }
    };
    if !clean {
        abort_socket(&client);
        abort_socket(&server);
    }
}

/// One direction of a connection: a reader timestamps each chunk and queues it; a writer waits
/// until the mode lets the chunk through, then writes it. End of stream is forwarded the same
/// way, as a `shutdown(SHUT_WR)`.
async fn pipe(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut mode: watch::Receiver<Mode>,
    bytes: &AtomicU64,
) -> io::Result<()> {
    // `None` is end of stream.
    let (tx, mut rx) = mpsc::channel::<(Instant, Option<Vec<u8>>)>(MAX_HELD_CHUNKS);
    let read = async move {
        let mut buf = vec![0u8; CHUNK_SIZE];
        loop {
            let n = from.read(&mut buf).await?;
            let chunk = (n > 0).then(|| buf[..n].to_vec());
            let eof = chunk.is_none();
            if tx.send((Instant::now(), chunk)).await.is_err() || eof {
                return io::Result::Ok(());
            }
        }
    };
    let write = async move {
        while let Some((read_at, chunk)) = rx.recv().await {
            wait_turn(&mut mode, read_at).await;
            match chunk {
                Some(data) => {
                    to.write_all(&data).await?;
                    bytes.fetch_add(data.len() as u64, Ordering::SeqCst);
                }
                None => return to.shutdown().await,
            }
        }
        Ok(())
    };
    tokio::try_join!(read, write).map(|_| ())
}

/// Waits until the mode lets a chunk read at `read_at` through; re-evaluated on every mode change.
async fn wait_turn(mode: &mut watch::Receiver<Mode>, read_at: Instant) {
    loop {
        let current = *mode.borrow_and_update();
        let due = match current {
            Mode::Pass => return,
            Mode::Delay(d) => read_at + d,
            Mode::Blackhole => {
                if mode.changed().await.is_err() {
                    // The proxy is gone: hold forever (its tasks are being aborted).
                    std::future::pending::<()>().await;
                }
                continue;
            }
        };
        if Instant::now() >= due {
            return;
        }
        tokio::select! {
            _ = sleep_until(due) => {}
            changed = mode.changed() => {
                if changed.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

/// Makes the coming close of `socket` send `RST` instead of `FIN`.
fn abort_socket(socket: &TcpStream) {
    // `set_linger` is deprecated because a *non-zero* linger blocks the thread on close. A zero
    // linger never blocks: close just sends RST. (tokio 1.50 added `set_zero_linger` for this,
    // but the workspace supports tokio from 1.40.)
    #[allow(deprecated)]
    let _ = socket.set_linger(Some(Duration::ZERO));
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::time::{Instant, timeout};

    use super::*;
    use crate::server::RedisServer;
    use crate::test_resp::{async_cmd, read_reply, resp};

    const BOUND: Duration = Duration::from_secs(3);

    async fn connect(addr: SocketAddr) -> TcpStream {
        timeout(BOUND, TcpStream::connect(addr))
            .await
            .expect("connect timed out")
            .expect("connect")
    }

    async fn cmd(stream: &mut TcpStream, args: &[&str]) -> String {
        timeout(BOUND, async_cmd(stream, args))
            .await
            .expect("reply timed out")
            .expect("reply")
    }

    /// Polls `cond` every few ms until it holds; panics after `BOUND`.
    async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + BOUND;
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Reads until EOF or error; returns the error (`None` for a clean EOF).
    async fn read_to_failure(stream: &mut TcpStream) -> Option<io::Error> {
        let mut buf = [0u8; 64];
        timeout(BOUND, async {
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) => return None,
                    Ok(_) => {}
                    Err(e) => return Some(e),
                }
            }
        })
        .await
        .expect("the connection stayed open")
    }

    /// A PING on `stream` fails (write error, reset or EOF) instead of being answered.
    async fn assert_fails(stream: &mut TcpStream) {
        let reply = timeout(BOUND, async_cmd(stream, &["PING"]))
            .await
            .expect("neither answered nor closed");
        assert!(reply.is_err(), "answered: {reply:?}");
    }

    #[tokio::test]
    async fn passes_traffic_through() {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(server.addr()).await;
        assert_eq!(
            proxy.url(),
            format!("redis://127.0.0.1:{}", proxy.addr().port())
        );
        assert_eq!(proxy.upstream(), server.addr());
        let mut client = connect(proxy.addr()).await;
        assert_eq!(cmd(&mut client, &["PING"]).await, "+PONG");
        assert_eq!(cmd(&mut client, &["SET", "k", "v"]).await, "+OK");
        assert_eq!(cmd(&mut client, &["GET", "k"]).await, "$1\r\nv");
        assert_eq!(proxy.connection_count(), 1);
        assert!(proxy.bytes_forwarded() > 0);

        // A client's clean close is forwarded and the connection goes away.
        drop(client);
        eventually("the connection to close", || proxy.connection_count() == 0).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn delay_delays_each_direction_without_adding_up() {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(server.addr()).await;
        let mut client = connect(proxy.addr()).await;
        assert_eq!(cmd(&mut client, &["PING"]).await, "+PONG");

        let d = Duration::from_millis(150);
        proxy.delay(d);
        let started = Instant::now();
        assert_eq!(cmd(&mut client, &["PING"]).await, "+PONG");
        let rtt = started.elapsed();
        assert!(rtt >= 2 * d, "round trip {rtt:?} < 2 * {d:?}");

        // Five requests written 20 ms apart: each is delayed by d, not by the sum of the delays.
        let started = Instant::now();
        for _ in 0..5 {
            client.write_all(&resp(&["PING"])).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        while got.len() < 5 * b"+PONG\r\n".len() {
            let n = timeout(BOUND, client.read(&mut buf))
                .await
                .unwrap()
                .unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
        let total = started.elapsed();
        assert_eq!(got, b"+PONG\r\n".repeat(5));
        assert!(total >= 2 * d + Duration::from_millis(80), "{total:?}");
        // Cumulative delays would need at least 5 * d per direction.
        assert!(total < 5 * d, "delays added up: {total:?}");

        proxy.pass();
        let started = Instant::now();
        assert_eq!(cmd(&mut client, &["PING"]).await, "+PONG");
        assert!(started.elapsed() < d, "still delayed after pass()");
    }

    #[tokio::test]
    async fn blackhole_holds_bytes_until_pass() {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(server.addr()).await;
        let mut client = connect(proxy.addr()).await;
        let mut direct = connect(server.addr()).await;
        assert_eq!(cmd(&mut client, &["PING"]).await, "+PONG");

        proxy.blackhole();
        client.write_all(&resp(&["SET", "k", "v"])).await.unwrap();
        // Nothing reaches the server, nothing comes back, the connection stays open.
        let silence = timeout(Duration::from_millis(200), read_reply(&mut client)).await;
        assert!(
            silence.is_err(),
            "got a reply through a blackhole: {silence:?}"
        );
        assert_eq!(cmd(&mut direct, &["GET", "k"]).await, "$-1");
        assert_eq!(proxy.connection_count(), 1);

        proxy.pass();
        assert_eq!(
            timeout(BOUND, read_reply(&mut client))
                .await
                .unwrap()
                .unwrap(),
            "+OK"
        );
        assert_eq!(cmd(&mut direct, &["GET", "k"]).await, "$1\r\nv");
        assert_eq!(cmd(&mut client, &["PING"]).await, "+PONG");
    }

    #[tokio::test]
    async fn blackhole_applies_to_new_connections_and_heals_into_delay() {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(server.addr()).await;
        proxy.blackhole();
        let mut client = connect(proxy.addr()).await;
        client.write_all(&resp(&["PING"])).await.unwrap();
        let silence = timeout(Duration::from_millis(100), read_reply(&mut client)).await;
        assert!(silence.is_err(), "{silence:?}");

        let d = Duration::from_millis(50);
        let healed = Instant::now();
        proxy.delay(d);
        assert_eq!(
            timeout(BOUND, read_reply(&mut client))
                .await
                .unwrap()
                .unwrap(),
            "+PONG"
        );
        // The request was due long ago; only the reply waits for the delay.
        assert!(healed.elapsed() >= d);
    }

    #[tokio::test]
    async fn reset_all_resets_open_connections_only() {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(server.addr()).await;
        let mut a = connect(proxy.addr()).await;
        let mut b = connect(proxy.addr()).await;
        assert_eq!(cmd(&mut a, &["PING"]).await, "+PONG");
        assert_eq!(cmd(&mut b, &["PING"]).await, "+PONG");
        proxy.blackhole(); // held bytes are dropped by a reset
        b.write_all(&resp(&["PING"])).await.unwrap();
        assert_eq!(proxy.connection_count(), 2);

        proxy.reset_all();
        for stream in [&mut a, &mut b] {
            let err = read_to_failure(stream)
                .await
                .expect("clean EOF instead of a reset");
            assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err:?}");
        }
        eventually("the connections to close", || proxy.connection_count() == 0).await;

        proxy.pass();
        let mut c = connect(proxy.addr()).await;
        assert_eq!(cmd(&mut c, &["PING"]).await, "+PONG");
        assert_eq!(proxy.connection_count(), 1);
    }

    #[tokio::test]
    async fn refuse_resets_new_connections_only() {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(server.addr()).await;
        let mut open = connect(proxy.addr()).await;
        assert_eq!(cmd(&mut open, &["PING"]).await, "+PONG");

        proxy.refuse(true);
        let mut refused = connect(proxy.addr()).await;
        assert_fails(&mut refused).await;
        assert_eq!(cmd(&mut open, &["PING"]).await, "+PONG");
        assert_eq!(proxy.connection_count(), 1);

        proxy.refuse(false);
        let mut accepted = connect(proxy.addr()).await;
        assert_eq!(cmd(&mut accepted, &["PING"]).await, "+PONG");
    }

    #[tokio::test]
    async fn upstream_down_resets_the_client() {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(server.addr()).await;
        server.kill();
        let mut client = connect(proxy.addr()).await;
        assert_fails(&mut client).await;
        server.restart();
        let mut client = connect(proxy.addr()).await;
        assert_eq!(cmd(&mut client, &["PING"]).await, "+PONG");
    }

    #[tokio::test]
    async fn drop_closes_the_listener_and_connections() {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(server.addr()).await;
        let addr = proxy.addr();
        let mut client = connect(addr).await;
        assert_eq!(cmd(&mut client, &["PING"]).await, "+PONG");
        drop(proxy);
        // Clean close (FIN) or reset, either way the connection ends.
        let _ = read_to_failure(&mut client).await;
        assert!(TcpStream::connect(addr).await.is_err());
    }
}
