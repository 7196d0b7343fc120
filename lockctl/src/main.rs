//! `lockctl`: who holds a lock, since when, and who waits; watch it change hands; release it by
//! force when its holder is gone for good (only while it is still the holder that was shown).
//!
//! The deployment comes from `--url`, `--cluster` or `--sentinel`, else from the same
//! environment as the process default locker (`LOCK_REDIS_CLUSTER`, `LOCK_REDIS_SENTINELS` +
//! `LOCK_REDIS_SENTINEL_MASTER`, `LOCK_REDIS_URL`, `REDIS_URL`; see `LockerBuilder::from_env`).

mod render;
mod target;

use std::process::ExitCode;
use std::time::Duration;

use lock_runtime::{Holding, LockInfo, Locker};
use tokio::time::Instant;

use target::{Flags, Source, Target};

const USAGE: &str = "\
usage: lockctl [SERVER] [--prefix P] [--json] <command>

commands:
  list [PATTERN]                    locks held now whose names match PATTERN (glob, default *),
                                    with their holders and how long they have held them
  inspect NAME                      holder (host, pid, label), held since, fence, time left,
                                    waiters; every holder of a shared hold (with its fence) or
                                    of a lock's permits (permit i of N)
  watch NAME [--for D] [--every D]  print each change of holder and waiters as it happens
  release NAME --force [--token T]  delete the key, only if it still holds the value shown
                                    (or, with --token, the holder with that token); of a lock
                                    with several permits held, free the one --token names

SERVER (a flag wins over the environment; give one kind):
  --url URL                         one server; several --url (or URL,URL..) for Redlock
  --cluster URL[,URL..]             a Redis Cluster, from some of its nodes
  --sentinel URL[,URL..] --master NAME
                                    the primary these Sentinels name for NAME
Without a flag: LOCK_REDIS_CLUSTER, or LOCK_REDIS_SENTINELS with LOCK_REDIS_SENTINEL_MASTER,
or LOCK_REDIS_URL / REDIS_URL. With none of them, list, inspect and watch read
redis://127.0.0.1:6379 (and say so on stderr); release --force refuses.

Durations: 500ms, 2s, 1m.

exit codes:
  0  done
  1  failed (Redis unreachable or erroring, bad set-up)
  2  usage error, or release refused for want of --force or of a server named
  3  refused: the holder changed, nothing was deleted";

/// Exit codes: 0 done, 1 failed (Redis, bad set-up), 2 usage, 3 refused (the holder changed).
const USAGE_ERROR: u8 = 2;
const REFUSED: u8 = 3;

struct Args {
    target: Option<Target>,
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

/// The options of `watch` and `release`, read wherever they stand on the line.
struct CommandOptions {
    limit: Option<Duration>,
    every: Duration,
    force: bool,
    token: Option<String>,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let (mut prefix, mut json, mut flags) = (None, false, Flags::default());
    let mut positional = Vec::new();
    let mut options = CommandOptions {
        limit: None,
        every: Duration::from_millis(100),
        force: false,
        token: None,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |what: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{arg} needs {what}"))
        };
        if flags.take(arg, &mut value)? {
            continue;
        }
        match arg.as_str() {
            "--json" => json = true,
            "--force" => options.force = true,
            "--prefix" => prefix = Some(value("a key prefix")?),
            "--token" => options.token = Some(value("a token")?),
            "--for" => options.limit = Some(duration(&value("a duration")?)?),
            "--every" => options.every = duration(&value("a duration")?)?,
            "-h" | "--help" => return Err(String::new()),
            a if a.starts_with("--") => return Err(format!("unknown option {a}")),
            _ => positional.push(arg.clone()),
        }
    }
    Ok(Args {
        target: flags.target()?,
        prefix,
        json,
        command: command(positional, options)?,
    })
}

