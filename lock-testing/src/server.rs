//! [`RedisServer`]: a private `redis-server` process per test.
//!
//! # Why not `redis-test`?
//!
//! The design asks to reuse redis-rs's own `redis-test` crate where it serves. Its `RedisServer`
//! (1.0.4) does not: it reads `REDISRS_SERVER_BIN` rather than our `REDIS_SERVER_BIN`; it does not
//! wait for the server to answer `PING` (callers poll themselves); it cannot restart a server on the
//! same port, which fault tests need so that clients reconnect to the address they know; it has no
//! pause/resume; and it would pull `tempfile` and `rand` into every user of this crate.
//! The spawner below is small, so it is written by hand.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use std::{fmt, thread};

/// Environment variable naming the `redis-server` binary to run (default: `redis-server` on `PATH`).
pub const REDIS_SERVER_BIN_ENV: &str = "REDIS_SERVER_BIN";

/// How long a freshly spawned server has to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long [`RedisServer::restart`] keeps retrying while its port is still taken.
const RESTART_BIND_TIMEOUT: Duration = Duration::from_secs(2);
/// How many fresh ports [`RedisServer::start`] tries when another process grabs the chosen one first.
const START_ATTEMPTS: usize = 5;
/// The server's log (stdout and stderr, `--logfile ""`), inside its temporary directory.
const LOG_FILE: &str = "redis.log";

/// A `redis-server` process private to a test, listening on `127.0.0.1` on a port of its own.
///
/// [`start`](Self::start) spawns `redis-server` (from `REDIS_SERVER_BIN`, else from `PATH`) with
/// its own temporary directory and returns once the server answers `PING`. The process can be
/// paused (`SIGSTOP`), resumed, killed and restarted on the same port.
///
/// No persistence (`--save ""`, `--appendonly no`), `DEBUG` enabled. All methods take `&self`, so a
/// server can be shared (e.g. in an `Arc`) between the code under test and the fault injector.
/// Dropping it kills the process (`SIGKILL`) and removes its temporary directory.
///
/// Unix only (signals).
///
/// ```no_run
/// use lock_testing::RedisServer;
///
/// let server = RedisServer::start();
/// let client = redis::Client::open(server.url()).unwrap();
/// let mut con = client.get_connection().unwrap();
/// let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut con).unwrap();
///
/// server.restart(); // same port, empty data set
/// let mut con = client.get_connection().unwrap();
/// let v: Option<String> = redis::cmd("GET").arg("k").query(&mut con).unwrap();
/// assert_eq!(v, None);
/// ```
pub struct RedisServer {
    port: u16,
    config: Config,
    state: Mutex<State>,
}

struct Config {
    bin: OsString,
    /// Before the standard arguments: a config file must be redis-server's first argument.
    leading_args: Vec<OsString>,
    extra_args: Vec<OsString>,
    dir: PathBuf,
    /// `--cluster-port`, chosen with the port: the default (port + 10000) may belong to someone else.
    bus_port: Option<u16>,
    /// Environment of the process (e.g. the clock shim of [`crate::ServerClock`]).
    env: Vec<(OsString, OsString)>,
}

/// How to launch one node: shared by [`RedisServer`], `RedisCluster` and `SentinelSet`, so that
/// they spawn, probe and kill processes the same way.
pub(crate) struct NodeSpec {
    pub(crate) bin: OsString,
    /// The node's working directory, from [`make_temp_dir`]; removed when the server is dropped.
    pub(crate) dir: PathBuf,
    /// A config file in `dir`, given as the first argument (sentinels need one they can rewrite).
    pub(crate) conf_file: Option<PathBuf>,
    /// Run as a sentinel (`--sentinel`).
    pub(crate) sentinel: bool,
    /// Pick a free cluster bus port too, kept across restarts.
    pub(crate) cluster_bus: bool,
    pub(crate) args: Vec<OsString>,
    /// Extra environment variables of the process.
    pub(crate) env: Vec<(OsString, OsString)>,
}

struct State {
    /// `None` once killed.
    child: Option<Child>,
    /// Pid of the most recent process.
    pid: u32,
}

enum LaunchError {
    /// The server could not bind its port (someone else holds it).
    PortBusy,
    /// Any other failure, with a message for the panic.
    Failed(String),
}

