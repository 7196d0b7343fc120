//! A URL redis-rs will not take, explained in this crate's words: what in it is wrong, and what
//! to write instead.

use crate::LockError;
use crate::model::error::redact;

/// The schemes redis-rs reads: TCP, TLS, and a Unix socket.
const TCP: &[&str] = &["redis", "valkey"];
const TLS: &[&str] = &["rediss", "valkeys"];
const UNIX: &[&str] = &["unix", "redis+unix", "valkey+unix"];

const FORM: &str = "write it like redis://[user:password@]host:port[/db]";

/// A `Config` error for `url`, which redis-rs refused with `e` (whose words are used only for
/// what this crate does not look at itself).
pub(super) fn bad_url(url: &str, e: &redis::RedisError) -> LockError {
    let problem = problem(url, cfg!(feature = "tls"))
        .unwrap_or_else(|| format!("{}; {FORM}", e.detail().unwrap_or("it cannot be read")));
    LockError::config(
        "",
        format!("invalid Redis URL `{}`: {problem}", redact(url)),
    )
}

/// What is wrong with `url`, when this crate can tell, in a build with or without TLS.
fn problem(url: &str, tls: bool) -> Option<String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        // Echoed only without credentials in it.
        return Some(if url.contains(':') && !url.contains([' ', '@']) {
            format!("no scheme; write redis://{url}")
        } else if url.contains(':') && !url.contains(' ') {
            "no scheme; write redis:// before it".to_owned()
        } else {
            format!("not a URL; {FORM}")
        });
    };
    if TLS.contains(&scheme) && !tls {
        return Some(
            "this build has no TLS support: enable the `tls` feature of lock-runtime \
             (`lock-runtime = { version = \"..\", features = [\"tls\"] }`), or reach the server \
             over redis:// (e.g. through a TLS tunnel)"
                .to_owned(),
        );
    }
    if UNIX.contains(&scheme) {
        return None;
    }
    if !TCP.contains(&scheme) && !TLS.contains(&scheme) {
        return Some(format!(
            "`{scheme}://` is not a Redis scheme; use redis:// (rediss:// for TLS, unix:// for a \
             socket)"
        ));
    }
    tcp_problem(rest)
}

/// What is wrong with the part of a TCP URL after `redis://`.
fn tcp_problem(rest: &str) -> Option<String> {
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let (host, port) = match host_port.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((host, after)) => (host, after.strip_prefix(':')),
            None => {
                return Some(format!(
                    "`{host_port}` opens an IPv6 address with `[` but never closes it; write it \
                     like redis://[::1]:6379"
                ));
            }
        },
        None => match host_port.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        },
    };
    if host.is_empty() {
        return Some(format!("it names no host; {FORM}"));
    }
    if let Some(port) = port.filter(|p| !p.is_empty() && p.parse::<u16>().is_err()) {
        return Some(format!(
            "`{port}` is not a port number (1 to 65535); {FORM}"
        ));
    }
    let db = path.split(['?', '#']).next().unwrap_or_default();
    let db = db.strip_prefix('/').unwrap_or(db);
    if !db.is_empty() && db.parse::<u32>().is_err() {
        return Some(format!(
            "`/{db}` is not a database number; end the URL with /0 to /15 (or leave it out for 0)"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::problem;

    #[test]
    fn each_mistake_is_said_in_this_crates_words() {
        let cases = [
            ("127.0.0.1:6379", "no scheme; write redis://127.0.0.1:6379"),
            ("not a url", "not a URL; write it like redis://"),
            ("u:secret@h:6379", "no scheme; write redis:// before it"),
            (
                "http://127.0.0.1:1",
                "`http://` is not a Redis scheme; use redis://",
            ),
            ("redis://", "it names no host"),
            ("redis://:secret@", "it names no host"),
            (
                "redis://h:notaport",
                "`notaport` is not a port number (1 to 65535)",
            ),
            ("redis://h:99999", "`99999` is not a port number"),
            ("redis://h:6379/x", "`/x` is not a database number"),
            ("redis://[::1:6379", "`[::1:6379` opens an IPv6 address"),
        ];
        for (url, said) in cases {
            let got = problem(url, false).unwrap_or_default();
            assert!(got.starts_with(said), "{url}: {got}");
        }
        for url in [
            "redis://127.0.0.1:6379/2",
            "redis://u:p@h",
            "redis://[::1]:6379",
            "unix:///run/redis.sock",
            "rediss://h:6380",
        ] {
            assert_eq!(problem(url, true), None, "{url}");
        }
    }

    #[test]
    fn a_tls_url_without_tls_names_the_feature() {
        let said = problem("rediss://cache:6380", false).unwrap();
        assert!(said.contains("enable the `tls` feature"), "{said}");
        assert_eq!(problem("rediss://cache:6380", true), None);
    }
}
