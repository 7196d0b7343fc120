//! A `lock_holder` child process (src/bin/lock_holder.rs): its stdout events, read line by line
//! as they happen, and process control (SIGSTOP, SIGCONT, SIGKILL).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

pub struct Holder {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
    /// Every line read so far, for failure messages.
    seen: Vec<String>,
    pid: u32,
}

impl Holder {
    /// Starts `lock_holder MODE args...`.
    pub fn spawn(mode: &str, args: &[(&str, String)]) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lock_holder"));
        cmd.arg(mode);
        for (k, v) in args {
            cmd.arg(format!("{k}={v}"));
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn lock_holder");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::unbounded_channel();
        // A thread per child: blocking reads of a pipe, handed to the async test as they come.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let pid = child.id();
        let stdin = child.stdin.take();
        Self {
            child,
            stdin,
            lines,
            seen: Vec::new(),
            pid,
        }
    }

    /// The next line starting with `prefix` (earlier lines are skipped, but kept in `seen`).
    /// Panics after `limit`, or when the process closed its stdout first.
    pub async fn expect(&mut self, prefix: &str, limit: Duration) -> String {
        let until = Instant::now() + limit;
        loop {
            match tokio::time::timeout_at(until, self.lines.recv()).await {
                Ok(Some(line)) => {
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Ok(None) => panic!(
                    "lock_holder {} exited before printing `{prefix}`; output: {:#?}",
                    self.pid, self.seen
                ),
                Err(_) => panic!(
                    "lock_holder {} did not print `{prefix}` within {limit:?}; output: {:#?}",
                    self.pid, self.seen
                ),
            }
        }
    }

    /// Every remaining line, until the process closes its stdout (bounded by `limit`).
    pub async fn rest(&mut self, limit: Duration) -> Vec<String> {
        let until = Instant::now() + limit;
        let mut out = Vec::new();
        loop {
            match tokio::time::timeout_at(until, self.lines.recv()).await {
                Ok(Some(line)) => {
                    self.seen.push(line.clone());
                    out.push(line);
                }
                Ok(None) => return out,
                Err(_) => panic!(
                    "lock_holder {} still running after {limit:?}; output: {:#?}",
                    self.pid, self.seen
                ),
            }
        }
    }

    /// The process id (the `pid` in its lock values).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Writes one line to the process's stdin.
    pub fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").expect("write to lock_holder stdin");
        stdin.flush().expect("flush lock_holder stdin");
    }

    /// SIGSTOP; returns once the process is stopped.
    pub async fn pause(&self) {
        signal(self.pid, libc::SIGSTOP);
        wait_state(self.pid, true).await;
    }

    /// SIGCONT; returns once the process runs again.
    pub async fn resume(&self) {
        signal(self.pid, libc::SIGCONT);
        wait_state(self.pid, false).await;
    }

    /// Whether the process is stopped (state `T` in /proc).
    pub fn is_stopped(&self) -> bool {
        stopped(self.pid)
    }

    /// SIGKILL, and waits for the process to be gone; returns its exit status.
    pub fn kill(&mut self) -> ExitStatus {
        self.child.kill().expect("SIGKILL lock_holder");
        self.child.wait().expect("reap lock_holder")
    }

    /// Waits for the process to exit on its own (bounded).
    pub async fn wait(&mut self, limit: Duration) -> ExitStatus {
        let until = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < until,
                "lock_holder {} did not exit within {limit:?}; output: {:#?}",
                self.pid,
                self.seen
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // SIGKILL ends a stopped process too.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of `key=` in an event line.
pub fn field<'a>(line: &'a str, key: &str) -> &'a str {
    let prefix = format!("{key}=");
    line.split(' ')
        .find_map(|f| f.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no `{key}=` in `{line}`"))
}

pub fn num_field(line: &str, key: &str) -> u64 {
    field(line, key)
        .parse()
        .unwrap_or_else(|_| panic!("`{key}` is not a number in `{line}`"))
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is our unreaped child.
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

fn stopped(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `pid (comm) S ...`: the state follows the last ')'.
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].trim_start().chars().next())
        == Some('T')
}

async fn wait_state(pid: u32, want_stopped: bool) {
    let until = Instant::now() + Duration::from_secs(2);
    while stopped(pid) != want_stopped {
        assert!(
            Instant::now() < until,
            "process {pid} did not become stopped={want_stopped}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