/// The command the positional arguments name.
fn command(positional: Vec<String>, options: CommandOptions) -> Result<Command, String> {
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
            limit: options.limit,
            every: options.every,
        },
        Some("release") => Command::Release {
            name: positional.next().ok_or("release needs a lock NAME")?,
            force: options.force,
            token: options.token,
        },
        Some(other) => return Err(format!("unknown command `{other}`")),
        None => return Err("no command given".to_owned()),
    };
    if let Some(extra) = positional.next() {
        return Err(format!("unexpected argument `{extra}`"));
    }
    Ok(command)
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
    let source = Source::pick(args.target, target::env_var);
    if source == Source::Local {
        if matches!(args.command, Command::Release { force: true, .. }) {
            // Deleting a lock on whatever server happens to listen locally could break
            // someone else's lock: a forced release acts only where it is told to.
            eprintln!(
                "lockctl: release --force needs the server named: pass --url (or --cluster, \
                 --sentinel) or set LOCK_REDIS_URL; nothing was deleted"
            );
            return Ok(ExitCode::from(USAGE_ERROR));
        }
        eprintln!(
            "lockctl: no server named (--url, --cluster, --sentinel, LOCK_REDIS_URL, REDIS_URL, \
             LOCK_REDIS_CLUSTER, LOCK_REDIS_SENTINELS): using {}",
            target::LOCAL
        );
    }
    let mut builder = source.builder()?;
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
    let mut last: Option<Option<(Vec<String>, Vec<String>)>> = None;
    loop {
        let info = locker.inspect(name).await?;
        // Every holder's value (a lock with permits or a shared hold has several).
        let now = info.as_ref().map(|i| {
            let mut values = vec![i.value.clone()];
            values.extend(i.holders.iter().map(|h| h.value.clone()));
            (values, i.waiters.iter().map(|w| w.id.clone()).collect())
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
    let holding = match chosen(&info, token) {
        Ok(holding) => holding,
        Err(refusal) => return Ok(refuse(name, &info, refusal, json)),
    };
    let released = if holding.shared {
        format!(
            "took {} out of the shared holders (the others keep the lock; the last one out \
             releases it)",
            render::holding_who(holding)
        )
    } else if render::several(&info) {
        format!(
            "freed {}, held by {}",
            render::holding_mode(&info, holding),
            render::holding_who(holding)
        )
    } else {
        format!("deleted the key held by {}", render::holder_text(&info))
    };
    if locker.force_release(name, &holding.value).await? {
        let message = format!(
            "{released}; its waiters were woken, and the holder, if it still runs, learns at its \
             next renewal that it lost the lock"
        );
        println!(
            "{}",
            render::outcome(name, "released", &message, Some(&info), json)
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

/// Why `release --force` does not release.
enum Refusal {
    /// `--token` names no holder of the lock now.
    Changed(String),
    /// Several hold the lock and no `--token` says which.
    Which,
}

/// The holder that `release` releases: the one `token` names (its full value, or its token),
/// or, without a token, the only one.
fn chosen<'a>(info: &'a LockInfo, token: Option<&str>) -> Result<&'a Holding, Refusal> {
    let holding = match token {
        Some(token) => info
            .holders
            .iter()
            .find(|h| h.value == token || h.holder.as_ref().is_some_and(|h| h.token == token))
            .ok_or_else(|| Refusal::Changed(token.to_owned()))?,
        None => match info.holders.as_slice() {
            [only] => only,
            _ => return Err(Refusal::Which),
        },
    };
    Ok(holding)
}

/// Says why nothing was released; the exit code.
fn refuse(name: &str, info: &LockInfo, refusal: Refusal, json: bool) -> ExitCode {
    let holders = render::holder_text(info);
    let (message, code) = match refusal {
        Refusal::Changed(token) => (
            format!(
                "the holder changed: it is now {holders}, not the one with token {token}; \
                 nothing was deleted"
            ),
            REFUSED,
        ),
        Refusal::Which => (
            format!(
                "it is held by {holders}; name the one to release with --token; nothing was \
                 deleted"
            ),
            USAGE_ERROR,
        ),
    };
    println!(
        "{}",
        render::outcome(name, "refused", &message, Some(info), json)
    );
    ExitCode::from(code)
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
        let a = args("--url redis://a:1 --url redis://b:1 list").unwrap();
        assert_eq!(
            a.target,
            Some(Target::Servers(vec![
                "redis://a:1".into(),
                "redis://b:1".into()
            ]))
        );
        let a = args("inspect job --sentinel redis://s:26379 --master m").unwrap();
        assert!(matches!(a.target, Some(Target::Sentinel { master, .. }) if master == "m"));
        for bad in [
            "",
            "inspect",
            "frobnicate",
            "list a b",
            "watch j --for soon",
            "list --nope",
            "list --url",
            "--url redis://a:1 --cluster redis://b:1 list",
            "--sentinel redis://s:1 list",
        ] {
            assert!(args(bad).is_err(), "{bad}");
        }
        assert_eq!(duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(duration("1m"), Ok(Duration::from_secs(60)));
    }
}
