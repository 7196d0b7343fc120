//! The keys of the in-process server: strings, sorted sets and hashes, each with an optional
//! expiry on tokio's clock (so a test with paused time expires keys as time is advanced), with
//! the few operations a lock's scripts and reads use, as Redis defines them.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// One key's value.
#[derive(Debug, Clone)]
pub(crate) enum Data {
    Str(String),
    /// Members in order of (score, member), as Redis orders a sorted set.
    ZSet(Vec<(f64, String)>),
    Hash(HashMap<String, String>),
    /// A list: only the script tables write one (a key of another type).
    #[cfg(test)]
    List,
}

#[derive(Debug)]
struct Entry {
    data: Data,
    expires: Option<Instant>,
}

/// A value of the wrong type for the operation (Redis's `WRONGTYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WrongType;

/// The keys, the clock, and the release messages published by the command running now.
#[derive(Debug)]
pub(crate) struct Keyspace {
    entries: HashMap<String, Entry>,
    /// The wall clock when this keyspace was made, in µs since the epoch, and tokio's clock then:
    /// `TIME` is the one plus how far the other has moved, so fences and expiries share a clock.
    epoch_us: u64,
    started: Instant,
    /// Writes since the last sweep of expired keys.
    writes: usize,
    /// `(channel, payload)` published by the current command; delivered once it is done.
    pub(crate) published: Vec<(String, String)>,
}

/// How many writes between two sweeps of expired keys nobody read again.
const SWEEP_EVERY: usize = 1024;

impl Default for Keyspace {
    fn default() -> Self {
        let epoch_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        Self {
            entries: HashMap::new(),
            epoch_us,
            started: Instant::now(),
            writes: 0,
            published: Vec::new(),
        }
    }
}

impl Keyspace {
    /// `TIME`: seconds and microseconds.
    pub(crate) fn time(&self) -> (u64, u64) {
        let us = self.now_us();
        (us / 1_000_000, us % 1_000_000)
    }

    /// The server's clock in µs.
    pub(crate) fn now_us(&self) -> u64 {
        self.epoch_us + self.started.elapsed().as_micros() as u64
    }

    /// The server's clock in ms.
    pub(crate) fn now_ms(&self) -> u64 {
        self.now_us() / 1000
    }

    /// The live entry of `key` (an expired one is removed first).
    fn live(&mut self, key: &str) -> Option<&mut Entry> {
        let expired = self
            .entries
            .get(key)
            .is_some_and(|e| e.expires.is_some_and(|at| at <= Instant::now()));
        if expired {
            self.entries.remove(key);
        }
        self.entries.get_mut(key)
    }

    fn write(&mut self, key: &str, data: Data, expires: Option<Instant>) {
        self.writes += 1;
        if self.writes >= SWEEP_EVERY {
            self.writes = 0;
            let now = Instant::now();
            self.entries
                .retain(|_, e| e.expires.is_none_or(|at| at > now));
        }
        self.entries.insert(key.to_owned(), Entry { data, expires });
    }

