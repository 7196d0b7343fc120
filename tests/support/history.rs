//! The test side of the fenced store (`support/fenced.rs`): setting a store up (its mode, one
//! store per name), reading it back (its value, sequence number and history), and the checker of
//! a history.

use std::collections::HashMap;
use std::fmt;

use redis::{RedisResult, Script};

use super::fenced::{ENTER, FencedStore, call, keys};

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

    /// A read of a holder that may be inside with others (`mode` shared or permit), or of an
    /// exclusive one that leaves without writing: recorded with its mode, so that the checker
    /// counts it as such. Returns the value read.
    pub async fn enter_as(&self, client: &str, fence: u64, mode: HoldMode) -> RedisResult<u64> {
        let script = Script::new(ENTER);
        let (_seq, basis): (u64, u64) = call(&script, &self.state, &self.history, client, fence)
            .arg(mode.to_string())
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(basis)
    }

    /// The end of a hold that writes nothing (after `enter_as`).
    pub async fn leave(&self, client: &str, fence: u64) -> RedisResult<()> {
        let script = Script::new(LEAVE);
        let _seq: u64 = call(&script, &self.state, &self.history, client, fence)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }
}

/// KEYS: state hash, history list. ARGV: client, fence. Returns the sequence number.
const LEAVE: &str = r"
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('RPUSH', KEYS[2], 'leave ' .. seq .. ' ' .. ARGV[1] .. ' ' .. ARGV[2])
return seq
";

/// How a hold held its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HoldMode {
    /// Alone (a lock, or the exclusive side of a read-write lock): its write is fenced; two at
    /// once are an overlap; with a hold of another mode, a crowd.
    #[default]
    Exclusive,
    /// The shared side of a read-write lock: with other shared holds, never with an exclusive one
    /// or a permit.
    Shared,
    /// One of a name's N permits (N given): with at most N - 1 other permit holds of the same N,
    /// and nothing else.
    Permit(u32),
}

impl fmt::Display for HoldMode {
    /// As the history writes it: `exclusive`, `shared`, `permit:N`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HoldMode::Exclusive => f.write_str("exclusive"),
            HoldMode::Shared => f.write_str("shared"),
            HoldMode::Permit(n) => write!(f, "permit:{n}"),
        }
    }
}

impl HoldMode {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "exclusive" => Some(HoldMode::Exclusive),
            "shared" => Some(HoldMode::Shared),
            _ => s
                .strip_prefix("permit:")?
                .parse()
                .ok()
                .map(HoldMode::Permit),
        }
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
        mode: HoldMode,
    },
    Write {
        seq: u64,
        client: String,
        fence: u64,
        basis: u64,
        accepted: bool,
    },
    /// The end of a hold that writes nothing.
    Leave {
        seq: u64,
        client: String,
        fence: u64,
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
                // An enter without a mode is a lock's.
                mode: f
                    .get(5)
                    .map_or(Some(HoldMode::Exclusive), |m| HoldMode::parse(m))
                    .unwrap_or_else(|| panic!("bad history line `{line}`")),
            },
            "write" => Event::Write {
                seq: num(1),
                client: f[2].to_owned(),
                fence: num(3),
                basis: num(4),
                accepted: num(5) == 1,
            },
            "leave" => Event::Leave {
                seq: num(1),
                client: f[2].to_owned(),
                fence: num(3),
            },
            _ => panic!("bad history line `{line}`"),
        }
    }

    pub fn seq(&self) -> u64 {
        match self {
            Event::Enter { seq, .. } | Event::Write { seq, .. } | Event::Leave { seq, .. } => *seq,
        }
    }
}

/// One locked section as the store saw it: `(client, fence, mode, start, end, accepted)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub client: String,
    pub fence: u64,
    pub mode: HoldMode,
    /// Sequence number of the enter (of the write or leave, for one without an enter).
    pub start: u64,
    /// Sequence number of the write or leave; `None` when the body never got there (cancelled,
    /// killed).
    pub end: Option<u64>,
    /// Whether the store accepted the write; `None` without a write.
    pub accepted: Option<bool>,
}

