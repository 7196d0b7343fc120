//! The rules between the durations of one lock (`ttl`, `lease`, `max_exec`, `renew`, `min_hold`), written
//! once. `lock-macros` checks them when `#[distributed_lock]` compiles and `lock-runtime` when
//! `LockOptions` are used, so both accept the same options and say the same words about the rest.
//! Use them through `lock-runtime`; this crate exists because the proc-macro crate cannot depend
//! on the runtime (the runtime depends on it).
//!
//! Everything is in whole milliseconds, the unit Redis keeps expiries in.

use std::fmt;

/// The shortest lease: below it, the default `max_exec = ttl - drift` would leave the body no time.
pub const MIN_TTL_MS: u64 = 3;

/// The longest lease: 100 years (36500d). Redis takes an expiry only while it stays within its
/// clock's range in milliseconds; a bound far inside that range keeps every deadline computed
/// from a ttl representable too.
pub const MAX_TTL_MS: u64 = 36_500 * 86_400_000;

/// The clock drift allowed for a lease of `ttl_ms`: `ttl/100 + 2ms` (clock rates may differ by 1%,
/// plus a little for the round trip). A lease is valid until `ttl - drift` after it was granted.
pub const fn drift_ms(ttl_ms: u64) -> u64 {
    ttl_ms / 100 + 2
}

/// The default and largest `max_exec`: `ttl - drift`, so that the body always ends before the key
/// can expire.
pub const fn default_max_exec_ms(ttl_ms: u64) -> u64 {
    ttl_ms.saturating_sub(drift_ms(ttl_ms))
}

/// The default renewal period: a third of the key's expiry (`lease`, which is `ttl` unless given),
/// two tries at renewing before the key could expire.
pub const fn default_renew_ms(lease_ms: u64) -> u64 {
    lease_ms / 3
}

/// The most holders a lock with `permits = N` may have at once: an acquire looks at each permit.
pub const MAX_PERMITS: u64 = 1_000;

/// What is wrong with `permits = N`, if anything: `1 <= N <= 1000` (1 is a lock).
pub fn check_permits(permits: u64) -> Option<String> {
    (permits == 0 || permits > MAX_PERMITS).then(|| {
        format!(
            "permits = {permits} is out of range: it is how many holders may hold the lock at \
             once, from 1 (a lock) to {MAX_PERMITS}"
        )
    })
}

/// Why `shared` cannot go with these `permits`, if it cannot: a shared hold is of a read-write
/// lock, which has no permits.
pub fn check_shared(shared: bool, permits: u64) -> Option<String> {
    (shared && permits != 1).then(|| {
        format!(
            "shared cannot go with permits = {permits}: a shared hold is one of many readers of a \
             read-write lock, which has no permits; use one or the other"
        )
    })
}

/// Why `fail_open` cannot go with these options, if it cannot. A body that runs unlocked when
/// Redis is unreachable must not need what only a lock gives: a fence (`guard`, which hands the
/// body its lease) or a bound on how many run at once (`permits`).
pub fn check_fail_open(fail_open: bool, permits: u64, guard: bool) -> Option<String> {
    if !fail_open {
        return None;
    }
    if guard {
        return Some(
            "fail_open cannot go with guard: a body that reads its lease needs a fence, and a \
             run without Redis has none; drop guard, or drop fail_open to skip the run while \
             Redis is unreachable"
                .to_owned(),
        );
    }
    (permits != 1).then(|| {
        format!(
            "fail_open cannot go with permits = {permits}: without Redis nothing bounds how many \
             run at once; drop fail_open, or use a lock (no permits)"
        )
    })
}

/// An option that a rule can blame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DurationKey {
    /// `ttl`: how long one hold may last in all.
    Ttl,
    /// `lease`: the key's expiry, renewed while the body runs.
    Lease,
    /// `max_exec`: how long the body may run.
    MaxExec,
    /// `renew`: the renewal period.
    Renew,
    /// `min_hold`: how long the key is kept at least.
    MinHold,
}