    /// `TYPE`: `none`, `string`, `zset` or `hash`.
    pub(crate) fn type_of(&mut self, key: &str) -> &'static str {
        match self.live(key).map(|e| &e.data) {
            None => "none",
            Some(Data::Str(_)) => "string",
            Some(Data::ZSet(_)) => "zset",
            Some(Data::Hash(_)) => "hash",
            #[cfg(test)]
            Some(Data::List) => "list",
        }
    }

    pub(crate) fn exists(&mut self, key: &str) -> bool {
        self.live(key).is_some()
    }

    /// `GET`.
    pub(crate) fn get(&mut self, key: &str) -> Result<Option<String>, WrongType> {
        match self.live(key).map(|e| &e.data) {
            None => Ok(None),
            Some(Data::Str(s)) => Ok(Some(s.clone())),
            Some(_) => Err(WrongType),
        }
    }

    /// `SET key value [PX ms]`.
    pub(crate) fn set(&mut self, key: &str, value: &str, px: Option<u64>) {
        let expires = px.map(|ms| Instant::now() + Duration::from_millis(ms));
        self.write(key, Data::Str(value.to_owned()), expires);
    }

    /// Replaces a string's value and keeps its expiry (what `SETRANGE` of a suffix does here).
    pub(crate) fn replace_keep_ttl(&mut self, key: &str, value: String) {
        if let Some(entry) = self.live(key) {
            entry.data = Data::Str(value);
        }
    }

    /// `DEL`; true when the key existed.
    pub(crate) fn del(&mut self, key: &str) -> bool {
        self.live(key);
        self.entries.remove(key).is_some()
    }

    /// `PTTL`: -2 for no key, -1 for a key without expiry.
    pub(crate) fn pttl(&mut self, key: &str) -> i64 {
        match self.live(key) {
            None => -2,
            Some(Entry { expires: None, .. }) => -1,
            Some(Entry {
                expires: Some(at), ..
            }) => at.saturating_duration_since(Instant::now()).as_millis() as i64,
        }
    }

    /// `PEXPIRE`; an expiry of 0 or less deletes the key.
    pub(crate) fn pexpire(&mut self, key: &str, ms: i64) {
        if ms <= 0 {
            self.del(key);
        } else if let Some(entry) = self.live(key) {
            entry.expires = Some(Instant::now() + Duration::from_millis(ms as u64));
        }
    }

    fn zset(&mut self, key: &str) -> Result<Option<&mut Vec<(f64, String)>>, WrongType> {
        match self.live(key).map(|e| &mut e.data) {
            None => Ok(None),
            Some(Data::ZSet(z)) => Ok(Some(z)),
            Some(_) => Err(WrongType),
        }
    }

    fn hash(&mut self, key: &str) -> Result<Option<&mut HashMap<String, String>>, WrongType> {
        match self.live(key).map(|e| &mut e.data) {
            None => Ok(None),
            Some(Data::Hash(h)) => Ok(Some(h)),
            Some(_) => Err(WrongType),
        }
    }

    /// Removes `key` when its collection is empty, as Redis does.
    fn drop_if_empty(&mut self, key: &str) {
        let empty = match self.entries.get(key).map(|e| &e.data) {
            Some(Data::ZSet(z)) => z.is_empty(),
            Some(Data::Hash(h)) => h.is_empty(),
            _ => false,
        };
        if empty {
            self.entries.remove(key);
        }
    }

    /// `ZRANGE key start stop WITHSCORES` by rank (negative ranks count from the end).
    pub(crate) fn zrange(
        &mut self,
        key: &str,
        start: i64,
        stop: i64,
    ) -> Result<Vec<(String, f64)>, WrongType> {
        let Some(z) = self.zset(key)? else {
            return Ok(Vec::new());
        };
        let len = z.len() as i64;
        let at = |i: i64| if i < 0 { len + i } else { i };
        let (from, to) = (at(start).max(0), at(stop).min(len - 1));
        if from > to {
            return Ok(Vec::new());
        }
        Ok(z[from as usize..=to as usize]
            .iter()
            .map(|(score, member)| (member.clone(), *score))
            .collect())
    }

    /// The members of a sorted set, in order.
    pub(crate) fn zmembers(&mut self, key: &str) -> Result<Vec<String>, WrongType> {
        Ok(self
            .zrange(key, 0, -1)?
            .into_iter()
            .map(|(m, _)| m)
            .collect())
    }

    pub(crate) fn zscore(&mut self, key: &str, member: &str) -> Result<Option<f64>, WrongType> {
        Ok(self
            .zset(key)?
            .and_then(|z| z.iter().find(|(_, m)| m == member).map(|(s, _)| *s)))
    }

    /// `ZADD key [NX|XX] score member`: `only_new` is NX, `only_existing` XX.
    pub(crate) fn zadd(
        &mut self,
        key: &str,
        score: f64,
        member: &str,
        only_new: bool,
        only_existing: bool,
    ) -> Result<(), WrongType> {
        if self.zset(key)?.is_none() {
            if only_existing {
                return Ok(());
            }
            self.write(key, Data::ZSet(Vec::new()), None);
        }
        let z = self.zset(key)?.expect("made above");
        match z.iter().position(|(_, m)| m == member) {
            Some(_) if only_new => return Ok(()),
            Some(at) => {
                z.remove(at);
            }
            None if only_existing => return Ok(()),
            None => {}
        }
        let at = z.partition_point(|(s, m)| (*s, m.as_str()) < (score, member));
        z.insert(at, (score, member.to_owned()));
        Ok(())
    }

    /// `ZREM`.
    pub(crate) fn zrem(&mut self, key: &str, member: &str) -> Result<(), WrongType> {
        if let Some(z) = self.zset(key)? {
            z.retain(|(_, m)| m != member);
        }
        self.drop_if_empty(key);
        Ok(())
    }

    /// `ZREMRANGEBYSCORE key -inf max`.
    pub(crate) fn zrem_up_to(&mut self, key: &str, max: f64) -> Result<(), WrongType> {
        if let Some(z) = self.zset(key)? {
            z.retain(|(s, _)| *s > max);
        }
        self.drop_if_empty(key);
        Ok(())
    }

    pub(crate) fn hget(&mut self, key: &str, field: &str) -> Result<Option<String>, WrongType> {
        Ok(self.hash(key)?.and_then(|h| h.get(field).cloned()))
    }

    pub(crate) fn hset(&mut self, key: &str, field: &str, value: &str) -> Result<(), WrongType> {
        if self.hash(key)?.is_none() {
            self.write(key, Data::Hash(HashMap::new()), None);
        }
        let h = self.hash(key)?.expect("made above");
        h.insert(field.to_owned(), value.to_owned());
        Ok(())
    }

    pub(crate) fn hdel(&mut self, key: &str, field: &str) -> Result<(), WrongType> {
        if let Some(h) = self.hash(key)? {
            h.remove(field);
        }
        self.drop_if_empty(key);
        Ok(())
    }

    /// The live keys that `matches` accepts.
    pub(crate) fn keys(&mut self, matches: impl Fn(&str) -> bool) -> Vec<String> {
        let now = Instant::now();
        self.entries
            .retain(|_, e| e.expires.is_none_or(|at| at > now));
        self.entries
            .keys()
            .filter(|k| matches(k))
            .cloned()
            .collect()
    }

    /// Writes `data` under `key`, without expiry (the script tables' set-up).
    #[cfg(test)]
    pub(crate) fn put(&mut self, key: &str, data: Data) {
        self.write(key, data, None);
    }

    /// `FLUSHALL`.
    #[cfg(test)]
    pub(crate) fn flush(&mut self) {
        self.entries.clear();
    }

    /// A hash's fields and values.
    #[cfg(test)]
    pub(crate) fn hgetall(&mut self, key: &str) -> Result<Vec<(String, String)>, WrongType> {
        Ok(self
            .hash(key)?
            .map(|h| h.iter().map(|(f, v)| (f.clone(), v.clone())).collect())
            .unwrap_or_default())
    }

    /// `PUBLISH`: the message goes out once the command that sent it is done.
    pub(crate) fn publish(&mut self, channel: &str, payload: &str) {
        self.published
            .push((channel.to_owned(), payload.to_owned()));
    }
}
