//! `lockctl` against private redis-servers: the holder it shows is the process that holds the
//! lock, and since when; `--url` names the server over the environment; `release --force`
//! refuses when the holder changed in between, or when no server is named; `watch` shows a
//! hand-off as it happens.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use lock_runtime::{LockOptions, Locker};
use lock_testing::RedisServer;

const CHILD: &str = "LOCKCTL_TEST_CHILD";

/// `lockctl` with `args`, in an environment that names no server.
fn lockctl_bare(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockctl"));
    command.args(args);
    for var in lock_runtime::ENV_VARS {
        command.env_remove(var);
    }
    command
}

/// `lockctl` with `args`, on the server `LOCK_REDIS_URL` names.
fn lockctl(url: &str, args: &[&str]) -> Output {
    lockctl_bare(args)
        .env("LOCK_REDIS_URL", url)
        .output()
        .expect("lockctl runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value of `"field":` in a JSON line (enough for these flat checks).
fn json_field<'a>(json: &'a str, field: &str) -> Option<&'a str> {
    let at = json.find(&format!("\"{field}\":"))? + field.len() + 3;
    let rest = &json[at..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    Some(rest[..end].trim_matches('"'))
}

/// The whole seconds in the first `held 12s` of `text`.
fn held_secs(text: &str) -> u64 {
    let at = text.find("held ").expect("a hold time") + 5;
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    assert!(text[at + digits.len()..].starts_with("s "), "{text}");
    digits.parse().unwrap()
}

/// A locker on `url` whose leases carry `label` in their value.
async fn labelled(url: &str, label: &str) -> Locker {
    Locker::builder()
        .url(url)
        .label(label)
        .connect()
        .await
        .unwrap()
}

/// In a child process (this test binary run again): holds the lock until stdin closes.
#[test]
fn holder_child() {
    let Ok(spec) = std::env::var(CHILD) else {
        return; // Not a child: nothing to do.
    };
    let mut parts = spec.splitn(3, ' ');
    let (url, name, label) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let locker = labelled(url, label).await;
        let lease = locker
            .acquire(name, &LockOptions::new(Duration::from_secs(30)))
            .await
            .unwrap();
        println!("HELD {}", lease.token());
        std::io::stdout().flush().unwrap();
        // Until the parent closes our stdin.
        let _ =
            tokio::task::spawn_blocking(|| std::io::stdin().read_line(&mut String::new())).await;
        lease.release().await.unwrap();
    });
}

/// Starts a child process that holds `name`; returns it once it holds, with the value it holds.
fn spawn_holder(url: &str, name: &str, label: &str) -> (Child, String) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "holder_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD, format!("{url} {name} {label}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let value = loop {
        let line = lines.next().expect("the child reports").unwrap();
        // libtest prints the test's name on the same line first.
        if let Some(at) = line.find("HELD ") {
            break line[at + 5..].trim().to_owned();
        }
    };
    // Keep reading what it prints after, so that it never writes to a closed pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (child, value)
}

