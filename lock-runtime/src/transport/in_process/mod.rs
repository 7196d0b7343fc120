//! A server in this process (`Locker::in_memory`): the keys of its locks live in a
//! [`Keyspace`] here, and a request runs on it at once, with no connection. It runs what the
//! engine sends a Redis server: its scripts, as the Rust twins the server layer registers by
//! their SHA1 (see `server::in_process`), and the few plain commands of the uncontended path and
//! of inspection. Release messages go to the one listener that the release notifications set.

mod commands;
pub(crate) mod keyspace;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisResult, Value};

use crate::plumbing::unpoisoned::Unpoisoned;
pub(crate) use keyspace::{Keyspace, WrongType};

/// A script's twin: runs on the keyspace with the script's `KEYS` and `ARGV`, and returns what
/// the script returns.
pub(crate) type Twin = fn(&mut Keyspace, &[String], &[String]) -> Result<Value, WrongType>;

/// Where a published release message goes: `(channel, payload)`.
pub(crate) type Listener = Box<dyn Fn(&str, &str) + Send + Sync>;

/// The server in this process.
pub(crate) struct InProcess {
    keyspace: Mutex<Keyspace>,
    /// The scripts it runs, by SHA1.
    twins: HashMap<String, Twin>,
    listener: Mutex<Option<Arc<Listener>>>,
}

impl std::fmt::Debug for InProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcess")
            .field("scripts", &self.twins.len())
            .finish_non_exhaustive()
    }
}

impl InProcess {
    /// An empty server that runs the scripts `twins` (SHA1 and twin).
    pub(crate) fn new(twins: impl IntoIterator<Item = (String, Twin)>) -> Self {
        Self {
            keyspace: Mutex::default(),
            twins: twins.into_iter().collect(),
            listener: Mutex::new(None),
        }
    }

    /// Sends every release message published from now on to `listener`.
    pub(crate) fn listen(&self, listener: Listener) {
        *self.listener.locked() = Some(Arc::new(listener));
    }

    /// Runs one command.
    pub(crate) fn run(&self, cmd: &Cmd) -> RedisResult<Value> {
        self.with_keyspace(|keys| self.one(keys, cmd))
    }

    /// Runs a pipeline's commands, at once (a transaction's reply is the array of them all).
    pub(crate) fn run_pipeline(&self, pipe: &Pipeline, offset: usize) -> RedisResult<Vec<Value>> {
        let replies = self.with_keyspace(|keys| {
            pipe.cmd_iter()
                .map(|cmd| self.one(keys, cmd))
                .collect::<RedisResult<Vec<Value>>>()
        })?;
        // A transaction is asked for its `EXEC` alone (after `MULTI` and the queued replies).
        Ok(match offset {
            0 => replies,
            _ => vec![Value::Array(replies)],
        })
    }

    /// Runs `f` on the keyspace, then delivers what it published.
    fn with_keyspace<T>(&self, f: impl FnOnce(&mut Keyspace) -> T) -> T {
        let (out, published) = {
            let mut keys = self.keyspace.locked();
            let out = f(&mut keys);
            (out, std::mem::take(&mut keys.published))
        };
        if !published.is_empty()
            && let Some(listener) = self.listener.locked().clone()
        {
            for (channel, payload) in &published {
                listener(channel, payload);
            }
        }
        out
    }

    fn one(&self, keys: &mut Keyspace, cmd: &Cmd) -> RedisResult<Value> {
        let args: Vec<String> = cmd
            .args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "0".to_owned(),
            })
            .collect();
        let name = args
            .first()
            .map(|a| a.to_ascii_uppercase())
            .unwrap_or_default();
        if name == "EVALSHA" {
            return self.eval(keys, &args[1..]);
        }
        commands::run(keys, &name, &args[1..])
    }

    /// `EVALSHA sha numkeys key.. arg..`.
    fn eval(&self, keys: &mut Keyspace, args: &[String]) -> RedisResult<Value> {
        let twin = args.first().and_then(|sha| self.twins.get(sha));
        let Some(twin) = twin else {
            return Err(refused(
                "NOSCRIPT no such script in the in-process server".to_owned(),
            ));
        };
        let numkeys: usize = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(0);
        let rest = args.get(2..).unwrap_or_default();
        let (script_keys, argv) = rest.split_at(numkeys.min(rest.len()));
        Ok(twin(keys, script_keys, argv)?)
    }
}

/// The error of a command the in-process server refuses.
fn refused(what: String) -> RedisError {
    RedisError::from((ErrorKind::Client, "in-process server", what))
}

impl From<WrongType> for RedisError {
    fn from(_: WrongType) -> Self {
        refused("WRONGTYPE Operation against a key holding the wrong kind of value".to_owned())
    }
}
