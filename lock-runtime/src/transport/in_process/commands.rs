//! The plain commands the engine sends besides its scripts, run on the in-process keyspace: the
//! uncontended acquire (`SET .. NX PX .. GET`, `TIME`, `GET`), leaving a queue (`ZREM`,
//! `HDEL`), inspection (`GET`, `PTTL`, `ZRANGE`, `SCAN`) and the set-up checks.

use redis::{RedisResult, Value};

use super::{Keyspace, refused};

/// Runs the command `name` with `args`; a command the engine never sends is refused.
pub(super) fn run(keys: &mut Keyspace, name: &str, args: &[String]) -> RedisResult<Value> {
    let arg = |i: usize| args.get(i).map_or("", String::as_str);
    Ok(match name {
        "PING" => Value::Okay,
        "TIME" => {
            let (s, us) = keys.time();
            Value::Array(vec![bulk(&s.to_string()), bulk(&us.to_string())])
        }
        "GET" => keys.get(arg(0))?.map_or(Value::Nil, |v| bulk(&v)),
        "SET" => set(keys, args)?,
        "PTTL" => Value::Int(keys.pttl(arg(0))),
        "ZRANGE" => {
            let (start, stop) = (arg(1).parse().unwrap_or(0), arg(2).parse().unwrap_or(-1));
            let range = keys.zrange(arg(0), start, stop)?;
            let scores = arg(3).eq_ignore_ascii_case("WITHSCORES");
            Value::Array(
                range
                    .into_iter()
                    .flat_map(|(member, score)| {
                        let mut out = vec![bulk(&member)];
                        if scores {
                            out.push(bulk(&score.to_string()));
                        }
                        out
                    })
                    .collect(),
            )
        }
        "ZREM" => {
            keys.zrem(arg(0), arg(1))?;
            Value::Int(1)
        }
        "HDEL" => {
            keys.hdel(arg(0), arg(1))?;
            Value::Int(1)
        }
        "SCAN" => {
            // One batch: every key that matches.
            let pattern = arg(2).to_owned();
            let found = keys.keys(|k| glob(pattern.as_bytes(), k.as_bytes()));
            Value::Array(vec![
                bulk("0"),
                Value::Array(found.iter().map(|k| bulk(k)).collect()),
            ])
        }
        // Nothing here is evicted, and nothing is replicated.
        "CONFIG" => Value::Array(vec![bulk("maxmemory-policy"), bulk("noeviction")]),
        "INFO" => bulk("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n"),
        "WAIT" => Value::Int(0),
        "SCRIPT" => Value::Okay,
        #[cfg(test)]
        _ => set_up(keys, name, args)?,
        #[cfg(not(test))]
        _ => return Err(unknown(name)),
    })
}

/// The error of a command the engine never sends.
fn unknown(name: &str) -> redis::RedisError {
    refused(format!(
        "ERR unknown command `{name}` in the in-process server"
    ))
}

/// The commands the script tables set up keys and read them with.
#[cfg(test)]
fn set_up(keys: &mut Keyspace, name: &str, args: &[String]) -> RedisResult<Value> {
    use super::keyspace::Data;
    let arg = |i: usize| args.get(i).map_or("", String::as_str);
    Ok(match name {
        "FLUSHALL" => {
            keys.flush();
            Value::Okay
        }
        "TYPE" => Value::SimpleString(keys.type_of(arg(0)).to_owned()),
        "PEXPIRE" => {
            keys.pexpire(arg(0), arg(1).parse().unwrap_or(0));
            Value::Int(1)
        }
        "ZADD" => {
            for pair in args[1..].chunks(2) {
                keys.zadd(
                    arg(0),
                    pair[0].parse().unwrap_or(0.0),
                    &pair[1],
                    false,
                    false,
                )?;
            }
            Value::Int(1)
        }
        "HSET" => {
            for pair in args[1..].chunks(2) {
                keys.hset(arg(0), &pair[0], &pair[1])?;
            }
            Value::Int(1)
        }
        "HGETALL" => Value::Array(
            keys.hgetall(arg(0))?
                .into_iter()
                .flat_map(|(f, v)| [bulk(&f), bulk(&v)])
                .collect(),
        ),
        "RPUSH" => {
            keys.put(arg(0), Data::List);
            Value::Int(1)
        }
        _ => return Err(unknown(name)),
    })
}

