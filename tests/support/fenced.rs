//! A fenced store and a history checker, in the style of a Jepsen lock test.
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
//! In [`Mode::Fenced`] the store accepts a write only if its fence is above every fence it has
//! seen from another hold: not below any fence seen so far (reads included, so a holder that read
//! under a newer fence wins over a stale one that read earlier), and above every fence already
//! written. In [`Mode::Unfenced`] it accepts every write (the unsafe control) but records the same
//! facts, so the checker can show what fencing would have refused.
//!
//! The [`check`] of a history reports overlapping holds, lost updates (an accepted write whose
//! basis is not the current value: it overwrote an update it never saw), stale writes accepted (an
//! accepted write whose fence is below one already seen), and whether fences increase.
#![allow(dead_code)]

use std::collections::HashMap;
use std::fmt;

use redis::aio::MultiplexedConnection;
use redis::{RedisResult, Script};

/// Whether the store enforces fencing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Refuse writes whose fence is not above every fence seen from another hold.
    Fenced,
    /// Accept every write (the unsafe control); the history still shows which were stale.
    Unfenced,
}

/// KEYS: state hash, history list. ARGV: client, fence.
/// Returns `{seq, value}`; raises the highest fence seen.
const ENTER: &str = r"
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
local fence = tonumber(ARGV[2])
local seen = tonumber(redis.call('HGET', KEYS[1], 'max_seen') or '0')
if fence > seen then redis.call('HSET', KEYS[1], 'max_seen', ARGV[2]) end
local value = tonumber(redis.call('HGET', KEYS[1], 'value') or '0')
redis.call('RPUSH', KEYS[2], 'enter ' .. seq .. ' ' .. ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. value)
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

/// What `enter` returned: the operation's place in the history and the value read.
#[derive(Debug, Clone, Copy)]
pub struct Entered {
    pub seq: u64,
    pub basis: u64,
}

/// What `write` returned.
#[derive(Debug, Clone, Copy)]
pub struct Written {
    pub seq: u64,
    pub accepted: bool,
}

/// A fenced store named `name` on a redis-server (use one that no fault touches).
#[derive(Clone)]
pub struct FencedStore {
    conn: MultiplexedConnection,
    state: String,
    history: String,
}

fn keys(name: &str) -> (String, String) {
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

    /// Another store, `name`, on the same server and connection (many names, one connection).
    pub fn named(&self, name: &str) -> Self {
        let (state, history) = keys(name);
        Self {
            conn: self.conn.clone(),
            state,
            history,
        }
    }

    /// Empties the store and sets its mode.
    pub async fn reset(&self, mode: Mode) -> RedisResult<()> {
        let mut conn = self.conn.clone();
        let mode = match mode {
            Mode::Fenced => "fenced",
            Mode::Unfenced => "unfenced",
        };
        redis::pipe()
            .atomic()
            .del(&self.state)
            .del(&self.history)
            .hset(&self.state, "mode", mode)
            .exec_async(&mut conn)
            .await
    }

    /// A fenced read: returns the current value (the basis of the coming write).
    pub async fn enter(&self, client: &str, fence: u64) -> RedisResult<Entered> {
        let mut conn = self.conn.clone();
        let (seq, basis): (u64, u64) = Script::new(ENTER)
            .key(&self.state)
            .key(&self.history)
            .arg(client)
            .arg(fence)
            .invoke_async(&mut conn)
            .await?;
        Ok(Entered { seq, basis })
    }

    /// Writes `basis + 1` if the fence allows it (always, in [`Mode::Unfenced`]).
    pub async fn write(&self, client: &str, fence: u64, basis: u64) -> RedisResult<Written> {
        let mut conn = self.conn.clone();
        let (seq, flag): (u64, u8) = Script::new(WRITE)
            .key(&self.state)
            .key(&self.history)
            .arg(client)
            .arg(fence)
            .arg(basis)
            .invoke_async(&mut conn)
            .await?;
        Ok(Written {
            seq,
            accepted: flag == 1,
        })
    }

    /// The current value of the counter.
    pub async fn value(&self) -> RedisResult<u64> {
        let mut conn = self.conn.clone();
        let v: Option<u64> = redis::cmd("HGET")
            .arg(&self.state)
            .arg("value")
            .query_async(&mut conn)
            .await?;
        Ok(v.unwrap_or(0))
    }

    /// The sequence number of the last operation (0 for an empty store).
    pub async fn seq(&self) -> RedisResult<u64> {
        let mut conn = self.conn.clone();
        let v: Option<u64> = redis::cmd("HGET")
            .arg(&self.state)
            .arg("seq")
            .query_async(&mut conn)
            .await?;
        Ok(v.unwrap_or(0))
    }

    /// The whole history, in the store's order.
    pub async fn history(&self) -> RedisResult<Vec<Event>> {
        let mut conn = self.conn.clone();
        let lines: Vec<String> = redis::cmd("LRANGE")
            .arg(&self.history)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await?;
        Ok(lines.iter().map(|l| Event::parse(l)).collect())
    }

    /// The history, checked.
    pub async fn check(&self) -> RedisResult<Report> {
        Ok(check(&self.history().await?))
    }
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
        let (seq, flag): (u64, u8) = Script::new(WRITE)
            .key(&self.state)
            .key(&self.history)
            .arg(client)
            .arg(fence)
            .arg(basis)
            .invoke(&mut self.conn)?;
        Ok(Written {
            seq,
            accepted: flag == 1,
        })
    }
}

/// One operation as the store applied it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Enter {
        seq: u64,
        client: String,
        fence: u64,
        basis: u64,
    },
    Write {
        seq: u64,
        client: String,
        fence: u64,
        basis: u64,
        accepted: bool,
    },
}