impl DurationKey {
    /// The option's name as users write it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Ttl => "ttl",
            Self::Lease => "lease",
            Self::MaxExec => "max_exec",
            Self::Renew => "renew",
            Self::MinHold => "min_hold",
        }
    }
}

impl fmt::Display for DurationKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The durations of one lock in milliseconds; `None` for an option left at its default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Durations {
    /// How long one hold may last in all.
    pub ttl: u64,
    /// The key's expiry, renewed while the body runs (default: `ttl`).
    pub lease: Option<u64>,
    /// The body's time limit (default [`default_max_exec_ms`]).
    pub max_exec: Option<u64>,
    /// The renewal period (default [`default_renew_ms`]).
    pub renew: Option<u64>,
    /// The minimum hold (default 0).
    pub min_hold: Option<u64>,
}

/// One broken rule: the option to blame and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    /// The option whose value breaks the rule.
    pub key: DurationKey,
    /// What is wrong and what to do, naming the option and its value.
    pub message: String,
}

/// Every rule the durations break, in the order `ttl`, `lease`, `max_exec`, `renew`, `min_hold`:
///
/// - `3ms <= ttl <= 36500d`, so that `ttl - drift` is above zero and Redis can keep the key
///   (when it fails, nothing else is checked: every other rule is relative to ttl);
/// - `3ms <= lease <= ttl`: the key's expiry, which bounds how long a crashed holder blocks the
///   lock, is at most the whole hold;
/// - `0 < max_exec <= ttl - drift`, so the body is stopped before the hold can outlast `ttl`;
/// - `0 < renew <= lease / 2`, so a failed renewal can be retried before the key expires (not
///   checked against a broken `lease`);
/// - `min_hold <= ttl`, since the key cannot be kept past the hold.
pub fn check(durations: Durations) -> Vec<Broken> {
    if let Some(ttl) = check_ttl(durations.ttl) {
        return vec![ttl];
    }
    let lease = check_lease(durations.ttl, durations.lease);
    let renew = match lease {
        Some(_) => None,
        None => check_renew(durations.ttl, durations.lease, durations.renew),
    };
    [
        lease,
        check_max_exec(durations.ttl, durations.max_exec),
        renew,
        check_min_hold(durations.ttl, durations.min_hold),
    ]
    .into_iter()
    .flatten()
    .collect()
}

fn broken(key: DurationKey, message: String) -> Option<Broken> {
    Some(Broken { key, message })
}

fn check_ttl(ttl: u64) -> Option<Broken> {
    if ttl < MIN_TTL_MS {
        return broken(
            DurationKey::Ttl,
            format!(
                "ttl = {} is too short: the body may run for ttl - (ttl/100 + 2ms), so ttl must be at \
                 least {}; raise ttl",
                format_ms(ttl),
                format_ms(MIN_TTL_MS)
            ),
        );
    }
    if ttl > MAX_TTL_MS {
        return broken(
            DurationKey::Ttl,
            format!(
                "ttl = {} is too long: Redis cannot keep a key for that long, and a lock should \
                 not need it; use at most {} (a lease is renewed while its body runs)",
                format_ms(ttl),
                format_ms(MAX_TTL_MS)
            ),
        );
    }
    None
}

fn check_lease(ttl: u64, lease: Option<u64>) -> Option<Broken> {
    match lease? {
        lease if lease < MIN_TTL_MS => broken(
            DurationKey::Lease,
            format!(
                "lease = {} is too short: a lease is valid for lease - (lease/100 + 2ms), so it \
                 must be at least {}; raise lease",
                format_ms(lease),
                format_ms(MIN_TTL_MS)
            ),
        ),
        lease if lease > ttl => broken(
            DurationKey::Lease,
            format!(
                "lease = {} must be at most ttl = {}: the key's expiry cannot outlast the whole \
                 hold; lower lease or raise ttl",
                format_ms(lease),
                format_ms(ttl)
            ),
        ),
        _ => None,
    }
}