/// `SET key value [NX] [PX ms] [GET]`.
fn set(keys: &mut Keyspace, args: &[String]) -> RedisResult<Value> {
    let (key, value) = (&args[0], &args[1]);
    let mut options = args[2..].iter();
    let (mut nx, mut px, mut get) = (false, None, false);
    while let Some(option) = options.next() {
        match option.to_ascii_uppercase().as_str() {
            "NX" => nx = true,
            "GET" => get = true,
            "PX" => px = options.next().and_then(|ms| ms.parse().ok()),
            _ => {}
        }
    }
    let old = keys.get(key)?;
    if !(nx && old.is_some()) {
        keys.set(key, value, px);
    }
    Ok(match (get, old, nx) {
        (true, Some(old), _) => bulk(&old),
        (true, None, _) => Value::Nil,
        (false, Some(_), true) => Value::Nil,
        (false, _, _) => Value::Okay,
    })
}

fn bulk(text: &str) -> Value {
    Value::BulkString(text.as_bytes().to_vec())
}

/// Whether `text` matches the glob `pattern` as Redis matches one: `*`, `?`, `[..]` (with
/// ranges and `^`), and `\` before a character taken as it is.
pub(crate) fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|skip| glob(rest, &text[skip..])),
        Some((b'?', rest)) => !text.is_empty() && glob(rest, &text[1..]),
        Some((b'[', rest)) => {
            let Some((&c, tail)) = text.split_first() else {
                return false;
            };
            let Some(close) = rest.iter().skip(1).position(|&b| b == b']').map(|p| p + 1) else {
                return c == b'[' && glob(rest, tail);
            };
            let (class, after) = (&rest[..close], &rest[close + 1..]);
            let (negated, class) = match class.split_first() {
                Some((b'^', class)) => (true, class),
                _ => (false, class),
            };
            in_class(class, c) != negated && glob(after, tail)
        }
        Some((b'\\', rest)) if !rest.is_empty() => {
            text.first() == Some(&rest[0]) && glob(&rest[1..], &text[1..])
        }
        Some((&p, rest)) => text.first() == Some(&p) && glob(rest, &text[1..]),
    }
}

/// Whether `c` is in the glob class `class` (the text between `[` and `]`).
fn in_class(class: &[u8], c: u8) -> bool {
    let mut i = 0;
    while i < class.len() {
        let b = if class[i] == b'\\' && i + 1 < class.len() {
            i += 1;
            class[i]
        } else {
            class[i]
        };
        if i + 2 < class.len() && class[i + 1] == b'-' {
            let (lo, hi) = (b.min(class[i + 2]), b.max(class[i + 2]));
            if (lo..=hi).contains(&c) {
                return true;
            }
            i += 3;
        } else {
            if b == c {
                return true;
            }
            i += 1;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn globs_match_as_redis_matches_them() {
        let m = |p: &str, t: &str| glob(p.as_bytes(), t.as_bytes());
        assert!(m("lock:{*}", "lock:{a:b}"));
        assert!(!m("lock:{*}", "lock:{a}:fence"));
        assert!(m("lock:{job?}", "lock:{job1}"));
        assert!(m("lock:{[ab]*}", "lock:{b1}"));
        assert!(!m("lock:{[^ab]*}", "lock:{b1}"));
        assert!(m("lock:{[a-c]}", "lock:{b}"));
        assert!(m("lock:\\{x\\}", "lock:{x}"));
        assert!(!m("lock:\\*", "lock:x"));
    }
}