impl RedisServer {
    /// Starts a server with the default configuration and waits until it answers `PING`.
    ///
    /// Blocks the calling thread (usually for a few milliseconds); callable inside or outside a
    /// tokio runtime.
    ///
    /// # Panics
    ///
    /// If `redis-server` cannot be found (with installation hints), or does not answer `PING`
    /// within 5 s (with its log).
    #[must_use = "dropping the RedisServer kills the server"]
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Like [`start`](Self::start), with extra command-line configuration appended, e.g.
    /// `&["--maxmemory", "10mb"]`.
    ///
    /// The arguments must not change `--port`, `--bind`, `--dir`, `--logfile` or `--daemonize`.
    #[must_use = "dropping the RedisServer kills the server"]
    pub fn start_with(extra_args: &[&str]) -> RedisServer {
        Self::start_bin(server_bin(), extra_args)
    }

    fn start_bin(bin: OsString, extra_args: &[&str]) -> RedisServer {
        Self::launch_node(NodeSpec {
            bin,
            dir: make_temp_dir(),
            conf_file: None,
            sentinel: false,
            cluster_bus: false,
            args: extra_args.iter().map(OsString::from).collect(),
            env: Vec::new(),
        })
    }

    /// Like [`start_with`](Self::start_with), with the server's wall clock under `clock`'s
    /// control (see [`ServerClock`](crate::ServerClock)); restarts keep it.
    #[must_use = "dropping the RedisServer kills the server"]
    pub fn start_with_clock(clock: &crate::ServerClock, extra_args: &[&str]) -> RedisServer {
        Self::launch_node(NodeSpec {
            bin: server_bin(),
            dir: make_temp_dir(),
            conf_file: None,
            sentinel: false,
            cluster_bus: false,
            args: extra_args.iter().map(OsString::from).collect(),
            env: clock.env(),
        })
    }

    /// Starts a node as `spec` says, on a free port, and waits until it answers `PING`.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start); `spec.dir` is removed first.
    pub(crate) fn launch_node(spec: NodeSpec) -> RedisServer {
        let mut leading_args: Vec<OsString> = spec.conf_file.into_iter().map(Into::into).collect();
        if spec.sentinel {
            leading_args.push("--sentinel".into());
        }
        let mut config = Config {
            bin: spec.bin,
            leading_args,
            extra_args: spec.args,
            dir: spec.dir,
            bus_port: None,
            env: spec.env,
        };
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            // The ports are free now; another process may still take one before the server binds
            // it, in which case the server exits and we try other ones.
            let (port, bus_port) = if spec.cluster_bus {
                let [port, bus] = free_ports();
                (port, Some(bus))
            } else {
                let [port] = free_ports();
                (port, None)
            };
            config.bus_port = bus_port;
            match launch(&config, port) {
                Ok(child) => {
                    let pid = child.id();
                    return RedisServer {
                        port,
                        config,
                        state: Mutex::new(State {
                            child: Some(child),
                            pid,
                        }),
                    };
                }
                Err(LaunchError::PortBusy) => last = format!("port {port} was taken"),
                Err(LaunchError::Failed(msg)) => {
                    let _ = fs::remove_dir_all(&config.dir);
                    panic!("{msg}");
                }
            }
        }
        let log = read_log(&config.dir, 0);
        let _ = fs::remove_dir_all(&config.dir);
        panic!(
            "redis-server could not bind a free port after {START_ATTEMPTS} attempts ({last}); log:\n{log}"
        );
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The TCP port, the same for the server's whole life (including restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// Pid of the current process (of the last one if the server was killed); changes on restart.
    pub fn pid(&self) -> u32 {
        self.lock().pid
    }

    /// Whether the process is alive (a paused process is alive).
    pub fn is_running(&self) -> bool {
        running_pid(&mut self.lock()).is_some()
    }

    /// Freezes the process with `SIGSTOP`: connections stay open but nothing is answered, like a
    /// server stuck in a long GC pause or a VM migration. Returns once the process is stopped.
    ///
    /// # Panics
    ///
    /// If the server is not running.
    pub fn pause(&self) {
        let pid = self.signal(libc::SIGSTOP, "pause");
        wait_stopped(pid, true);
    }

    /// Resumes a process paused by [`pause`](Self::pause) (`SIGCONT`); commands sent meanwhile
    /// are then answered.
    ///
    /// # Panics
    ///
    /// If the server is not running.
    pub fn resume(&self) {
        let pid = self.signal(libc::SIGCONT, "resume");
        wait_stopped(pid, false);
    }