fn check_max_exec(ttl: u64, max_exec: Option<u64>) -> Option<Broken> {
    let limit = default_max_exec_ms(ttl);
    match max_exec? {
        0 => broken(
            DurationKey::MaxExec,
            "max_exec must be above zero: it is how long the body may run; leave it out for the \
             default, ttl - (ttl/100 + 2ms)"
                .to_owned(),
        ),
        max if max > limit => broken(
            DurationKey::MaxExec,
            format!(
                "max_exec = {} is too long for ttl = {}: it must be at most ttl - (ttl/100 + 2ms) = {}, \
                 so the body is stopped before the key can expire; lower max_exec or raise ttl",
                format_ms(max),
                format_ms(ttl),
                format_ms(limit)
            ),
        ),
        _ => None,
    }
}

/// Against the key's expiry: `lease`, or `ttl` when no lease is given.
fn check_renew(ttl: u64, lease: Option<u64>, renew: Option<u64>) -> Option<Broken> {
    let (name, expiry) = lease.map_or(("ttl", ttl), |lease| ("lease", lease));
    match renew? {
        0 => broken(
            DurationKey::Renew,
            format!(
                "renew must be above zero: it is how often the lease is renewed; leave it out for \
                 the default, {name}/3"
            ),
        ),
        // `every > expiry / 2` without rounding down (and without overflowing `every * 2`).
        every if u128::from(every) * 2 > u128::from(expiry) => broken(
            DurationKey::Renew,
            format!(
                "renew = {} is too long for {name} = {}: renew at least twice per lease (renew <= \
                 {name}/2), so a failed renewal can be retried before the key expires; lower renew \
                 or raise {name}",
                format_ms(every),
                format_ms(expiry)
            ),
        ),
        _ => None,
    }
}

fn check_min_hold(ttl: u64, min_hold: Option<u64>) -> Option<Broken> {
    let hold = min_hold.filter(|hold| *hold > ttl)?;
    broken(
        DurationKey::MinHold,
        format!(
            "min_hold = {} must be at most ttl = {}: the key cannot be kept past its lease; lower \
             min_hold or raise ttl",
            format_ms(hold),
            format_ms(ttl)
        ),
    )
}

/// Milliseconds the way durations are written in the attribute: `"1m 30s"`, `"29s 698ms"`.
pub fn format_ms(ms: u64) -> String {
    const UNITS: [(u64, &str); 5] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
        (1, "ms"),
    ];
    if ms == 0 {
        return "0s".to_owned();
    }
    let mut rest = ms;
    let mut parts = Vec::new();
    for (size, unit) in UNITS {
        if rest >= size {
            parts.push(format!("{}{unit}", rest / size));
            rest %= size;
        }
    }
    parts.join(" ")
}

/// One row of the rules' test table: durations and the options they should blame, in order.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub durations: Durations,
    pub blamed: &'static [DurationKey],
}

const fn case(
    ttl: u64,
    max_exec: Option<u64>,
    renew: Option<u64>,
    min_hold: Option<u64>,
    blamed: &'static [DurationKey],
) -> Case {
    Case {
        durations: Durations {
            ttl,
            lease: None,
            max_exec,
            renew,
            min_hold,
        },
        blamed,
    }
}

/// A case with a `lease`.
const fn leased(ttl: u64, lease: u64, renew: Option<u64>, blamed: &'static [DurationKey]) -> Case {
    let mut case = case(ttl, None, renew, None, blamed);
    case.durations.lease = Some(lease);
    case
}

