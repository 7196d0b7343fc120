//! A fenced store, in the style of a Jepsen lock test: the operations a locked section makes
//! (`enter`, `write`). Setting a store up, reading it back and checking its history is the test
//! side's alone: `support/history.rs`.
//!
//! # Where the store lives, and why
//!
//! The store is a pair of Lua scripts on a redis-server of its own (not the lock server):
//!
//! - Shared by every process: holders in other OS processes (`src/bin/lock_holder.rs`, which
//!   includes this file with `#[path]`) and tasks of the test process all talk to the same store,
//!   so one history covers every client.
//! - One total order, no clocks: Redis runs one script at a time, so each operation gets a
//!   sequence number at the moment it takes effect (its linearization point). Holds are intervals
//!   of these numbers; comparing intervals needs no clock shared between processes.
//! - Recorded where it happens: an operation is in the history as soon as the store applied it,
//!   even if the client is then killed, paused, or cancelled before it sees the reply. A history
//!   assembled from what the clients print would miss exactly those cases.
//! - Out of the fault's reach: the faults (pause, restart, proxy) hit the lock server only; a
//!   restart of the lock server must not erase the history, so the store is on another server.
//!
//! # The model
//!
//! A locked section is `enter(client, fence)` (a fenced read: returns the counter, the *basis*)
//! then `write(client, fence, basis)` (sets the counter to `basis + 1`). Both are awaited inside the
//! locked body, so the hold's interval `[enter seq, write seq]` lies inside the time the client
//! believed it held the lock: if two intervals intersect, two bodies really ran at once.
//!
//! In the fenced mode (`history::Mode::Fenced`) the store accepts a write only if its fence is
//! above every fence it has seen from another hold: not below any fence seen so far (reads
//! included, so a holder that read under a newer fence wins over a stale one that read earlier),
//! and above every fence already written. In the unfenced mode it accepts every write (the unsafe
//! control) but records the same facts, so the checker can show what fencing would have refused.
//!
//! The checker of a history (`history::check`) reports overlapping holds, lost updates (an
//! accepted write whose basis is not the current value: it overwrote an update it never saw),
//! stale writes accepted (an accepted write whose fence is below one already seen), and whether
//! fences increase.
//!
//! Holders that may be inside together (the permits of a semaphore, the shared side of a
//! read-write lock) make `enter` with their mode and end with `leave` instead of a write
//! (`history.rs`, the test side): the checker counts who is inside at once against what the name
//! admits.

use redis::aio::MultiplexedConnection;
use redis::{RedisResult, Script, ScriptInvocation};

/// KEYS: state hash, history list. ARGV: client, fence, and the hold's mode when it is not
/// exclusive (`history::HoldMode`; the line then ends with it).
/// Returns `{seq, value}`; raises the highest fence seen.
pub(super) const ENTER: &str = r"
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
local fence = tonumber(ARGV[2])
local seen = tonumber(redis.call('HGET', KEYS[1], 'max_seen') or '0')
if fence > seen then redis.call('HSET', KEYS[1], 'max_seen', ARGV[2]) end
local value = tonumber(redis.call('HGET', KEYS[1], 'value') or '0')
local line = 'enter ' .. seq .. ' ' .. ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. value
if ARGV[3] then line = line .. ' ' .. ARGV[3] end
redis.call('RPUSH', KEYS[2], line)
return {seq, value}
";

/// KEYS: state hash, history list. ARGV: client, fence, basis.
/// Returns `{seq, accepted}`; an accepted write sets the value to `basis + 1`.
const WRITE: &str = r"
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
local fence = tonumber(ARGV[2])
local basis = tonumber(ARGV[3])
local seen = tonumber(redis.call('HGET', KEYS[1], 'max_seen') or '0')
local written = tonumber(redis.call('HGET', KEYS[1], 'max_written') or '0')
local fenced = redis.call('HGET', KEYS[1], 'mode') ~= 'unfenced'
local fresh = fence >= seen and fence > written
local accepted = fresh or not fenced
if fence > seen then redis.call('HSET', KEYS[1], 'max_seen', ARGV[2]) end
if accepted then
  redis.call('HSET', KEYS[1], 'value', basis + 1)
  if fence > written then redis.call('HSET', KEYS[1], 'max_written', ARGV[2]) end
