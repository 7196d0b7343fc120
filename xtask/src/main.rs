//! Project tasks: `cargo xtask test` (everything CI runs), `cargo xtask example [name]`,
//! `cargo xtask bench`. Each installs `redis-server` first when it is missing.

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
                 setup    install what the tests need when missing (redis-server, cc, redis-py)"
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
    )
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
    // The one example with a dependency of its own (axum) has a feature for it, so that the
    // other examples never build it.
    if name == "http_handler" {
        args.extend(["--features", "http"]);
    }
    run("cargo", &args)
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    eprintln!("+ {program} {}", args.join(" "));
    let status = Command::new(program)
        .args(args)
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
    if Command::new(&bin)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok(());
    }
    eprintln!("xtask: `{bin}` not found; installing the Debian package redis-server");
    apt_install("redis-server").map_err(|e| {
        format!("{e} (e.g. `brew install redis`), or set REDIS_SERVER_BIN to its path")
    })?;
    // The package may start a service on 6379; the tests never use it, they start their own.
    if Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        Ok(())
    } else {
        Err("redis-server still not found after installing it".to_owned())
    }
}

/// tests/python_interop.rs runs the Python article's lock with redis-py: `python3` must import
/// `redis`. When it cannot: `python3` (and its pip) from apt-get if python3 is missing, then
/// `python3 -m pip install --quiet redis`; each step that cannot be done says what to do instead.
fn ensure_python_redis() -> Result<(), String> {
    let works = |args: &[&str]| {
        Command::new("python3")
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let imports = || works(&["-c", "import redis"]);
    if imports() {
        return Ok(());
    }
    let by_hand = "tests/python_interop.rs needs python3 with redis-py: install them with your \
                   package manager (Debian: `apt-get install python3 python3-redis`), or \
                   `python3 -m pip install redis`, and run this again";
    if !works(&["--version"]) {
        eprintln!(
            "xtask: `python3` not found; installing the Debian packages python3 and python3-pip"
        );
        apt_install("python3")
            .and_then(|()| apt_install("python3-pip"))
            .map_err(|e| format!("{e}; {by_hand}"))?;
    }
    if !works(&["-m", "pip", "--version"]) {
        eprintln!("xtask: python3 has no pip; installing the Debian package python3-pip");
        apt_install("python3-pip").map_err(|e| {
            format!(
                "{e}; python3 has no pip: `python3 -m ensurepip --upgrade` may bring it, or \
                 {by_hand}"
            )
        })?;
    }
    eprintln!("xtask: python3 cannot import redis (redis-py); installing it with pip");
    let pip = |extra: &[&str]| {
        let mut args = vec!["-m", "pip", "install", "--quiet", "redis"];
        args.extend_from_slice(extra);
        run("python3", &args)
    };
    // Debian's own python3 refuses system-wide pip installs unless told otherwise.
    if pip(&[]).is_err() {
        pip(&["--break-system-packages"]).map_err(|e| format!("{e}; {by_hand}"))?;
    }
    if imports() {
        Ok(())
    } else {
        Err(format!(
            "python3 still cannot import redis after `pip install redis`; {by_hand}"
        ))
    }
}

/// The server clock tests (`lock_testing::ServerClock`) compile a small C shim with `cc`.
fn ensure_c_compiler() -> Result<(), String> {
    let works = || {
        Command::new("cc")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if works() {
        return Ok(());
    }
    eprintln!("xtask: `cc` not found; installing the Debian package gcc");
    apt_install("gcc")?;
    if works() {
        Ok(())
    } else {
        Err("cc still not found after installing gcc".to_owned())
    }
}

/// `apt-get install -y <package>` (with sudo when not root), or a hint when there is no apt-get.
fn apt_install(package: &str) -> Result<(), String> {
    if Command::new("apt-get").arg("--version").output().is_err() {
        return Err(format!(
            "{package} is missing and apt-get is not available: install it with your package manager"
        ));
    }
    let sudo: &[&str] = if is_root() { &[] } else { &["sudo"] };
    let apt = |args: &[&str]| {
        let mut full: Vec<&str> = sudo.to_vec();
        full.push("apt-get");
        full.extend_from_slice(args);
        run(full[0], &full[1..])
    };
    apt(&["update", "-q"])?;
    apt(&["install", "-y", "-q", "--no-install-recommends", package])
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}
