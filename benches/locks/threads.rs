//! CPU time and context switches per thread, from /proc.

use std::collections::HashMap;

/// Per thread of process `pid` (`self` for this one): on-CPU nanoseconds (user + system, from
/// /proc/<pid>/task/*/schedstat) and context switches (voluntary + involuntary, from status).
fn thread_stats(pid: &str) -> HashMap<String, (u64, u64)> {
    let mut out = HashMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for entry in tasks.flatten() {
        let cpu = std::fs::read_to_string(entry.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|n| n.parse().ok()))
            .unwrap_or(0);
        let switches = std::fs::read_to_string(entry.path().join("status"))
            .map(|s| {
                s.lines()
                    .filter(|l| l.contains("ctxt_switches:"))
                    .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                    .sum()
            })
            .unwrap_or(0);
        let tid = entry.file_name().to_string_lossy().into_owned();
        out.insert(tid, (cpu, switches));
    }
    out
}

/// A snapshot of a process's threads, to measure CPU time and context switches between two
/// points. Threads that end in between (e.g. the blocking pool's) are left out.
pub(crate) struct ThreadClock {
    pid: String,
    skip: Option<String>,
    start: HashMap<String, (u64, u64)>,
}

impl ThreadClock {
    pub(crate) fn start(pid: &str, skip: Option<&str>) -> Self {
        Self {
            pid: pid.to_owned(),
            skip: skip.map(str::to_owned),
            start: thread_stats(pid),
        }
    }

    /// `(cpu ns, context switches)` since `start`.
    pub(crate) fn elapsed(&self) -> (u64, u64) {
        let mut cpu = 0;
        let mut switches = 0;
        for (tid, (c, n)) in thread_stats(&self.pid) {
            if self.skip.as_deref() == Some(tid.as_str()) {
                continue;
            }
            let (c0, n0) = self.start.get(&tid).copied().unwrap_or((0, 0));
            cpu += c.saturating_sub(c0);
            switches += n.saturating_sub(n0);
        }
        (cpu, switches)
    }
}

/// Read and write system calls of process `pid` so far (`syscr`, `syscw` of /proc/<pid>/io):
/// how many commands the server gets per read shows how well a client's requests are batched.
pub(crate) fn io_calls(pid: &str) -> (u64, u64) {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    let field = |name: &str| {
        io.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0)
    };
    (field("syscr:"), field("syscw:"))
}
