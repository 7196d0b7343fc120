//! `lockctl`: who holds a lock, since when, and who waits; watch it change hands; release it by
//! force when its holder is gone for good (only while it is still the holder that was shown).
//!
//! The deployment comes from the same environment as the process default locker
//! (`LOCK_REDIS_CLUSTER`, `LOCK_REDIS_SENTINELS` + `LOCK_REDIS_SENTINEL_MASTER`,
//! `LOCK_REDIS_URL`, `REDIS_URL`; see `LockerBuilder::from_env`).

mod render;

use std::process::ExitCode;
use std::time::Duration;

use lock_runtime::{LockInfo, Locker, LockerBuilder};
use tokio::time::Instant;

const USAGE: &str = "\
usage: lockctl [--prefix P] [--json] <command>

commands:
  list [PATTERN]                    locks held now whose names match PATTERN (glob, default *)
  inspect NAME                      holder (host, pid, label), fence, time left, waiters
  watch NAME [--for D] [--every D]  print each change of holder and waiters as it happens
  release NAME --force [--token T]  delete the key, only if it still holds the value shown
                                    (or, with --token, the holder with that token)

The deployment comes from LOCK_REDIS_CLUSTER, or LOCK_REDIS_SENTINELS with
LOCK_REDIS_SENTINEL_MASTER, or LOCK_REDIS_URL / REDIS_URL (default redis://127.0.0.1:6379).
Durations: 500ms, 2s, 1m.";

/// Exit codes: 0 done, 1 failed (Redis, bad set-up), 2 usage, 3 refused (the holder changed).
const USAGE_ERROR: u8 = 2;
const REFUSED: u8 = 3;

struct Args {
    prefix: Option<String>,
    json: bool,
    command: Command,
}

enum Command {
    List {
        pattern: String,
    },
    Inspect {
        name: String,
    },
    Watch {
        name: String,
        limit: Option<Duration>,
        every: Duration,
    },
    Release {
        name: String,
        force: bool,
        token: Option<String>,
    },
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut prefix = None;
    let mut json = false;
    let mut positional = Vec::new();
    let (mut limit, mut every, mut force, mut token) =
        (None, Duration::from_millis(100), false, None);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |what: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{arg} needs {what}"))
        };
        match arg.as_str() {
            "--json" => json = true,
            "--force" => force = true,
            "--prefix" => prefix = Some(value("a key prefix")?),
            "--token" => token = Some(value("a token")?),
            "--for" => limit = Some(duration(&value("a duration")?)?),
            "--every" => every = duration(&value("a duration")?)?,
            "-h" | "--help" => return Err(String::new()),
            a if a.starts_with("--") => return Err(format!("unknown option {a}")),
            _ => positional.push(arg.clone()),
        }
    }
    let mut positional = positional.into_iter();
    let command = match positional.next().as_deref() {
        Some("list") => Command::List {
            pattern: positional.next().unwrap_or_else(|| "*".to_owned()),
        },
        Some("inspect") => Command::Inspect {
            name: positional.next().ok_or("inspect needs a lock NAME")?,
        },
        Some("watch") => Command::Watch {
            name: positional.next().ok_or("watch needs a lock NAME")?,
            limit,
            every,
        },
        Some("release") => Command::Release {
            name: positional.next().ok_or("release needs a lock NAME")?,
            force,
            token,
        },
        Some(other) => return Err(format!("unknown command `{other}`")),
        None => return Err("no command given".to_owned()),
    };
    if let Some(extra) = positional.next() {
        return Err(format!("unexpected argument `{extra}`"));
    }
    Ok(Args {
        prefix,
        json,
        command,
    })
}