#[test]
fn the_holder_shown_is_the_child_process_that_holds_it() {
    let server = RedisServer::start();
    let url = server.url();
    let (mut child, value) = spawn_holder(&url, "nightly-report", "billing");
    let pid = child.id().to_string();

    let out = lockctl(&url, &["--json", "inspect", "nightly-report"]);
    assert!(out.status.success(), "{out:?}");
    let json = stdout(&out);
    assert_eq!(json_field(&json, "pid"), Some(pid.as_str()), "{json}");
    assert_eq!(json_field(&json, "label"), Some("billing"), "{json}");
    assert_eq!(json_field(&json, "state"), Some("held"), "{json}");
    assert_eq!(json_field(&json, "value"), Some(value.as_str()), "{json}");
    let ttl: u64 = json_field(&json, "ttl_left_ms").unwrap().parse().unwrap();
    assert!(ttl > 20_000 && ttl <= 30_000, "{json}");

    let text = stdout(&lockctl(&url, &["inspect", "nightly-report"]));
    assert!(text.contains(&format!("pid {pid} (billing)")), "{text}");
    let listed = stdout(&lockctl(&url, &["list"]));
    assert!(
        listed.contains("nightly-report") && listed.contains(&format!("pid {pid}")),
        "{listed}"
    );
    let free = stdout(&lockctl(&url, &["inspect", "other"]));
    assert!(free.contains("free"), "{free}");

    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    let after = stdout(&lockctl(&url, &["inspect", "nightly-report"]));
    assert!(after.contains("free"), "{after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_flag_shows_the_holder_and_how_long_it_has_held() {
    let server = RedisServer::start();
    let url = server.url();
    let locker = labelled(&url, "nightly").await;
    let lease = locker
        .acquire("report", &LockOptions::new(Duration::from_secs(30)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let pid = std::process::id().to_string();
    // The flag wins over an environment that names a server where nothing listens.
    let run = |args: &[&str]| {
        let mut line = vec!["--url", url.as_str()];
        line.extend_from_slice(args);
        lockctl_bare(&line)
            .env("LOCK_REDIS_URL", "redis://127.0.0.1:1/")
            .output()
            .unwrap()
    };

    let out = run(&["list"]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(text.contains(&format!("pid {pid} (nightly)")), "{text}");
    assert!(
        held_secs(&text) >= 1 && text.contains("s (since 20"),
        "{text}"
    );
    assert!(out.stderr.is_empty(), "{out:?}");

    let inspected = stdout(&run(&["inspect", "report"]));
    assert!(inspected.contains("\nheld      "), "{inspected}");
    assert!(
        held_secs(&inspected.replace("held      ", "held ")) >= 1,
        "{inspected}"
    );

    let json = stdout(&run(&["--json", "list"]));
    assert_eq!(json_field(&json, "label"), Some("nightly"), "{json}");
    assert_eq!(json_field(&json, "pid"), Some(pid.as_str()), "{json}");
    let field = |f: &str| -> u128 { json_field(&json, f).unwrap().parse().unwrap() };
    let since_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        - field("held_for_ms");
    let (held_for, held_since) = (field("held_for_ms"), field("held_since_ms"));
    assert!((1000..10_000).contains(&held_for), "{json}");
    assert!(since_ms.abs_diff(held_since) < 2000, "{json}");
    lease.release().await.unwrap();
    let json = stdout(&run(&["--json", "inspect", "report"]));
    assert_eq!(json_field(&json, "held"), Some("false"), "{json}");
}

/// A lock taken uncontended has its fence written to the counter at its release: `inspect` says
/// so rather than that no fence was recorded, and after an earlier hold, that the holder's is
/// the one recorded or a higher one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_says_where_the_holders_fence_is() {
    let server = RedisServer::start();
    let url = server.url();
    let locker = Locker::connect(&url).await.unwrap();
    let opts = LockOptions::new(Duration::from_secs(30));
    let fence_line = |text: &str| {
        let line = text
            .lines()
            .find(|l| l.starts_with("fence "))
            .map(str::to_owned);
        line.unwrap_or_else(|| panic!("no fence line: {text}"))
    };

    let first = locker.acquire("fenced", &opts).await.unwrap();
    assert!(first.fence() > 0);
    let text = stdout(&lockctl(&url, &["inspect", "fenced"]));
    assert_eq!(
        fence_line(&text),
        "fence     the holder's is recorded at its release; none is recorded before it"
    );
    let recorded = first.fence();
    first.release().await.unwrap();

    let second = locker.acquire("fenced", &opts).await.unwrap();
    assert!(second.fence() > recorded);
    let text = stdout(&lockctl(&url, &["inspect", "fenced"]));
    assert_eq!(
        fence_line(&text),
        format!(
            "fence     {recorded} last recorded; the holder's is {recorded}, or a higher one its \
             release records"
        )
    );
    second.release().await.unwrap();
}

#[test]
fn release_force_without_a_server_named_refuses() {
    let out = lockctl_bare(&["release", "ledger", "--force"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--url") && err.contains("LOCK_REDIS_URL"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "{out:?}");
}

#[test]
fn conflicting_server_flags_are_a_usage_error() {
    let out = lockctl_bare(&[
        "--url",
        "redis://127.0.0.1:1/",
        "--cluster",
        "redis://127.0.0.1:2/",
        "list",
    ])
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--url and --cluster"), "{err}");
    let help = stdout(&lockctl_bare(&["--help"]).output().unwrap());
    assert!(
        help.contains("exit codes") && help.contains("3  refused"),
        "{help}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_force_refuses_when_the_holder_changed() {
    let server = RedisServer::start();
    let url = server.url();
    let opts = LockOptions::new(Duration::from_secs(30));
    let a = labelled(&url, "a").await;
    let b = labelled(&url, "b").await;
    let first = a.acquire("ledger", &opts).await.unwrap();
    let shown = stdout(&lockctl(&url, &["--json", "inspect", "ledger"]));
    let token_a = json_field(&shown, "token").unwrap().to_owned();

    // Without --force: refused, untouched.
    let out = lockctl(&url, &["release", "ledger"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--force"),
        "{out:?}"
    );
    assert!(first.is_held());

    // The holder changes between the operator's look and the release.
    first.release().await.unwrap();
    // Renewed every second: it learns of the forced release soon.
    let second = b
        .acquire("ledger", &LockOptions::new(Duration::from_secs(3)))
        .await
        .unwrap();
    let out = lockctl(&url, &["release", "ledger", "--force", "--token", &token_a]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(stdout(&out).contains("holder changed"), "{out:?}");
    let key = b.key_of("ledger");
    let mut raw = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let value: Option<String> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(value.as_deref(), Some(second.token()), "B's key untouched");

    // With B's token: deleted, and B finds out at its next renewal.
    let token_b = second.token().split(';').next().unwrap().to_owned();
    let out = lockctl(
        &url,
        &[
            "--json", "release", "ledger", "--force", "--token", &token_b,
        ],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        json_field(&stdout(&out), "outcome"),
        Some("released"),
        "{out:?}"
    );
    let value: Option<String> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(value, None);
    let reason = tokio::time::timeout(Duration::from_secs(5), second.lost())
        .await
        .unwrap();
    assert_eq!(reason, lock_runtime::LostReason::NotOwner);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_shows_a_hand_off() {
    let server = RedisServer::start();
    let url = server.url();
    let first = labelled(&url, "first").await;
    let second = labelled(&url, "second").await;
    let held = first
        .acquire("handoff", &LockOptions::new(Duration::from_secs(30)))
        .await
        .unwrap();
    let mut watch = lockctl_bare(&[
        "watch", "handoff", "--for", "20s", "--every", "20ms", "--url", &url,
    ])
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let out = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let _ = tx.send(line.unwrap());
        }
    });
    let next = async |rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>| {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .unwrap()
            .unwrap()
    };
    assert!(next(&mut rx).await.contains("(first)"));
    // A waiter queues behind the holder: watch shows it waiting.
    let waiter = tokio::spawn(async move {
        let opts = LockOptions::new(Duration::from_secs(30)).with_wait(Duration::from_secs(10));
        second.acquire("handoff", &opts).await.unwrap()
    });
    let line = next(&mut rx).await;
    assert!(
        line.contains("(first)")
            && line.contains("held ")
            && line.contains("waiting: [")
            && line.contains("(second)]"),
        "{line}"
    );
    held.release().await.unwrap();
    let lease = waiter.await.unwrap();
    // The hand-off shows, ending with the second holder.
    let mut seen = Vec::new();
    while !seen
        .last()
        .is_some_and(|l: &String| l.contains("(second)") && l.contains("waiting: []"))
    {
        seen.push(next(&mut rx).await);
    }
    lease.release().await.unwrap();
    assert!(next(&mut rx).await.contains("free"), "{seen:?}");
    watch.kill().unwrap();
    let _ = watch.wait();
}

/// A lock with 3 permits, 2 held: `inspect` and `list` show each holder as `permit i of 3`, and
/// `release --force` frees the one `--token` names (without it, it asks which). A shared hold,
/// written as the engine keeps it: each live shared holder with its fence (a dead one, whose
/// lease ran out, is not shown), and `release --force --token` takes one out of the holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_holder_is_shown_with_its_mode() {
    let server = RedisServer::start();
    let url = server.url();
    let o = LockOptions::new(Duration::from_secs(30)).with_permits(3);
    let (a, b) = (labelled(&url, "a").await, labelled(&url, "b").await);
    let first = a.acquire("pool", &o).await.unwrap();
    let second = b.acquire("pool", &o).await.unwrap();
    let pid = std::process::id();

    let text = stdout(&lockctl(&url, &["inspect", "pool"]));
    assert!(text.contains("holders   2 of 3 permits held"), "{text}");
    for (i, label, lease) in [(0, "a", &first), (1, "b", &second)] {
        let line = format!("  - permit {i} of 3  vm pid {pid} ({label})  held ");
        let at = text
            .find(&line.replace("vm", &host_of(lease.token())))
            .unwrap_or_else(|| panic!("{line} in {text}"));
        let token = lease.token().split(';').next().unwrap();
        assert!(
            text[at..].lines().next().unwrap().ends_with(token),
            "{text}"
        );
    }
    let listed = stdout(&lockctl(&url, &["list"]));
    assert_eq!(listed.matches("pool").count(), 1, "{listed}");
    assert!(
        listed.starts_with("pool  2 of 3 permits held  0 waiting\n"),
        "{listed}"
    );
    assert!(listed.contains("  - permit 1 of 3  "), "{listed}");
    let json = stdout(&lockctl(&url, &["--json", "inspect", "pool"]));
    assert_eq!(json_field(&json, "mode"), Some("permits"), "{json}");
    assert_eq!(json_field(&json, "permits"), Some("3"), "{json}");
    assert_eq!(
        json.matches("{\"mode\":\"permit\",\"permit\":").count(),
        2,
        "{json}"
    );

    // Two hold it: release asks which, then frees the one named.
    let out = lockctl(&url, &["release", "pool", "--force"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stdout(&out).contains("--token"), "{out:?}");
    assert!(first.is_held() && second.is_held());
    let token = second.token().split(';').next().unwrap();
    let out = lockctl(&url, &["release", "pool", "--force", "--token", token]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout(&out).contains("freed permit 1 of 3, held by"),
        "{out:?}"
    );
    let left = stdout(&lockctl(&url, &["inspect", "pool"]));
    assert!(left.contains("holders   1 of 3 permits held"), "{left}");
    assert!(!left.contains("permit 1 of 3"), "{left}");
    first.release().await.unwrap();

    shared_holders_are_shown_with_their_fences(&url, &a, &b).await;
}

/// The host name in a holder's value (`;h=<host>;`).
fn host_of(value: &str) -> String {
    let at = value.find(";h=").unwrap() + 3;
    value[at..].split(';').next().unwrap().to_owned()
}

async fn shared_holders_are_shown_with_their_fences(url: &str, a: &Locker, b: &Locker) {
    let mut values = Vec::new();
    for locker in [a, b] {
        let lease = locker
            .acquire("once", &LockOptions::new(Duration::from_secs(30)))
            .await
            .unwrap();
        values.push(lease.token().to_owned());
        lease.release().await.unwrap();
    }
    let mut raw = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let key = a.key_of("doc");
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut raw).await.unwrap();
    let now_ms = secs * 1000 + micros / 1000;
    let mut pipe = redis::pipe();
    pipe.cmd("SET")
        .arg(&key)
        .arg(format!("shared:{}", values[0]))
        .arg("PX")
        .arg(30_000)
        .cmd("ZADD")
        .arg(format!("{key}:readers"))
        .arg(now_ms + 30_000)
        .arg(format!("{} 41", values[0]))
        .arg(now_ms + 30_000)
        .arg(format!("{} 42", values[1]))
        .arg(now_ms - 5_000)
        .arg(format!("{} 40", values[1]));
    let () = pipe.query_async(&mut raw).await.unwrap();

    let text = stdout(&lockctl(url, &["inspect", "doc"]));
    assert!(text.contains("state     shared\n"), "{text}");
    assert!(text.contains("holders   shared by 2\n"), "{text}");
    assert!(text.contains(" (a)  fence 41  held "), "{text}");
    assert!(text.contains(" (b)  fence 42  held "), "{text}");
    assert_eq!(text.matches("  - shared  ").count(), 2, "{text}");
    let listed = stdout(&lockctl(url, &["list", "doc*"]));
    assert!(listed.starts_with("doc  shared by 2  ttl "), "{listed}");
    let json = stdout(&lockctl(url, &["--json", "inspect", "doc"]));
    assert_eq!(json_field(&json, "mode"), Some("shared"), "{json}");
    assert!(
        json.contains("\"mode\":\"shared\",\"permit\":null"),
        "{json}"
    );
    assert!(json.contains("\"fence\":42,"), "{json}");
    assert!(!text.contains("fence 40"), "a dead holder is shown: {text}");
    // Two hold it: release asks which, once; then takes the one named out of the holders.
    let out = lockctl(url, &["release", "doc", "--force"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stdout(&out).contains("--token"), "{out:?}");
    let token = values[1].split(';').next().unwrap();
    let out = lockctl(url, &["release", "doc", "--force", "--token", token]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout(&out).contains("out of the shared holders (the others keep the lock"),
        "{out:?}"
    );
    let left = stdout(&lockctl(url, &["inspect", "doc"]));
    assert!(left.contains("holders   shared by 1\n"), "{left}");
    assert!(left.contains(" (a)  fence 41  held "), "{left}");
    // The last one out releases the lock.
    let out = lockctl(url, &["release", "doc", "--force"]);
    assert!(out.status.success(), "{out:?}");
    let gone: bool = redis::cmd("EXISTS")
        .arg(&key)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(!gone, "the shared hold's key is left after its last holder");
}
