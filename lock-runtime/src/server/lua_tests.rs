//! What the `.lua` files may spell: no key, channel or marker name (those come from
//! `model::keys` through KEYS and ARGV), and no positional `ARGV[n]` or `KEYS[n]` past the named
//! locals at the top of a script.

use std::path::{Path, PathBuf};

/// Redis commands, Redis and Lua type names and option words the scripts use.
const WORDS: &[&str] = &[
    "DEL",
    "EXISTS",
    "GET",
    "HDEL",
    "HEXISTS",
    "HGET",
    "HSET",
    "LASTSAVE",
    "PEXPIRE",
    "PTTL",
    "SET",
    "SETRANGE",
    "TIME",
    "TYPE",
    "ZADD",
    "ZRANGE",
    "ZREM",
    "ZREMRANGEBYSCORE",
    "ZSCORE",
    "hash",
    "string",
    "table",
    "none",
    "zset",
    "WRONGTYPE",
    "PX",
    "NX",
    "XX",
    "WITHSCORES",
    "-inf",
];

/// The text of the error messages the scripts return (`lua/lib/counter.lua`).
const MESSAGES: &[&str] = &[
    "holds a value of another type, not an integer counter",
    "holds ",
    ", not an integer counter",
    "is at ",
    ", at or above the largest fence (2^53 - 1): fences cannot go higher",
];

/// Whether `literal` is one Lua may spell: a word of [`WORDS`], a message of [`MESSAGES`], a
/// number (a flag such as `'0'`), the empty string (an argument left empty: none), or a format
/// or pattern that only reads numbers, words and whitespace (`%d`, `^(%S+) %d+$`, ` `).
fn allowed(literal: &str) -> bool {
    if WORDS.contains(&literal) || MESSAGES.contains(&literal) || literal.is_empty() {
        return true;
    }
    if literal.chars().all(|c| c.is_ascii_digit()) {
        return true;
    }
    let mut rest = literal.to_owned();
    for class in ["%d", "%S", "%s", "%w"] {
        rest = rest.replace(class, "");
    }
    rest.chars().all(|c| "^$()+*- ".contains(c))
}

/// The string literals of Lua source `code`, comments left out.
fn literals(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = code.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '-' if chars.peek() == Some(&'-') => {
                // A comment, to the end of its line.
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '\'' | '"' => {
                let mut literal = String::new();
                while let Some(d) = chars.next() {
                    match d {
                        '\\' => literal.extend(chars.next()),
                        d if d == c => break,
                        d => literal.push(d),
                    }
                }
                out.push(literal);
            }
            '[' if chars.peek() == Some(&'[') => {
                chars.next();
                let mut literal = String::new();
                while let Some(d) = chars.next() {
                    if d == ']' && chars.peek() == Some(&']') {
                        chars.next();
                        break;
                    }
                    literal.push(d);
                }
                out.push(literal);
            }
            _ => {}
        }
    }
    out
}

/// Every `.lua` file under `dir`.
fn lua_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(lua_files(&path));
        } else if path.extension().is_some_and(|e| e == "lua") {
            out.push(path);
        }
    }
    out.sort();
    out
}

fn lua_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/server/lua")
}

/// Whether `line` indexes `table` (`KEYS` or `ARGV`) by a number: `ARGV[7]`.
fn indexes_by_number(line: &str, table: &str) -> bool {
    let open = format!("{table}[");
    line.match_indices(&open).any(|(at, _)| {
        let rest = &line[at + open.len()..];
        rest.starts_with(|c: char| c.is_ascii_digit())
    })
}

#[test]
fn the_scripts_spell_no_name() {
    let files = lua_files(&lua_dir());
    assert!(files.len() >= 16, "{} .lua files", files.len());
    let mut seen = 0;
    for file in &files {
        let code = std::fs::read_to_string(file).unwrap();
        for literal in literals(&code) {
            assert!(
                allowed(&literal),
                "{}: the literal {literal:?} is a name or a marker: pass it in KEYS or ARGV \
                 (see `model/keys.rs`), or allow it here if it is none",
                file.display()
            );
            seen += 1;
        }
    }
    assert!(seen > 50, "only {seen} literals found");
}

#[test]
fn names_and_markers_are_refused() {
    for refused in [
        ":fence",
        ":waiters",
        ":state",
        ":released",
        "~",
        ";w=0",
        ";w=",
        "shared:",
        "permits:",
        ";grants=(%w+)$",
        ":permit:(%d+)$",
        "PUBLISH",
        "lock:",
    ] {
        assert!(!allowed(refused), "{refused:?}");
    }
    let code = "local a = 'GET' -- 'not this'\nlocal b = \"x\\\"y\" .. [[z]]";
    assert_eq!(literals(code), ["GET", "x\"y", "z"]);
}

#[test]
fn arguments_are_read_into_named_locals_at_the_top() {
    for file in lua_files(&lua_dir()) {
        let code = std::fs::read_to_string(&file).unwrap();
        let fragment = file.parent().is_some_and(|d| d.ends_with("lib"));
        // A script's top: up to its first blank line.
        let mut top = !fragment;
        for (n, line) in code.lines().enumerate() {
            top &= !line.trim().is_empty();
            for table in ["KEYS", "ARGV"] {
                if fragment {
                    assert!(
                        !line.contains(&format!("{table}[")),
                        "{}:{}: a fragment takes parameters, not {table}",
                        file.display(),
                        n + 1
                    );
                } else if !top {
                    assert!(
                        !indexes_by_number(line, table),
                        "{}:{}: {table}[n] past the named locals at the top",
                        file.display(),
                        n + 1
                    );
                }
            }
        }
    }
}