/// The table that the macro's tests and the runtime's tests both run, so that the attribute and
/// `LockOptions` are seen to accept and reject the same options. Not a public API.
#[doc(hidden)]
pub const CASES: &[Case] = {
    use DurationKey::{Lease, MaxExec, MinHold, Renew, Ttl};
    &[
        // ttl: at least 3ms; when it is too short nothing else is judged.
        case(0, None, None, None, &[Ttl]),
        case(2, None, None, None, &[Ttl]),
        case(2, Some(0), Some(9), Some(9), &[Ttl]),
        case(3, None, None, None, &[]),
        case(30_000, None, None, None, &[]),
        // ttl: at most 100 years.
        case(MAX_TTL_MS, None, None, None, &[]),
        case(MAX_TTL_MS + 1, Some(0), None, None, &[Ttl]),
        case(2 * MAX_TTL_MS, None, None, None, &[Ttl]),
        // max_exec <= ttl - drift. ttl 3ms: drift 2ms, limit 1ms.
        case(3, Some(1), None, None, &[]),
        case(3, Some(2), None, None, &[MaxExec]),
        // ttl 150ms: drift = 1 + 2 ms (ttl/100 rounds down), limit 147ms.
        case(150, Some(147), None, None, &[]),
        case(150, Some(148), None, None, &[MaxExec]),
        // ttl 30s: drift = 300 + 2 ms, limit 29_698ms.
        case(30_000, Some(29_698), None, None, &[]),
        case(30_000, Some(29_699), None, None, &[MaxExec]),
        case(30_000, Some(0), None, None, &[MaxExec]),
        // 0 < renew <= ttl/2, with ttl/2 not rounded: 3ms / 2 = 1.5ms.
        case(3, None, Some(1), None, &[]),
        case(3, None, Some(2), None, &[Renew]),
        case(30_000, None, Some(15_000), None, &[]),
        case(30_000, None, Some(15_001), None, &[Renew]),
        case(30_000, None, Some(0), None, &[Renew]),
        case(30_000, None, Some(31_536_000_000), None, &[Renew]),
        // min_hold <= ttl.
        case(30_000, None, None, Some(0), &[]),
        case(30_000, None, None, Some(30_000), &[]),
        case(30_000, None, None, Some(30_001), &[MinHold]),
        // 3ms <= lease <= ttl; 0 < renew <= lease/2.
        leased(7_200_000, 30_000, None, &[]),
        leased(7_200_000, 3, None, &[]),
        leased(7_200_000, 2, None, &[Lease]),
        leased(30_000, 30_000, None, &[]),
        leased(30_000, 30_001, None, &[Lease]),
        leased(7_200_000, 30_000, Some(15_000), &[]),
        leased(7_200_000, 30_000, Some(15_001), &[Renew]),
        leased(7_200_000, 30_000, Some(0), &[Renew]),
        // A broken lease: renew is not judged against it.
        leased(30_000, 60_000, Some(29_000), &[Lease]),
        leased(2, 1, None, &[Ttl]),
        // Every rule at once, and every option at its limit.
        case(
            1_000,
            Some(1_000),
            Some(600),
            Some(2_000),
            &[MaxExec, Renew, MinHold],
        ),
        case(1_000, Some(988), Some(500), Some(1_000), &[]),
        case(
            86_400_000,
            Some(85_535_998),
            Some(43_200_000),
            Some(86_400_000),
            &[],
        ),
    ]
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_holds() {
        for case in CASES {
            let blamed: Vec<DurationKey> = check(case.durations).iter().map(|b| b.key).collect();
            assert_eq!(blamed, case.blamed, "{case:?}");
        }
    }

    #[test]
    fn huge_values_do_not_overflow() {
        let huge = Durations {
            ttl: u64::MAX,
            lease: Some(u64::MAX),
            max_exec: Some(u64::MAX),
            renew: Some(u64::MAX),
            min_hold: Some(u64::MAX),
        };
        let blamed: Vec<DurationKey> = check(huge).iter().map(|b| b.key).collect();
        assert_eq!(blamed, [DurationKey::Ttl]);
        let huge = Durations {
            ttl: MAX_TTL_MS,
            ..huge
        };
        let blamed: Vec<DurationKey> = check(huge).iter().map(|b| b.key).collect();
        assert_eq!(
            blamed,
            [
                DurationKey::Lease,
                DurationKey::MaxExec,
                DurationKey::MinHold
            ]
        );
    }

    #[test]
    fn defaults_and_drift() {
        assert_eq!(drift_ms(0), 2);
        assert_eq!(drift_ms(150), 3);
        assert_eq!(drift_ms(30_000), 302);
        assert_eq!(default_max_exec_ms(30_000), 29_698);
        assert_eq!(default_max_exec_ms(MIN_TTL_MS), 1);
        assert_eq!(default_max_exec_ms(1), 0);
        assert_eq!(default_renew_ms(30_000), 10_000);
        // The defaults always pass the rules.
        for ttl in [MIN_TTL_MS, 4, 99, 100, 101, 150, 1_000, 30_000, 86_400_000] {
            let durations = Durations {
                ttl,
                lease: None,
                max_exec: Some(default_max_exec_ms(ttl)),
                renew: Some(default_renew_ms(ttl)),
                min_hold: Some(0),
            };
            assert_eq!(check(durations), [], "ttl {ttl}");
        }
    }

    #[test]
    fn messages_name_the_option_its_value_and_what_to_do() {
        let message = |d| check(d).remove(0).message;
        let too_long = message(Durations {
            ttl: 30_000,
            max_exec: Some(30_000),
            ..Durations::default()
        });
        assert!(
            too_long.starts_with("max_exec = 30s is too long for ttl = 30s")
                && too_long.contains("= 29s 698ms")
                && too_long.ends_with("lower max_exec or raise ttl"),
            "{too_long}"
        );
        let short = message(Durations {
            ttl: 1,
            ..Durations::default()
        });
        assert!(
            short.starts_with("ttl = 1ms is too short") && short.contains("at least 3ms"),
            "{short}"
        );
        for broken in check(Durations {
            ttl: 1_000,
            lease: Some(2),
            max_exec: Some(0),
            renew: Some(0),
            min_hold: Some(1_001),
        }) {
            assert!(broken.message.starts_with(broken.key.name()), "{broken:?}");
        }
    }

    #[test]
    fn permits_are_from_one_to_the_most() {
        assert!(check_permits(1).is_none());
        assert!(check_permits(MAX_PERMITS).is_none());
        for bad in [0, MAX_PERMITS + 1, u64::MAX] {
            let message = check_permits(bad).unwrap();
            assert!(
                message.starts_with(&format!("permits = {bad} ")),
                "{message}"
            );
        }
    }

    #[test]
    fn fail_open_goes_only_with_bodies_that_need_no_lock() {
        // (fail_open, permits, guard) -> the words the refusal must contain.
        let table: [(bool, u64, bool, Option<&str>); 6] = [
            (false, 5, true, None),
            (true, 1, false, None),
            (true, 1, true, Some("with guard")),
            (true, 3, false, Some("with permits = 3")),
            (true, 3, true, Some("with guard")),
            (false, 1, false, None),
        ];
        for (fail_open, permits, guard, refused) in table {
            let message = check_fail_open(fail_open, permits, guard);
            match (refused, message) {
                (None, None) => {}
                (Some(words), Some(message)) => {
                    assert!(message.starts_with("fail_open cannot go "), "{message}");
                    assert!(message.contains(words), "{message}");
                }
                (want, got) => panic!("{fail_open} {permits} {guard}: {want:?} vs {got:?}"),
            }
        }
    }

    #[test]
    fn shared_goes_with_one_permit_only() {
        assert!(check_shared(false, 3).is_none());
        assert!(check_shared(true, 1).is_none());
        for permits in [0, 2, MAX_PERMITS] {
            let message = check_shared(true, permits).unwrap();
            assert!(
                message.starts_with(&format!("shared cannot go with permits = {permits}:")),
                "{message}"
            );
        }
    }

    #[test]
    fn formats_like_the_attribute_is_written() {
        assert_eq!(format_ms(0), "0s");
        assert_eq!(format_ms(7), "7ms");
        assert_eq!(format_ms(29_698), "29s 698ms");
        assert_eq!(format_ms(90_000), "1m 30s");
        assert_eq!(format_ms(86_400_000 + 3_600_000 + 1), "1d 1h 1ms");
    }
}