end
local flag = 0
if accepted then flag = 1 end
redis.call('RPUSH', KEYS[2], 'write ' .. seq .. ' ' .. ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. basis .. ' ' .. flag)
return {seq, flag}
";

/// What `enter` returned: the value read.
#[derive(Debug, Clone, Copy)]
pub struct Entered {
    pub basis: u64,
}

/// What `write` returned.
#[derive(Debug, Clone, Copy)]
pub struct Written {
    pub accepted: bool,
}

/// A fenced store named `name` on a redis-server (use one that no fault touches).
#[derive(Clone)]
pub struct FencedStore {
    pub(super) conn: MultiplexedConnection,
    pub(super) state: String,
    pub(super) history: String,
}

/// The store `name`'s state hash and history list.
pub(super) fn keys(name: &str) -> (String, String) {
    (
        format!("fenced:{{{name}}}:state"),
        format!("fenced:{{{name}}}:history"),
    )
}

impl FencedStore {
    /// Connects to the store `name` on `url` (creating nothing: an absent store is empty).
    pub async fn connect(url: &str, name: &str) -> RedisResult<Self> {
        // The store is the test's instrument, not the system under test: a loaded machine must
        // not turn a slow reply into a failed test (redis-rs waits 500 ms by default).
        let config = redis::AsyncConnectionConfig::new()
            .set_response_timeout(Some(std::time::Duration::from_secs(10)));
        let conn = redis::Client::open(url)?
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let (state, history) = keys(name);
        Ok(Self {
            conn,
            state,
            history,
        })
    }

    /// A fenced read: returns the current value (the basis of the coming write).
    pub async fn enter(&self, client: &str, fence: u64) -> RedisResult<Entered> {
        let script = Script::new(ENTER);
        let (_seq, basis): (u64, u64) = call(&script, &self.state, &self.history, client, fence)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(Entered { basis })
    }

    /// Writes `basis + 1` if the fence allows it (always, in the unfenced mode).
    pub async fn write(&self, client: &str, fence: u64, basis: u64) -> RedisResult<Written> {
        let script = Script::new(WRITE);
        let (_seq, flag): (u64, u8) = call(&script, &self.state, &self.history, client, fence)
            .arg(basis)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(Written {
            accepted: flag == 1,
        })
    }
}

/// A call of `script` (`ENTER` or `WRITE`) on the store of the keys `state` and `history`, by
/// `client` under `fence`; a write adds its basis.
pub(super) fn call<'a>(
    script: &'a Script,
    state: &str,
    history: &str,
    client: &str,
    fence: u64,
) -> ScriptInvocation<'a> {
    let mut call = script.key(state);
    call.key(history).arg(client).arg(fence);
    call
}

/// A blocking connection for a write that must go out in one step, with no await in between
/// (see the `stale` mode of the holder binary).
pub struct BlockingStore {
    conn: redis::Connection,
    state: String,
    history: String,
}

impl BlockingStore {
    pub fn connect(url: &str, name: &str) -> RedisResult<Self> {
        let conn = redis::Client::open(url)?.get_connection()?;
        let (state, history) = keys(name);
        Ok(Self {
            conn,
            state,
            history,
        })
    }

    pub fn write(&mut self, client: &str, fence: u64, basis: u64) -> RedisResult<Written> {
        let script = Script::new(WRITE);
        let (_seq, flag): (u64, u8) = call(&script, &self.state, &self.history, client, fence)
            .arg(basis)
            .invoke(&mut self.conn)?;
        Ok(Written {
            accepted: flag == 1,
        })
    }
}
