//! [`ServerClock`]: step the wall clock of a `redis-server` process, and only of that process.
//!
//! A tiny shared library (compiled once per test process with the system C compiler, `cc`) is
//! preloaded into the server. It shifts what `gettimeofday`, `time` and
//! `clock_gettime(CLOCK_REALTIME)` return by an offset read from a small shared file, which the
//! test changes at will. The monotonic clock is left alone, as a real clock step would.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

const SHIM_SOURCE: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int64_t *offset_us;
static int tried;

/* Raw syscalls only: no libc call that could itself ask for the time (or allocate). */
static int64_t offset(void) {
    if (!tried) {
        tried = 1;
        const char *path = getenv("LOCK_TEST_CLOCK_FILE");
        if (path) {
            int fd = open(path, O_RDONLY);
            if (fd >= 0) {
                void *p = mmap(0, 8, PROT_READ, MAP_SHARED, fd, 0);
                if (p != MAP_FAILED) offset_us = p;
                close(fd);
            }
        }
    }
    return offset_us ? *offset_us : 0;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int rc = syscall(SYS_clock_gettime, id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + offset() * 1000;
        ts->tv_sec = ns / 1000000000;
        ts->tv_nsec = ns % 1000000000;
    }
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    (void)tz;
    if (rc == 0 && tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
"#;

/// The wall clock of the servers started with it ([`RedisServer::start_with_clock`]), which a
/// test can step forward or back while they run, like an NTP step or an operator's `date -s`.
/// Redis's key expiry, `TIME` in scripts and `LASTSAVE` follow it; the monotonic clock does not.
///
/// Needs a C compiler (`cc`) the first time; Linux/glibc only.
///
/// ```no_run
/// use std::time::Duration;
/// use lock_testing::{RedisServer, ServerClock};
///
/// let clock = ServerClock::new();
/// let server = RedisServer::start_with_clock(&clock, &[]);
/// clock.step_back(Duration::from_secs(3600)); // the server now lives an hour in the past
/// ```
///
/// [`RedisServer::start_with_clock`]: crate::RedisServer::start_with_clock
pub struct ServerClock {
    dir: PathBuf,
    file: File,
}

impl ServerClock {
    /// A clock that reads the real time until stepped.
    ///
    /// # Panics
    ///
    /// If the shim cannot be compiled (no `cc`), with the compiler's output.
    #[must_use]
    pub fn new() -> ServerClock {
        let dir = crate::server::make_temp_dir();
        let path = dir.join("offset");
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .expect("create the clock offset file");
        file.write_all(&0i64.to_le_bytes())
            .expect("write the clock offset");
        shim();
        ServerClock { dir, file }
    }

    /// Moves the servers' wall clock back by `by` from where it is now.
    pub fn step_back(&self, by: Duration) {
        self.set(self.offset() - by.as_micros() as i64);
    }

    /// Moves the servers' wall clock forward by `by` from where it is now.
    pub fn step_forward(&self, by: Duration) {
        self.set(self.offset() + by.as_micros() as i64);
    }

    /// Back to the real time.
    pub fn reset(&self) {
        self.set(0);
    }

    fn offset(&self) -> i64 {
        let mut bytes = [0u8; 8];
        self.file
            .read_exact_at(&mut bytes, 0)
            .expect("read the clock offset");
        i64::from_le_bytes(bytes)
    }

    fn set(&self, offset_us: i64) {
        self.file
            .write_all_at(&offset_us.to_le_bytes(), 0)
            .expect("write the clock offset");
    }

    pub(crate) fn env(&self) -> Vec<(OsString, OsString)> {
        vec![
            ("LD_PRELOAD".into(), shim().as_os_str().to_owned()),
            (
                "LOCK_TEST_CLOCK_FILE".into(),
                self.dir.join("offset").into_os_string(),
            ),
        ]
    }
}

impl Default for ServerClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ServerClock {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl std::fmt::Debug for ServerClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerClock")
            .field("offset_us", &self.offset())
            .finish()
    }
}

/// The compiled shim, built once per process.
fn shim() -> &'static Path {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        let dir = crate::server::make_temp_dir();
        let source = dir.join("clockshim.c");
        let library = dir.join("clockshim.so");
        fs::write(&source, SHIM_SOURCE).expect("write the clock shim source");
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&library)
            .arg(&source)
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "ServerClock needs a C compiler: running `cc` failed ({e}); install gcc \
                     (Debian: apt-get install gcc)"
                )
            });
        if !out.status.success() {
            panic!(
                "compiling the clock shim failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        library
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RedisServer;

    fn query<T: redis::FromRedisValue>(server: &RedisServer, args: &[&str]) -> T {
        let mut con = crate::admin::connect(server.port()).unwrap();
        crate::admin::cmd(args).query(&mut con).unwrap()
    }

    fn server_secs(server: &RedisServer) -> i64 {
        let (secs, _): (i64, i64) = query(server, &["TIME"]);
        secs
    }

    fn real_secs() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    #[test]
    fn a_step_moves_the_servers_clock_and_its_key_expiry() {
        let clock = ServerClock::new();
        let server = RedisServer::start_with_clock(&clock, &[]);
        assert!((server_secs(&server) - real_secs()).abs() <= 1);
        let () = query(&server, &["SET", "k", "v", "PX", "1000"]);
        clock.step_back(Duration::from_secs(3600));
        assert!((real_secs() - 3600 - server_secs(&server)).abs() <= 1);
        // A key set before the step now lives an hour longer: Redis expires by the wall clock.
        let pttl: i64 = query(&server, &["PTTL", "k"]);
        assert!(pttl > 3_000_000, "PTTL {pttl}");
        clock.reset();
        assert!((server_secs(&server) - real_secs()).abs() <= 1);
        // Restarts keep the clock.
        server.restart();
        clock.step_forward(Duration::from_secs(60));
        assert!((server_secs(&server) - real_secs() - 60).abs() <= 1);
    }
}