impl Event {
    fn parse(line: &str) -> Self {
        let f: Vec<&str> = line.split(' ').collect();
        let num = |i: usize| -> u64 {
            f.get(i)
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("bad history line `{line}`"))
        };
        match f[0] {
            "enter" => Event::Enter {
                seq: num(1),
                client: f[2].to_owned(),
                fence: num(3),
                basis: num(4),
            },
            "write" => Event::Write {
                seq: num(1),
                client: f[2].to_owned(),
                fence: num(3),
                basis: num(4),
                accepted: num(5) == 1,
            },
            _ => panic!("bad history line `{line}`"),
        }
    }

    pub fn seq(&self) -> u64 {
        match self {
            Event::Enter { seq, .. } | Event::Write { seq, .. } => *seq,
        }
    }
}

/// One locked section as the store saw it: `(client, fence, start, end, accepted)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub client: String,
    pub fence: u64,
    /// Sequence number of the enter (of the write, for a write without an enter).
    pub start: u64,
    /// Sequence number of the write; `None` when the body never wrote (cancelled, killed).
    pub end: Option<u64>,
    /// Whether the store accepted the write; `None` without a write.
    pub accepted: Option<bool>,
}

/// What the checker found in a history.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub holds: Vec<Hold>,
    /// Pairs of holds whose intervals intersect (indices into `holds`).
    pub overlaps: Vec<(usize, usize)>,
    /// Overlapping pairs in which both writes were accepted: mutual exclusion failed and the
    /// store let it through.
    pub unsafe_overlaps: usize,
    /// Sequence numbers of accepted writes whose basis was not the current value.
    pub lost_updates: Vec<u64>,
    /// Sequence numbers of accepted writes whose fence was below a fence already seen, or equal
    /// to one already written.
    pub stale_accepted: Vec<u64>,
    /// Sequence numbers of refused writes.
    pub refused: Vec<u64>,
    pub accepted: usize,
    /// Holds with an enter but no write.
    pub incomplete: usize,
    /// The counter after replaying the accepted writes.
    pub final_value: u64,
    /// Whether the fences of the holds, in the order they entered, strictly increase.
    pub fences_increasing: bool,
}

impl Report {
    /// Every safety violation: lost updates, stale writes accepted, and overlaps the store let through.
    pub fn violations(&self) -> usize {
        self.lost_updates.len() + self.stale_accepted.len() + self.unsafe_overlaps
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} holds ({} incomplete), {} writes accepted, {} refused; {} overlapping pairs ({} with both \
             writes accepted), {} lost updates, {} stale writes accepted; final value {}; fences {}",
            self.holds.len(),
            self.incomplete,
            self.accepted,
            self.refused.len(),
            self.overlaps.len(),
            self.unsafe_overlaps,
            self.lost_updates.len(),
            self.stale_accepted.len(),
            self.final_value,
            if self.fences_increasing {
                "strictly increasing"
            } else {
                "NOT strictly increasing"
            },
        )?;
        for &(a, b) in self.overlaps.iter().take(5) {
            write!(
                f,
                "\n  overlap: {:?} and {:?}",
                self.holds[a], self.holds[b]
            )?;
        }
        Ok(())
    }
}

/// Checks a history (events in any order; they are sorted by sequence number).
pub fn check(events: &[Event]) -> Report {
    let mut events = events.to_vec();
    events.sort_by_key(Event::seq);
    let mut report = Report::default();
    let mut open: HashMap<(String, u64), usize> = HashMap::new();
    let mut seen = 0u64;
    let mut written = 0u64;
    let mut value = 0u64;
    for event in &events {
        match event {
            Event::Enter {
                seq, client, fence, ..
            } => {
                open.insert((client.clone(), *fence), report.holds.len());
                report.holds.push(Hold {
                    client: client.clone(),
                    fence: *fence,
                    start: *seq,
                    end: None,
                    accepted: None,
                });
                seen = seen.max(*fence);
            }
            Event::Write {
                seq,
                client,
                fence,
                basis,
                accepted,
            } => {
                let hold = match open.remove(&(client.clone(), *fence)) {
                    Some(i) => i,
                    None => {
                        report.holds.push(Hold {
                            client: client.clone(),
                            fence: *fence,
                            start: *seq,
                            end: None,
                            accepted: None,
                        });
                        report.holds.len() - 1
                    }
                };
                report.holds[hold].end = Some(*seq);
                report.holds[hold].accepted = Some(*accepted);
                if *accepted {
                    report.accepted += 1;
                    if *fence < seen || *fence <= written {
                        report.stale_accepted.push(*seq);
                    }
                    if *basis != value {
                        report.lost_updates.push(*seq);
                    }
                    value = basis + 1;
                    written = written.max(*fence);
                } else {
                    report.refused.push(*seq);
                }
                seen = seen.max(*fence);
            }
        }
    }
    report.final_value = value;
    report.incomplete = report.holds.iter().filter(|h| h.end.is_none()).count();
    report.fences_increasing = report.holds.windows(2).all(|w| w[0].fence < w[1].fence);
    // Holds are in start order: each one overlaps the later holds that start before it ends.
    for (i, a) in report.holds.iter().enumerate() {
        let Some(end) = a.end else { continue };
        for (j, b) in report.holds.iter().enumerate().skip(i + 1) {
            if b.start > end {
                break;
            }
            if b.end.is_some() {
                report.overlaps.push((i, j));
                if a.accepted == Some(true) && b.accepted == Some(true) {
                    report.unsafe_overlaps += 1;
                }
            }
        }
    }
    report
}
