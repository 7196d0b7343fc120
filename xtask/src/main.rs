//! Project tasks: `cargo xtask test` (everything CI runs), `cargo xtask example [name]`,
//! `cargo xtask bench`. Each installs `redis-server` first when it is missing.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("test") => test(),
        Some("example") => example(args.get(1).map_or("scheduled_job", String::as_str)),
        Some("bench") => bench(),
        Some("setup") => ensure_redis()
            .and_then(|()| ensure_c_compiler())
            .and_then(|()| ensure_python_redis()),
        _ => {
            eprintln!(
                "usage: cargo xtask <test | example [name] | bench | setup>\n  \
                 test     fmt check, clippy -D warnings, every test (including the slow ones)\n  \
                 example  run an example against a private redis-server (default: scheduled_job)\n  \
                 bench    clippy on the benchmark package, then the benchmark table\n  \
                 setup    get what the tests need when missing (redis-server, cc; redis-py in a venv)"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn test() -> Result<(), String> {
    ensure_redis()?;
    ensure_c_compiler()?;
    ensure_python_redis()?;
    run("cargo", &["fmt", "--all", "--check"])?;
    // The benchmark package (and its baselines' dependencies) is built by `cargo xtask bench` only.
    let clippy = [
        "clippy",
        "--workspace",
        "--exclude",
        "lock-bench",
        "--all-targets",
    ];
    run("cargo", &[&clippy[..], &["--", "-D", "warnings"]].concat())?;
    run(
        "cargo",
        &[&clippy[..], &["--all-features", "--", "-D", "warnings"]].concat(),
    )?;
    // The API documentation builds without a warning: no broken intra-doc link, no public doc
    // that links a private item.
    run_with(
        "cargo",
        &[
            "doc",
            "--workspace",
            "--exclude",
            "lock-bench",
            "--no-deps",
            "--all-features",
        ],
        &[("RUSTDOCFLAGS", "-D warnings")],
    )?;
    // --all-features adds the `tls` tests; --include-ignored the slow fault and soak tests.
    run(
        "cargo",
        &[
            "test",
            "--workspace",
            "--exclude",
            "lock-bench",
            "--all-features",
            "--",
            "--include-ignored",
        ],
    )?;
    test_without_redis()
}

/// A user's crate whose tests lock through `Locker::in_memory()` needs no Redis: the tests of
/// `tests/fixtures/in-memory-user` run once more with every directory that holds a
/// `redis-server` taken off PATH (built first, with the whole PATH, as a user's machine would).
fn test_without_redis() -> Result<(), String> {
    let package = ["test", "--package", "in-memory-user"];
    run("cargo", &[&package[..], &["--no-run"]].concat())?;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let kept: Vec<PathBuf> = std::env::split_paths(&path)
        .filter(|dir| !dir.join("redis-server").exists())
        .collect();
    let path = std::env::join_paths(kept).map_err(|e| format!("PATH: {e}"))?;
    // The cargo that runs this task, by its path: its own directory may be one taken off.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    eprintln!(
        "+ PATH=<PATH without redis-server> {cargo} {}",
        package.join(" ")
    );
    let status = Command::new(&cargo)
        .args(package)
        .env("PATH", path)
        .env_remove("REDIS_SERVER_BIN")
        .env("LOCK_EXPECT_NO_REDIS_SERVER", "1")
        .status()
        .map_err(|e| format!("cannot run {cargo}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "the in-memory fixture's tests failed without redis-server: {status}"
        ))
    }
}