    /// Kills the process with `SIGKILL` (paused or not) and waits for it to exit. Clients see
    /// their connections closed and new connections refused. Does nothing if already killed.
    pub fn kill(&self) {
        stop(&mut self.lock());
    }

    /// Kills the process if it is running, then starts a fresh one on the same port and waits
    /// until it answers `PING`.
    ///
    /// The data set is lost (no persistence by default; the working directory is kept, so a
    /// server started with persistence enabled through extra arguments reloads its files).
    ///
    /// # Panics
    ///
    /// If the port is still taken after 2 s, or the new process does not answer `PING` within 5 s.
    pub fn restart(&self) {
        let mut state = self.lock();
        stop(&mut state);
        let deadline = Instant::now() + RESTART_BIND_TIMEOUT;
        loop {
            match launch(&self.config, self.port) {
                Ok(child) => {
                    state.pid = child.id();
                    state.child = Some(child);
                    return;
                }
                Err(LaunchError::PortBusy) if Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(20));
                }
                Err(LaunchError::PortBusy) => panic!(
                    "RedisServer::restart: port {} still taken {RESTART_BIND_TIMEOUT:?} after the \
                     old server was killed; log:\n{}",
                    self.port,
                    self.log_contents()
                ),
                Err(LaunchError::Failed(msg)) => panic!("RedisServer::restart: {msg}"),
            }
        }
    }

    /// The node's working directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.config.dir
    }

    /// Everything the server (and its restarts) wrote to its log so far.
    pub fn log_contents(&self) -> String {
        read_log(&self.config.dir, 0)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends `sig` to the running process and returns its pid.
    fn signal(&self, sig: libc::c_int, what: &str) -> u32 {
        let mut state = self.lock();
        let Some(pid) = running_pid(&mut state) else {
            panic!(
                "RedisServer::{what}: the server (port {}) is not running",
                self.port
            );
        };
        // SAFETY: kill(2) has no memory-safety preconditions. `pid` is our own child, not yet
        // reaped (we hold the lock that guards reaping), so the pid cannot have been reused.
        let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
        if rc != 0 {
            panic!(
                "RedisServer::{what}: kill({pid}, {sig}) failed: {}",
                io::Error::last_os_error()
            );
        }
        pid
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL also ends a stopped process, no need to resume it first.
        stop(&mut self.lock());
        let _ = fs::remove_dir_all(&self.config.dir);
    }
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("pid", &self.pid())
            .field("dir", &self.config.dir)
            .finish()
    }
}

/// The binary to run: `$REDIS_SERVER_BIN` if set and non-empty, else `redis-server`.
pub(crate) fn server_bin() -> OsString {
    std::env::var_os(REDIS_SERVER_BIN_ENV)
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| OsString::from("redis-server"))
}

fn not_found_message(bin: &OsStr) -> String {
    format!(
        "redis-server not found (tried to run `{}`). The lock-testing crate runs a real \
         Redis server: install it with `apt-get install redis-server` (Debian/Ubuntu) or \
         `brew install redis` (macOS), or set {REDIS_SERVER_BIN_ENV} to the path of a \
         redis-server binary. `cargo xtask test` installs it for you.",
        bin.to_string_lossy()
    )
}

/// Pid of the child if it is alive (paused counts as alive).
fn running_pid(state: &mut State) -> Option<u32> {
    let child = state.child.as_mut()?;
    match child.try_wait() {
        Ok(None) => Some(child.id()),
        _ => None,
    }
}

/// Kills and reaps the child, if any.
fn stop(state: &mut State) {
    if let Some(mut child) = state.child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// `N` distinct loopback ports that were free a moment ago (all bound at once, so distinct).
fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: [TcpListener; N] = std::array::from_fn(|_| {
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("cannot bind 127.0.0.1:0 to pick a port: {e}"))
    });
    listeners.map(|l| {
        l.local_addr()
            .expect("local_addr of a bound listener")
            .port()
    })
}

/// A fresh directory under the system's temporary directory.
pub(crate) fn make_temp_dir() -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base = std::env::temp_dir();
    loop {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = base.join(format!(
            "lock-runtime-redis-{}-{}-{nanos:08x}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
        ));
        match fs::create_dir(&dir) {
            Ok(()) => return dir,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => panic!("cannot create a temporary directory {}: {e}", dir.display()),
        }
    }
}