impl Hold {
    /// A hold that starts at `start`, without a write yet.
    fn starting(client: &str, fence: u64, start: u64, mode: HoldMode) -> Self {
        Self {
            client: client.to_owned(),
            fence,
            mode,
            start,
            end: None,
            accepted: None,
        }
    }
}

/// A moment the name held more than it admits: a hold entered while the holds in `inside` (it
/// included) were there, and they could not all be inside at once (see `crowded`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crowd {
    /// Sequence number of the enter.
    pub seq: u64,
    /// Indices into `Report::holds`, in the order they entered.
    pub inside: Vec<usize>,
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
    /// Each enter that took the name past what it admits (see `crowded`): holds of modes that
    /// exclude each other inside at once, or more permit holds than their N. (Two exclusive holds
    /// at once that both wrote are the `overlaps`: their fenced writes decide.) Holds without an
    /// end are not counted: where they ended is not known.
    pub crowds: Vec<Crowd>,
    /// Crowds left out by `excuse`.
    pub excused: usize,
    /// The most holds inside at once, of any mode.
    pub most_inside: usize,
}

impl Report {
    /// Every safety violation: lost updates, stale writes accepted, overlaps the store let
    /// through, and crowds.
    pub fn violations(&self) -> usize {
        self.lost_updates.len()
            + self.stale_accepted.len()
            + self.unsafe_overlaps
            + self.crowds.len()
    }

