//! A TCP proxy that delays every chunk by a fixed time in each direction, with microsecond resolution
//!
//! The test support's `FaultProxy` waits on tokio's timer, which counts whole milliseconds, so
//! `delay(100 µs)` holds each chunk until a later millisecond tick. This proxy gives each
//! direction of a connection a thread that sleeps on the kernel's high-resolution timers with a
//! timer slack of 1 ns (the default slack, 50 µs, would add half again to a 100 µs delay).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) struct DelayProxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Every socket the proxy opened, to close them all when it is dropped.
    sockets: Arc<Mutex<Vec<TcpStream>>>,
}

impl DelayProxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream`, `each_way` late.
    pub(crate) fn start(upstream: SocketAddr, each_way: Duration) -> DelayProxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind the delay proxy");
        let addr = listener.local_addr().expect("its address");
        let stop = Arc::new(AtomicBool::new(false));
        let sockets = Arc::new(Mutex::new(Vec::new()));
        let (accepting, opened) = (Arc::clone(&stop), Arc::clone(&sockets));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if accepting.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                // Upstream down: dropping `client` closes it.
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                let clone = |s: &TcpStream| s.try_clone().expect("clone a socket");
                let mut list = opened.lock().expect("sockets");
                for socket in [&client, &server] {
                    let _ = socket.set_nodelay(true);
                    list.push(clone(socket));
                }
                pipe(clone(&client), clone(&server), each_way);
                pipe(server, client, each_way);
            }
        });
        DelayProxy {
            addr,
            stop,
            sockets,
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees `stop`.
        let _ = TcpStream::connect(self.addr);
        for socket in self.sockets.lock().expect("sockets").drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
}

/// One direction, on one thread: read a chunk, hold it until `delay` after it arrived, write it.
/// A timed sleep wakes some tens of µs late on a virtual machine; the thread learns by how much
/// and ends its sleeps that much early, so that chunks leave `delay` after arrival on average.
/// One thread (not a reader handing chunks to a writer) keeps the proxy's own cost to the one
/// wake-up per direction that any hop has. Bytes that were already waiting when a read began
/// (the read returned at once) arrived while the previous chunk was held: they are counted from
/// that chunk's arrival, so that delays never add up (pipelined chunks are held at most `delay`).
/// End of stream (or an error) is passed on as a shutdown of the writing side.
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    std::thread::spawn(move || {
        precise_sleeps();
        let mut buf = vec![0u8; 64 * 1024];
        let mut arrived = Instant::now();
        // How late a timed sleep wakes up, on average: each sleep ends that much early.
        let mut oversleep = Duration::ZERO;
        loop {
            let asked = Instant::now();
            let Ok(n @ 1..) = from.read(&mut buf) else {
                break;
            };
            let now = Instant::now();
            if now - asked > WAITED {
                arrived = now;
            }
            let wake_at = (arrived + delay).checked_sub(oversleep).unwrap_or(now);
            if wake_at > now {
                std::thread::sleep(wake_at - now);
                let late = Instant::now().saturating_duration_since(wake_at);
                oversleep = (oversleep * 7 + late.min(delay)) / 8;
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// A read that took longer than this waited for its bytes; a shorter one found them waiting.
const WAITED: Duration = Duration::from_micros(5);

/// Sets this thread's timer slack to 1 ns, so that its sleeps end when asked.
fn precise_sleeps() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer and changes only the calling thread's slack.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}
