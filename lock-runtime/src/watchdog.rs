//! The renewal watchdog: one task per locker renews every held lease, in batches.
//!
//! Leases wait in one schedule ordered by their next renewal. Each wake-up takes every lease due
//! within a quarter of its renew period and renews them with one script call per node and per
//! chunk, so 10,000 held leases cost a handful of round trips per tick, not 10,000 timers.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::LostReason;
use crate::fanout::on_nodes_until;
use crate::lease::LeaseShared;
use crate::node::Node;

/// Most keys in one renew script call.
const CHUNK: usize = 1000;
/// How long an idle task waits for new leases before it stops: a steady acquire/release loop
/// then reuses one task instead of spawning one per lease.
const LINGER: Duration = Duration::from_secs(1);

#[derive(Default)]
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    schedule: Mutex<Schedule>,
    wake: Notify,
}

#[derive(Default)]
struct Schedule {
    due: BTreeMap<(Instant, u64), Arc<LeaseShared>>,
    next_id: u64,
    /// Leases taken out of `due` by a renewal round that has not finished yet.
    in_flight: usize,
    running: bool,
    /// When the running task will next look at the schedule by itself; `None` while it is busy.
    /// A new lease due earlier than this wakes it.
    armed: Option<Instant>,
}

impl Schedule {
    fn insert(&mut self, at: Instant, lease: Arc<LeaseShared>) -> bool {
        self.next_id += 1;
        let slot = (at, self.next_id);
        let earliest = self.due.keys().next().is_none_or(|&first| slot < first);
        *lease.slot.lock().expect("slot lock") = Some(slot);
        self.due.insert(slot, lease);
        earliest
    }

    fn remove(&mut self, slot: (Instant, u64)) -> Option<Arc<LeaseShared>> {
        let lease = self.due.remove(&slot)?;
        *lease.slot.lock().expect("slot lock") = None;
        Some(lease)
    }
}

/// Clears `running` if the task is dropped early, e.g. when its runtime shuts down.
struct RunningGuard {
    shared: Arc<Shared>,
    armed: bool,
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        if self.armed
            && let Ok(mut s) = self.shared.schedule.lock()
        {
            s.running = false;
        }
    }
}

impl Watchdog {
    /// Starts renewing `lease` (first renewal one renew period after the acquire was sent).
    pub(crate) fn register(&self, nodes: &[Arc<Node>], quorum: usize, lease: Arc<LeaseShared>) {
        let at = lease.started + lease.renew;
        let mut s = self.shared.schedule.lock().expect("watchdog lock");
        s.insert(at, lease);
        let earliest = s.armed.is_none_or(|armed| at < armed);
        if !s.running {
            s.running = true;
            drop(s);
            let guard = RunningGuard {
                shared: Arc::clone(&self.shared),
                armed: true,
            };
            tokio::spawn(run(guard, nodes.to_vec(), quorum));
        } else if earliest {
            drop(s);
            self.shared.wake.notify_one();
        }
    }

    /// Stops renewing `lease` (released or dropped), so ended leases do not pile up.
    pub(crate) fn remove(&self, lease: &LeaseShared) {
        let mut s = self.shared.schedule.lock().expect("watchdog lock");
        let slot = lease.slot.lock().expect("slot lock").take();
        if let Some(slot) = slot {
            s.due.remove(&slot);
        }
    }
}

async fn run(mut guard: RunningGuard, nodes: Vec<Arc<Node>>, quorum: usize) {
    let shared = Arc::clone(&guard.shared);
    let mut idle_since: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let wake_at = {
            let mut s = shared.schedule.lock().expect("watchdog lock");
            let (batch, next) = take_due(&mut s, now);
            if !batch.is_empty() {
                s.armed = None;
                drop(s);
                idle_since = None;
                tokio::spawn(renew_round(
                    Arc::clone(&shared),
                    nodes.clone(),
                    quorum,
                    batch,
                ));
                continue;
            }
            let wake_at = match next {
                Some(at) => Some(at),
                // A round is out: its end re-schedules its leases and wakes us.
                None if s.in_flight > 0 => None,
                None => {
                    let since = *idle_since.get_or_insert(now);
                    if now >= since + LINGER {
                        // Stop under the lock: a new lease either landed before this check, or
                        // sees `running == false` and starts a new task. Disarm the guard so
                        // that its drop cannot clear the flag of that new task.
                        s.running = false;
                        s.armed = None;
                        guard.armed = false;
                        return;
                    }
                    Some(since + LINGER)
                }
            };
            if next.is_some() || s.in_flight > 0 {
                idle_since = None;
            }
            s.armed = wake_at;
            wake_at
        };
        match wake_at {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = shared.wake.notified() => {}
                }
            }
            None => shared.wake.notified().await,
        }
    }
}