    /// Counts the crowds again without the holds `excused` says were entitled to be there (say,
    /// those whose key a fault deleted under them: the name lets the next holder in, and the
    /// holder learns of its loss only at its next renewal).
    pub fn excuse(&mut self, excused: impl Fn(&Hold) -> bool) {
        let before = self.crowds.len();
        self.crowds = crowds(&self.holds, |h| !excused(h)).0;
        self.excused += before - self.crowds.len();
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
        if self.most_inside > 1 || !self.crowds.is_empty() || self.excused > 0 {
            write!(
                f,
                "; at most {} inside at once: {} crowded moments ({} excused)",
                self.most_inside,
                self.crowds.len(),
                self.excused
            )?;
        }
        for crowd in self.crowds.iter().take(3) {
            let inside: Vec<_> = crowd.inside.iter().map(|&i| &self.holds[i]).collect();
            write!(f, "\n  crowd at {}: {inside:?}", crowd.seq)?;
        }
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

/// Checks a history of one name, whatever modes its holds had (events in any order; they are
/// sorted by sequence number).
pub fn check(events: &[Event]) -> Report {
    let mut events = events.to_vec();
    events.sort_by_key(Event::seq);
    let mut report = replay(&events);
    report.incomplete = report.holds.iter().filter(|h| h.end.is_none()).count();
    report.fences_increasing = report.holds.windows(2).all(|w| w[0].fence < w[1].fence);
    report.overlaps = overlaps(&report.holds);
    report.unsafe_overlaps = report
        .overlaps
        .iter()
        .filter(|&&(a, b)| {
            report.holds[a].accepted == Some(true) && report.holds[b].accepted == Some(true)
        })
        .count();
    (report.crowds, report.most_inside) = crowds(&report.holds, |_| true);
    report
}

/// The holds of sorted `events`, and what the accepted writes did to the counter.
fn replay(events: &[Event]) -> Report {
    let mut report = Report::default();
    let mut open: HashMap<(String, u64), usize> = HashMap::new();
    let (mut seen, mut written, mut value) = (0u64, 0u64, 0u64);
    for event in events {
        match event {
            Event::Enter {
                seq,
                client,
                fence,
                mode,
                ..
            } => {
                open.insert((client.clone(), *fence), report.holds.len());
                report
                    .holds
                    .push(Hold::starting(client, *fence, *seq, *mode));
                seen = seen.max(*fence);
            }
            Event::Leave { seq, client, fence } => {
                end(&mut report, &mut open, *seq, client, *fence);
            }
            Event::Write {
                seq,
                client,
                fence,
                basis,
                accepted,
            } => {
                let hold = end(&mut report, &mut open, *seq, client, *fence);
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
    report
}

/// Ends at `seq` the open hold of `client` under `fence` (a hold of its own if it never
/// entered); returns its index.
fn end(
    report: &mut Report,
    open: &mut HashMap<(String, u64), usize>,
    seq: u64,
    client: &str,
    fence: u64,
) -> usize {
    let hold = open.remove(&(client.to_owned(), fence)).unwrap_or_else(|| {
        let hold = Hold::starting(client, fence, seq, HoldMode::Exclusive);
        report.holds.push(hold);
        report.holds.len() - 1
    });
    report.holds[hold].end = Some(seq);
    hold
}

/// Pairs of exclusive holds whose intervals intersect.
fn overlaps(holds: &[Hold]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let exclusive = |h: &Hold| h.mode == HoldMode::Exclusive;
    // Holds are in start order: each one overlaps the later holds that start before it ends.
    for (i, a) in holds.iter().enumerate().filter(|(_, a)| exclusive(a)) {
        let Some(end) = a.end else { continue };
        for (j, b) in holds.iter().enumerate().skip(i + 1) {
            if b.start > end {
                break;
            }
            if b.end.is_some() && exclusive(b) {
                out.push((i, j));
            }
        }
    }
    out
}

/// The crowds among the ended holds that `counted` keeps (see `Report::crowds`), and the most
/// of them inside at once.
fn crowds(holds: &[Hold], counted: impl Fn(&Hold) -> bool) -> (Vec<Crowd>, usize) {
    // (seq, 0 for an enter or 1 for an end, hold): a hold that starts and ends at one sequence
    // number (a write without an enter) is entered before it ends.
    let mut points: Vec<(u64, u8, usize)> = Vec::new();
    for (i, h) in holds.iter().enumerate().filter(|(_, h)| counted(h)) {
        if let Some(end) = h.end {
            points.extend([(h.start, 0, i), (end, 1, i)]);
        }
    }
    points.sort_unstable();
    let (mut inside, mut out, mut most) = (Vec::new(), Vec::new(), 0);
    for (seq, kind, i) in points {
        if kind == 1 {
            inside.retain(|&j| j != i);
            continue;
        }
        inside.push(i);
        most = most.max(inside.len());
        if crowded(holds, &inside) {
            out.push(Crowd {
                seq,
                inside: inside.clone(),
            });
        }
    }
    (out, most)
}

/// Whether the holds `inside` could not all hold their name at once: an exclusive hold with a
/// hold of any other mode, a shared hold with a permit, permits of two different N, more than N
/// permits of N, or two exclusive holds of which one left without writing (a read-write lock's
/// writer; two that both wrote are judged by their writes, `overlaps`).
fn crowded(holds: &[Hold], inside: &[usize]) -> bool {
    let modes = || inside.iter().map(|&j| holds[j].mode);
    let of = |mode| modes().filter(|&m| m == mode).count();
    let (exclusive, shared) = (of(HoldMode::Exclusive), of(HoldMode::Shared));
    let permits: Vec<u32> = modes()
        .filter_map(|m| match m {
            HoldMode::Permit(n) => Some(n),
            _ => None,
        })
        .collect();
    let unwritten = inside
        .iter()
        .any(|&j| holds[j].mode == HoldMode::Exclusive && holds[j].accepted.is_none());
    let doubled = exclusive > 1 && unwritten;
    let exclusive_with_others = exclusive > 0 && (shared > 0 || !permits.is_empty());
    let shared_with_permits = shared > 0 && !permits.is_empty();
    let numbers_differ = permits.windows(2).any(|w| w[0] != w[1]);
    let too_many = permits.first().is_some_and(|&n| permits.len() > n as usize);
    doubled || exclusive_with_others || shared_with_permits || numbers_differ || too_many
}