/// The log from byte `offset` on.
fn read_log(dir: &Path, offset: u64) -> String {
    let mut out = Vec::new();
    if let Ok(mut file) = File::open(dir.join(LOG_FILE)) {
        let _ = file.seek(SeekFrom::Start(offset));
        let _ = file.read_to_end(&mut out);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Spawns a server on `port` and waits until it answers `PING`.
fn launch(config: &Config, port: u16) -> Result<Child, LaunchError> {
    let log_path = config.dir.join(LOG_FILE);
    let open_log = || {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| LaunchError::Failed(format!("cannot open {}: {e}", log_path.display())))
    };
    let stdout = open_log()?;
    let stderr = open_log()?;
    // Only this launch's part of the log decides whether the port was busy.
    let offset = stdout.metadata().map(|m| m.len()).unwrap_or(0);

    let mut command = Command::new(&config.bin);
    command
        .args(&config.leading_args)
        .arg("--port")
        .arg(port.to_string())
        .args(["--bind", "127.0.0.1"])
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .args(["--enable-debug-command", "yes"])
        .arg("--dir")
        .arg(&config.dir)
        // Log to stdout, which goes to the log file together with stderr (config errors).
        .args(["--logfile", ""])
        .args(["--daemonize", "no"]);
    if let Some(bus_port) = config.bus_port {
        command.arg("--cluster-port").arg(bus_port.to_string());
    }
    command.envs(config.env.iter().map(|(k, v)| (k, v)));
    let mut child = command
        .args(&config.extra_args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .map_err(|e| {
            LaunchError::Failed(if e.kind() == io::ErrorKind::NotFound {
                not_found_message(&config.bin)
            } else {
                format!("cannot run `{}`: {e}", config.bin.to_string_lossy())
            })
        })?;

    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(None) => {}
            Ok(Some(status)) => {
                let log = read_log(&config.dir, offset);
                if log.contains("Address already in use")
                    || log.contains("Failed listening on port")
                {
                    return Err(LaunchError::PortBusy);
                }
                return Err(LaunchError::Failed(format!(
                    "redis-server (port {port}) exited during startup ({status}); log:\n{log}"
                )));
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(LaunchError::Failed(format!(
                    "waiting for redis-server: {e}"
                )));
            }
        }
        if probe(addr, child.id()) {
            return Ok(child);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(LaunchError::Failed(format!(
                "redis-server (port {port}) did not answer PING within {READY_TIMEOUT:?}; log:\n{}",
                read_log(&config.dir, offset)
            )));
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// Whether the server on `addr` answers `PING` and is process `pid` (and not some other server
/// that took the port first).
fn probe(addr: SocketAddr, pid: u32) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(100)) else {
        return false;
    };
    let timeout = Some(Duration::from_millis(500));
    if stream.set_read_timeout(timeout).is_err() || stream.set_write_timeout(timeout).is_err() {
        return false;
    }
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let Some(reply) = read_until(&mut stream, |buf| buf.windows(2).any(|w| w == b"\r\n")) else {
        return false;
    };
    if reply.starts_with(b"-NOAUTH") {
        // A password was configured through extra arguments: the server is up, but we cannot ask
        // for its pid. Our process binding the port is the likely case.
        return true;
    }
    if !reply.starts_with(b"+PONG") {
        return false;
    }
    if stream.write_all(b"INFO server\r\n").is_err() {
        return false;
    }
    let Some(info) = read_until(&mut stream, |buf| parse_pid(buf).is_some()) else {
        return false;
    };
    parse_pid(&info) == Some(pid)
}

/// `process_id:N\r\n` from an `INFO` reply, once complete.
fn parse_pid(buf: &[u8]) -> Option<u32> {
    let key = b"process_id:";
    let start = buf.windows(key.len()).position(|w| w == key)? + key.len();
    let rest = &buf[start..];
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

/// Reads until `done(buffer)`, EOF, an error or the socket's read timeout.
fn read_until(stream: &mut TcpStream, done: impl Fn(&[u8]) -> bool) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !done(&buf) {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    Some(buf)
}

/// Waits (bounded) until the process is stopped (`true`) or no longer stopped (`false`), so that
/// `pause` returns only once the server can no longer answer. Signal delivery is asynchronous.
#[cfg(target_os = "linux")]
fn wait_stopped(pid: u32, stopped: bool) {
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return;
        };
        // `pid (comm) S ...`: the state follows the last ')'.
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].trim_start().chars().next());
        if matches!(state, Some('T')) == stopped {
            return;
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// Elsewhere signal delivery to a child is, in practice, immediate.
#[cfg(not(target_os = "linux"))]
fn wait_stopped(_pid: u32, _stopped: bool) {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_resp::{resp, sync_cmd};

    fn connect(server: &RedisServer) -> TcpStream {
        let stream = TcpStream::connect(server.addr()).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        stream
    }

    #[test]
    fn start_answers_ping_on_its_own_port() {
        let server = RedisServer::start();
        assert_ne!(server.port(), 6379);
        assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
        assert!(server.is_running());
        let mut stream = connect(&server);
        assert_eq!(sync_cmd(&mut stream, &["PING"]), "+PONG");
        let info = sync_cmd(&mut stream, &["INFO", "server"]);
        assert_eq!(parse_pid(info.as_bytes()), Some(server.pid()));
    }

    #[test]
    fn start_with_applies_extra_args() {
        let server = RedisServer::start_with(&["--maxmemory", "1mb"]);
        let mut stream = connect(&server);
        let reply = sync_cmd(&mut stream, &["CONFIG", "GET", "maxmemory"]);
        assert!(reply.contains("1048576"), "{reply:?}");
    }

    #[test]
    fn pause_stops_answers_and_resume_restores_them() {
        let server = RedisServer::start();
        let mut stream = connect(&server);
        assert_eq!(sync_cmd(&mut stream, &["PING"]), "+PONG");

        server.pause();
        assert!(server.is_running());
        stream
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        stream.write_all(&resp(&["PING"])).unwrap();
        let mut buf = [0u8; 16];
        let err = stream.read(&mut buf).expect_err("a paused server answered");
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
            "{err:?}"
        );

        server.resume();
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let n = stream.read(&mut buf).expect("the PING sent while paused");
        assert_eq!(&buf[..n], b"+PONG\r\n");
    }

    #[test]
    fn restart_keeps_the_port_and_loses_the_data() {
        let server = RedisServer::start();
        let (port, old_pid) = (server.port(), server.pid());
        let mut stream = connect(&server);
        assert_eq!(sync_cmd(&mut stream, &["SET", "k", "v"]), "+OK");

        server.restart();
        assert_eq!(server.port(), port);
        assert_ne!(server.pid(), old_pid);
        assert!(server.is_running());

        // The old connection died with the old process.
        let mut buf = [0u8; 16];
        assert!(matches!(stream.read(&mut buf), Ok(0) | Err(_)));

        let mut stream = connect(&server);
        assert_eq!(sync_cmd(&mut stream, &["GET", "k"]), "$-1");
    }

    #[test]
    fn restart_after_kill_and_of_a_paused_server() {
        let server = RedisServer::start();
        server.pause();
        server.restart();
        assert_eq!(sync_cmd(&mut connect(&server), &["PING"]), "+PONG");
        server.kill();
        server.restart();
        assert_eq!(sync_cmd(&mut connect(&server), &["PING"]), "+PONG");
    }

    #[test]
    fn kill_ends_the_process() {
        let server = RedisServer::start();
        let mut stream = connect(&server);
        assert_eq!(sync_cmd(&mut stream, &["PING"]), "+PONG");
        server.pause();
        server.kill();
        assert!(!server.is_running());
        let mut buf = [0u8; 16];
        assert!(matches!(stream.read(&mut buf), Ok(0) | Err(_)));
        let err = TcpStream::connect(server.addr()).expect_err("killed server accepted");
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
        server.kill(); // idempotent
    }

    #[test]
    fn drop_kills_the_process_and_removes_the_directory() {
        let server = RedisServer::start();
        let (pid, dir, addr) = (server.pid(), server.config.dir.clone(), server.addr());
        assert!(dir.is_dir());
        drop(server);
        assert!(!dir.exists());
        assert!(TcpStream::connect(addr).is_err());
        // The child was reaped: the pid no longer exists (or belongs to someone else by now).
        #[cfg(target_os = "linux")]
        if let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) {
            assert!(!stat.contains("(redis-server)"), "{stat}");
        }
        let _ = pid;
    }

    #[test]
    #[should_panic(expected = "apt-get install redis-server")]
    fn missing_binary_panics_with_install_hints() {
        RedisServer::start_bin(OsString::from("/nonexistent/redis-server"), &[]);
    }
}