/// Removes and returns every live lease that is due, plus, once one is due, those due within a
/// quarter of their renew period (renewed a little early, in the same round trip); also returns
/// when the next one is due.
fn take_due(s: &mut Schedule, now: Instant) -> (Vec<Arc<LeaseShared>>, Option<Instant>) {
    let mut batch = Vec::new();
    loop {
        let Some((&(at, id), lease)) = s.due.iter().next() else {
            return (batch, None);
        };
        if lease.is_ended() {
            s.remove((at, id));
            continue;
        }
        if at > now + lease.renew / 4 || (batch.is_empty() && at > now) {
            return (batch, Some(at));
        }
        let lease = s.remove((at, id)).expect("present");
        s.in_flight += 1;
        batch.push(lease);
    }
}

/// Renews one batch: every chunk of the round goes out at once (they pipeline on each node's
/// connection), so chunk k is not confirmed k round trips late, and each chunk is decided as
/// soon as its replies are in.
async fn renew_round(
    shared: Arc<Shared>,
    nodes: Vec<Arc<Node>>,
    quorum: usize,
    batch: Vec<Arc<LeaseShared>>,
) {
    let chunks: Vec<Arc<Vec<Arc<LeaseShared>>>> = batch
        .chunks(CHUNK)
        .map(|chunk| Arc::new(chunk.to_vec()))
        .collect();
    let rounds = chunks.into_iter().map(|chunk| {
        let (shared, nodes) = (Arc::clone(&shared), nodes.clone());
        async move { renew_chunk_everywhere(&shared, &nodes, quorum, chunk).await }
    });
    crate::fanout::join_all(rounds.collect()).await;
}

async fn renew_chunk_everywhere(
    shared: &Shared,
    nodes: &[Arc<Node>],
    quorum: usize,
    chunk: Arc<Vec<Arc<LeaseShared>>>,
) {
    let sent = Instant::now();
    let replies = if let [node] = nodes {
        vec![Some(
            renew_chunk(Arc::clone(node), Arc::clone(&chunk)).await,
        )]
    } else {
        // Decide each lease as soon as a majority confirmed or denied it: a node that stopped
        // answering must not hold the round until its response timeout, which may be longer
        // than what is left of the leases' validity.
        on_nodes_until(
            nodes,
            |node| renew_chunk(node, Arc::clone(&chunk)),
            |replies| {
                (0..chunk.len()).all(|i| {
                    let (ours, not_ours) = tally(replies, i);
                    chunk[i].is_ended() || ours >= quorum || not_ours > nodes.len() - quorum
                })
            },
        )
        .await
    };
    let mut s = shared.schedule.lock().expect("watchdog lock");
    s.in_flight -= chunk.len();
    let now = Instant::now();
    for (i, lease) in chunk.iter().enumerate() {
        if lease.is_ended() {
            continue;
        }
        let (ours, not_ours) = tally(&replies, i);
        if ours >= quorum {
            lease.confirm(sent);
            s.insert(sent + lease.renew, Arc::clone(lease));
        } else if not_ours > nodes.len() - quorum {
            lease.mark_lost(LostReason::NotOwner);
        } else if now >= lease.status.borrow().valid_until {
            lease.mark_lost(LostReason::ValidityExpired);
        } else {
            // No majority answered: try again soon, while the lease is still valid.
            let retry =
                (lease.renew / 4).clamp(Duration::from_millis(5), Duration::from_millis(100));
            s.insert(now + retry, Arc::clone(lease));
        }
    }
    drop(s);
    shared.wake.notify_one();
}

/// How many nodes renewed lease `i` of a chunk, and how many said it is no longer ours.
fn tally(replies: &[Option<redis::RedisResult<Vec<bool>>>], i: usize) -> (usize, usize) {
    let ours = replies
        .iter()
        .filter(|r| matches!(r, Some(Ok(v)) if v[i]))
        .count();
    let not_ours = replies
        .iter()
        .filter(|r| matches!(r, Some(Ok(v)) if !v[i]))
        .count();
    (ours, not_ours)
}

async fn renew_chunk(
    node: Arc<Node>,
    chunk: Arc<Vec<Arc<LeaseShared>>>,
) -> redis::RedisResult<Vec<bool>> {
    // A lease released since the round began is left out (its key may be kept for min_hold;
    // the release script also changes such a key's value, so a renewal already on its way
    // cannot stretch it either).
    let items: Vec<(&str, &str, u64)> = chunk
        .iter()
        .map(|l| {
            let token = if l.is_ended() { "" } else { l.token.as_str() };
            (l.key.as_str(), token, l.ttl.as_millis() as u64)
        })
        .collect();
    let out = node.renew(&items).await;
    if let Err(e) = &out {
        tracing::debug!(node = node.addr(), error = %e, leases = items.len(), "renewal failed; retrying");
    }
    out
}
