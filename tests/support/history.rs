//! The test side of the fenced store (`support/fenced.rs`): setting a store up (its mode, one
//! store per name), reading it back (its value, sequence number and history), and the checker of
//! a history.

use std::collections::HashMap;
use std::fmt;

use redis::RedisResult;

use super::fenced::{FencedStore, keys};

/// Whether the store enforces fencing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Refuse writes whose fence is not above every fence seen from another hold.
    Fenced,
    /// Accept every write (the unsafe control); the history still shows which were stale.
    Unfenced,
}

impl FencedStore {
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

    /// The current value of the counter.
    pub async fn value(&self) -> RedisResult<u64> {
        self.state_field("value").await
    }

    /// The sequence number of the last operation (0 for an empty store).
    pub async fn seq(&self) -> RedisResult<u64> {
        self.state_field("seq").await
    }

    /// A number of the store's state hash (0 while it is not set).
    async fn state_field(&self, field: &str) -> RedisResult<u64> {
        let mut conn = self.conn.clone();
        let v: Option<u64> = redis::cmd("HGET")
            .arg(&self.state)
            .arg(field)
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

impl Hold {
    /// A hold that starts at `start`, without a write yet.
    fn starting(client: &str, fence: u64, start: u64) -> Self {
        Self {
            client: client.to_owned(),
            fence,
            start,
            end: None,
            accepted: None,
        }
    }
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
                report.holds.push(Hold::starting(client, *fence, *seq));
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
                        report.holds.push(Hold::starting(client, *fence, *seq));
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
