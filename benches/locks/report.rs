//! The table

use std::fmt::Write as _;
use std::time::Duration;

use crate::{Config, loadavg};

#[derive(Default)]
pub(crate) struct Report {
    /// Header lines that rows add (e.g. where the client and the server ran).
    context: Vec<(String, String)>,
    rows: Vec<[String; 7]>,
    notes: Vec<String>,
}

pub(crate) enum Verdict {
    Pass,
    Miss,
    Info,
}

impl Report {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn row(
        &mut self,
        id: &str,
        case: &str,
        engine: String,
        floor: String,
        ratio: String,
        target: &str,
        verdict: Verdict,
    ) {
        let verdict = match verdict {
            Verdict::Pass => "PASS",
            Verdict::Miss => "MISS",
            Verdict::Info => "-",
        };
        eprintln!("  {id} {case}: {engine} | {floor} | {ratio} | {target} | {verdict}");
        self.rows.push([
            id.to_owned(),
            case.to_owned(),
            engine,
            floor,
            ratio,
            target.to_owned(),
            verdict.to_owned(),
        ]);
    }

    pub(crate) fn context(&mut self, key: &str, value: String) {
        eprintln!("  {key}: {value}");
        self.context.push((key.to_owned(), value));
    }

    pub(crate) fn note(&mut self, note: String) {
        eprintln!("  note: {note}");
        self.notes.push(note);
    }

    pub(crate) fn print(&self, cfg: &Config, took: Duration, load_before: &str) {
        let header = [
            "#",
            "case",
            "engine",
            "floor / baseline (same run)",
            "ratio",
            "target",
            "result",
        ];
        let mut widths = header.map(str::len);
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &[&str]| {
            let mut s = String::from("|");
            for (cell, w) in cells.iter().zip(widths) {
                let pad = w - cell.chars().count();
                let _ = write!(s, " {cell}{} |", " ".repeat(pad));
            }
            s
        };
        let mut out = String::new();
        let _ = writeln!(out, "\n## Benchmark: lock engine vs floor\n");
        let _ = writeln!(out, "machine:  {}", machine());
        let _ = writeln!(out, "redis:    {}", redis_version());
        let only = std::env::var("BENCH_ONLY")
            .map_or_else(|_| String::new(), |o| format!("BENCH_ONLY={o} "));
        let _ = writeln!(
            out,
            "command:  BENCH_SECS={} {only}cargo bench -p lock-bench   (hand-off runs of {:?}, \
             held-lease run of {:?}, other figures from {} alternating rounds of {:?} slices; \
             whole run {:.0?})",
            cfg.secs.as_secs_f64(),
            cfg.handoff_run,
            cfg.secs,
            cfg.rounds,
            cfg.slice,
            took
        );
        let _ = writeln!(
            out,
            "load:     loadavg {load_before} before, {} after (other processes share the CPUs: see the notes)",
            loadavg()
        );
        for (key, value) in &self.context {
            let _ = writeln!(out, "{key}: {value}");
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "{}", line(&header));
        let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
        let rule: Vec<&str> = rule.iter().map(String::as_str).collect();
        let _ = writeln!(out, "{}", line(&rule));
        for row in &self.rows {
            let cells: Vec<&str> = row.iter().map(String::as_str).collect();
            let _ = writeln!(out, "{}", line(&cells));
        }
        let _ = writeln!(out);
        for note in &self.notes {
            let _ = writeln!(out, "- {note}");
        }
        println!("{out}");
    }
}

pub(crate) fn verdict(ok: bool) -> Verdict {
    if ok { Verdict::Pass } else { Verdict::Miss }
}

fn machine() -> String {
    // available_parallelism counts the CPUs this process may use (1 under `taskset -c 0`).
    let usable = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpus = info.lines().filter(|l| l.starts_with("processor")).count();
    let model = info
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or_else(|| "unknown CPU".to_owned(), |(_, m)| m.trim().to_owned());
    let os = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| format!("Linux {}", s.trim()))
        .unwrap_or_else(|_| std::env::consts::OS.to_owned());
    let usable = if usable == cpus {
        String::new()
    } else {
        format!(" ({usable} usable by this run)")
    };
    format!("{cpus} CPUs{usable}, {model}, {os}")
}

fn redis_version() -> String {
    let bin = std::env::var(lock_testing::REDIS_SERVER_BIN_ENV)
        .unwrap_or_else(|_| "redis-server".to_owned());
    std::process::Command::new(&bin)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|e| format!("{bin}: {e}"))
}

pub(crate) fn rate(per_sec: f64) -> String {
    let n = per_sec.round() as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    format!("{out} cycles/s")
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

pub(crate) fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(crate) fn median_duration(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Nearest-rank percentile of a sorted slice.
pub(crate) fn percentile<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