/// `250ms`, `2s`, `1.5s`, `1m`.
fn duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("`{text}` is not a duration (like 500ms, 2s, 1m)");
    let (number, unit) = text
        .find(|c: char| c.is_ascii_alphabetic())
        .map_or((text, "s"), |i| text.split_at(i));
    let n: f64 = number.parse().map_err(|_| bad())?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| bad())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse(&args) {
        Ok(args) => args,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("lockctl: {e}\n\n{USAGE}");
            return ExitCode::from(USAGE_ERROR);
        }
    };
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("lockctl: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<ExitCode, lock_runtime::LockError> {
    let mut builder = LockerBuilder::from_env()?;
    if let Some(prefix) = &args.prefix {
        builder = builder.prefix(prefix.clone());
    }
    let locker = builder.connect().await?;
    let json = args.json;
    match args.command {
        Command::List { pattern } => {
            let locks = locker.list(&pattern).await?;
            println!("{}", render::list(&locks, json));
        }
        Command::Inspect { name } => {
            let info = locker.inspect(&name).await?;
            println!("{}", render::inspect(&name, info.as_ref(), json));
        }
        Command::Watch { name, limit, every } => watch(&locker, &name, limit, every, json).await?,
        Command::Release { name, force, token } => {
            return release(&locker, &name, force, token.as_deref(), json).await;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the lock's state, then one line per change of holder or waiters.
async fn watch(
    locker: &Locker,
    name: &str,
    limit: Option<Duration>,
    every: Duration,
    json: bool,
) -> Result<(), lock_runtime::LockError> {
    let began = Instant::now();
    let mut last: Option<Option<(String, Vec<String>)>> = None;
    loop {
        let info = locker.inspect(name).await?;
        let now = info.as_ref().map(|i| {
            (
                i.value.clone(),
                i.waiters.iter().map(|w| w.id.clone()).collect(),
            )
        });
        if last.as_ref() != Some(&now) {
            println!(
                "{}",
                render::change(name, began.elapsed(), info.as_ref(), json)
            );
            last = Some(now);
        }
        if limit.is_some_and(|l| began.elapsed() >= l) {
            return Ok(());
        }
        tokio::time::sleep(every).await;
    }
}

async fn release(
    locker: &Locker,
    name: &str,
    force: bool,
    token: Option<&str>,
    json: bool,
) -> Result<ExitCode, lock_runtime::LockError> {
    let Some(info) = locker.inspect(name).await? else {
        println!(
            "{}",
            render::outcome(name, "free", "not held; nothing to release", None, json)
        );
        return Ok(ExitCode::SUCCESS);
    };
    if !force {
        eprintln!(
            "lockctl: `{name}` is held ({}); release deletes another process's lock, and that \
             process may still be running its body. If you are sure it is gone for good, run \
             again with --force",
            render::holder_text(&info)
        );
        return Ok(ExitCode::from(USAGE_ERROR));
    }
    if let Some(token) = token
        && !holds(&info, token)
    {
        println!(
            "{}",
            render::outcome(
                name,
                "refused",
                &format!(
                    "the holder changed: it is now {}, not the one with token {token}; nothing was deleted",
                    render::holder_text(&info)
                ),
                Some(&info),
                json
            )
        );
        return Ok(ExitCode::from(REFUSED));
    }
    if locker.force_release(name, &info.value).await? {
        println!(
            "{}",
            render::outcome(
                name,
                "released",
                &format!(
                    "deleted the key held by {}; its waiters were woken, and the holder, if it \
                     still runs, learns at its next renewal that it lost the lock",
                    render::holder_text(&info)
                ),
                Some(&info),
                json
            )
        );
        Ok(ExitCode::SUCCESS)
    } else {
        println!(
            "{}",
            render::outcome(
                name,
                "refused",
                "the holder changed between reading and deleting; nothing was deleted",
                Some(&info),
                json
            )
        );
        Ok(ExitCode::from(REFUSED))
    }
}

/// Whether `token` names the lease in `info`: its full value, or its token.
fn holds(info: &LockInfo, token: &str) -> bool {
    info.value == token || info.holder.as_ref().is_some_and(|h| h.token == token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Result<Args, String> {
        parse(
            &line
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn arguments_parse_into_commands() {
        assert!(
            matches!(args("list").unwrap().command, Command::List { pattern } if pattern == "*")
        );
        let a = args("--json inspect nightly").unwrap();
        assert!(a.json && matches!(a.command, Command::Inspect { name } if name == "nightly"));
        let a = args("watch job --for 2s --every 50ms").unwrap();
        assert!(
            matches!(a.command, Command::Watch { limit: Some(l), every, .. }
            if l == Duration::from_secs(2) && every == Duration::from_millis(50))
        );
        let a = args("release job --force --token abc").unwrap();
        assert!(
            matches!(a.command, Command::Release { force: true, token: Some(t), .. } if t == "abc")
        );
        for bad in [
            "",
            "inspect",
            "frobnicate",
            "list a b",
            "watch j --for soon",
            "list --nope",
        ] {
            assert!(args(bad).is_err(), "{bad}");
        }
        assert_eq!(duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(duration("1m"), Ok(Duration::from_secs(60)));
    }
}