/// CI leaves the benchmark package out, so it is linted here, before it runs.
fn bench() -> Result<(), String> {
    ensure_redis()?;
    run(
        "cargo",
        &[
            "clippy",
            "--package",
            "lock-bench",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    run("cargo", &["bench", "--package", "lock-bench"])
}

fn example(name: &str) -> Result<(), String> {
    ensure_redis()?;
    // Not --quiet: on a fresh clone the first build takes a while, and cargo's progress shows
    // that something is happening.
    eprintln!("xtask: building and running the example `{name}` (the first build takes a while)");
    let mut args = vec!["run", "--package", "lock-examples", "--example", name];
    // The examples with a dependency of their own (axum, tokio-cron-scheduler) have a feature
    // for it, so that the other examples never build it.
    if name == "http_handler" {
        args.extend(["--features", "http"]);
    }
    if name == "leader" {
        args.extend(["--features", "cron"]);
    }
    run("cargo", &args)
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    run_with(program, args, &[])
}

/// [`run`], with `env` added to the program's environment.
fn run_with(program: &str, args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    let shown: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v:?} ")).collect();
    eprintln!("+ {}{program} {}", shown.concat(), args.join(" "));
    let status = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .status()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{program} {}` failed: {status}", args.join(" ")))
    }
}

/// Makes sure a `redis-server` binary is available: `REDIS_SERVER_BIN`, or PATH, or apt-get.
fn ensure_redis() -> Result<(), String> {
    let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_owned());
    if succeeds(&bin, &["--version"]) {
        return Ok(());
    }
    apt_install(
        &["redis-server"],
        &format!(
            "`{bin}` was not found; the tests and examples run private redis-server processes"
        ),
    )
    .map_err(|e| {
        format!("{e} (elsewhere: `brew install redis`, say), or set REDIS_SERVER_BIN to its path")
    })?;
    // The package may start a service on 6379; the tests never use it, they start their own.
    if succeeds("redis-server", &["--version"]) {
        Ok(())
    } else {
        Err("redis-server still not found after installing it".to_owned())
    }
}

/// tests/engine/python_interop.rs runs the Python article's lock with redis-py, from a virtual
/// environment in `<target dir>/tmp/python-venv` (the test finds it through cargo's
/// `CARGO_TARGET_TMPDIR`). The environment sees the system's packages, so a redis-py installed
/// there (Debian's python3-redis) is used as it is; otherwise pip installs redis-py into the
/// environment, never into the system's Python. apt-get is asked only for `python3` itself, or
/// for Debian's `python3-venv` when `python3 -m venv` cannot make an environment.
fn ensure_python_redis() -> Result<(), String> {
    let venv = python_venv()?;
    let python = venv.join("bin").join("python3");
    let python = python
        .to_str()
        .ok_or("the target directory's path is not UTF-8")?;
    let venv = venv
        .to_str()
        .ok_or("the target directory's path is not UTF-8")?;
    if succeeds(python, &["-c", "import redis"]) {
        return Ok(());
    }
    let by_hand = format!(
        "tests/engine/python_interop.rs needs redis-py in {venv} (`python3 -m venv \
         --system-site-packages {venv} && {python} -m pip install redis`) or in python3 itself \
         (Debian: `apt-get install python3-redis`)"
    );
    if !succeeds("python3", &["--version"]) {
        apt_install(
            &["python3", "python3-venv"],
            "`python3` was not found, and tests/engine/python_interop.rs runs Python workers with redis-py",
        )
        .map_err(|e| format!("{e}; {by_hand}"))?;
    }
    if !succeeds(python, &["-m", "pip", "--version"]) {
        eprintln!("xtask: making the Python virtual environment {venv} for redis-py");
        let make = || {
            run(
                "python3",
                &["-m", "venv", "--clear", "--system-site-packages", venv],
            )
        };
        if make().is_err() || !succeeds(python, &["-m", "pip", "--version"]) {
            // Debian's python3 makes environments with pip only with its python3-venv package.
            apt_install(
                &["python3-venv"],
                "`python3 -m venv` could not make a virtual environment with pip (Debian ships \
                 that part of Python as python3-venv)",
            )
            .and_then(|()| make())
            .map_err(|e| format!("{e}; {by_hand}"))?;
        }
    }
    if !succeeds(python, &["-c", "import redis"]) {
        eprintln!("xtask: installing redis-py into {venv} with pip");
        run(python, &["-m", "pip", "install", "--quiet", "redis"])
            .map_err(|e| format!("{e}; {by_hand}"))?;
    }
    if succeeds(python, &["-c", "import redis"]) {
        Ok(())
    } else {
        Err(format!(
            "{python} still cannot import redis after `pip install redis`; {by_hand}"
        ))
    }
}

/// `<target dir>/tmp/python-venv`: under cargo's `CARGO_TARGET_TMPDIR` of the integration tests,
/// whatever the target directory is (`CARGO_TARGET_DIR`, `build.target-dir`).
fn python_venv() -> Result<PathBuf, String> {
    let out = Command::new("cargo")
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    let json = String::from_utf8_lossy(&out.stdout);
    let dir = json_string(&json, "target_directory")
        .ok_or("cargo metadata did not name the target directory")?;
    Ok(PathBuf::from(dir).join("tmp").join("python-venv"))
}

/// The string value of the first `"key":"..."` in `json` (cargo metadata's compact output).
fn json_string(json: &str, key: &str) -> Option<String> {
    let start = json.find(&format!("\"{key}\":\""))? + key.len() + 4;
    let mut value = String::new();
    let mut chars = json[start..].chars();
    loop {
        match chars.next()? {
            '"' => return Some(value),
            '\\' => match chars.next()? {
                'n' => value.push('\n'),
                't' => value.push('\t'),
                c => value.push(c),
            },
            c => value.push(c),
        }
    }
}

/// The server clock tests (`lock_testing::ServerClock`) compile a small C shim with `cc`.
fn ensure_c_compiler() -> Result<(), String> {
    if succeeds("cc", &["--version"]) {
        return Ok(());
    }
    apt_install(
        &["gcc"],
        "`cc` was not found, and the server clock tests compile a small C library with it",
    )?;
    if succeeds("cc", &["--version"]) {
        Ok(())
    } else {
        Err("cc still not found after installing gcc".to_owned())
    }
}

/// Whether `program args` runs and exits with success (its output is not shown).
fn succeeds(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Installs Debian packages with `apt-get install` (through sudo when not root), after saying
/// which and why. At a terminal it asks first; without one (CI) it goes ahead. Without apt-get it
/// says what to install instead.
fn apt_install(packages: &[&str], why: &str) -> Result<(), String> {
    let list = packages.join(" ");
    if !succeeds("apt-get", &["--version"]) {
        return Err(format!(
            "{why}: install {list} with your package manager (apt-get is not available)"
        ));
    }
    let sudo = if is_root() { "" } else { "sudo " };
    let how = format!("{sudo}apt-get install {list}");
    eprintln!("xtask: {why}.\nxtask: this installs the system package(s) {list}: `{how}`");
    if std::io::stdin().is_terminal() {
        eprint!("xtask: go ahead? [Y/n] ");
        let mut answer = String::new();
        std::io::stdin()
            .read_line(&mut answer)
            .map_err(|e| format!("cannot read the answer: {e}"))?;
        if answer.trim().to_lowercase().starts_with('n') {
            return Err(format!("{list} not installed: run `{how}` yourself"));
        }
    }
    let apt = |args: &[&str]| {
        let mut full: Vec<&str> = sudo.split_whitespace().collect();
        full.push("apt-get");
        full.extend_from_slice(args);
        run(full[0], &full[1..])
    };
    apt(&["update", "-q"])?;
    let mut install = vec!["install", "-y", "-q", "--no-install-recommends"];
    install.extend_from_slice(packages);
    apt(&install)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}
