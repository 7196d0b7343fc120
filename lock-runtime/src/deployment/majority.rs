//! The majority rule, in one place: of N servers, `N/2 + 1` must say yes; a question is settled
//! as soon as they have, or as soon as so many said no or failed that they no longer can.

/// How many servers said yes, said no, or failed, for one question (servers still to answer
/// are in none of them).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tally {
    pub yes: usize,
    pub no: usize,
    pub failed: usize,
}

impl Tally {
    /// `None`: no reply yet; `Some(None)`: the request failed; `Some(Some(answer))`.
    pub(crate) fn of(replies: impl Iterator<Item = Option<Option<bool>>>) -> Self {
        let mut t = Self::default();
        for reply in replies {
            match reply {
                Some(Some(true)) => t.yes += 1,
                Some(Some(false)) => t.no += 1,
                Some(None) => t.failed += 1,
                None => {}
            }
        }
        t
    }
}

/// What a tally says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A majority said yes.
    Yes,
    /// More than `N - needed` said no: a majority can no longer say yes, and the noes are
    /// the reason (the key is someone else's).
    No,
    /// Too many failed (with the noes) for a majority to say yes; the servers, not the key,
    /// are the reason.
    OutOfReach,
    /// Not settled yet: enough servers are still to answer.
    Open,
}

/// The majority rule of `n` servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Majority {
    n: usize,
    needed: usize,
}

impl Majority {
    pub(crate) fn of(n: usize) -> Self {
        Self {
            n,
            needed: n / 2 + 1,
        }
    }

    /// How many must say yes: `N/2 + 1` of the configured N (not of those that answer).
    pub(crate) fn needed(self) -> usize {
        self.needed
    }

    /// Whether `answered` servers that did not fail are a majority.
    pub(crate) fn reached(self, answered: usize) -> bool {
        answered >= self.needed
    }

    pub(crate) fn verdict(self, t: Tally) -> Verdict {
        if t.yes >= self.needed {
            Verdict::Yes
        } else if t.no > self.n - self.needed {
            Verdict::No
        } else if self.n - t.no - t.failed < self.needed {
            Verdict::OutOfReach
        } else {
            Verdict::Open
        }
    }

    /// Whether the question is settled: more replies cannot change the verdict.
    pub(crate) fn settled(self, t: Tally) -> bool {
        self.verdict(t) != Verdict::Open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_majority_of_n() {
        let needed: Vec<usize> = (1..=7).map(|n| Majority::of(n).needed()).collect();
        assert_eq!(needed, [1, 2, 2, 3, 3, 4, 4]);
    }

    #[test]
    fn verdicts() {
        use Verdict::*;
        let t = |yes, no, failed| Tally { yes, no, failed };
        // (n, tally, verdict)
        let table = [
            (1, t(0, 0, 0), Open),
            (1, t(1, 0, 0), Yes),
            (1, t(0, 1, 0), No),
            (1, t(0, 0, 1), OutOfReach),
            (3, t(1, 0, 0), Open),
            (3, t(2, 0, 0), Yes),
            (3, t(2, 1, 0), Yes),
            (3, t(1, 1, 0), Open),
            (3, t(0, 2, 0), No),
            (3, t(1, 2, 0), No),
            // One no and one failure: the last server cannot make a majority alone.
            (3, t(0, 1, 1), OutOfReach),
            (3, t(1, 1, 1), OutOfReach),
            (3, t(0, 0, 2), OutOfReach),
            (3, t(1, 0, 1), Open),
            (5, t(3, 2, 0), Yes),
            (5, t(2, 2, 0), Open),
            (5, t(2, 3, 0), No),
            (5, t(2, 2, 1), OutOfReach),
            (5, t(0, 0, 2), Open),
            (5, t(0, 0, 3), OutOfReach),
            (2, t(1, 0, 0), Open),
            (2, t(1, 1, 0), No),
            (2, t(2, 0, 0), Yes),
        ];
        for (n, tally, verdict) in table {
            let m = Majority::of(n);
            assert_eq!(m.verdict(tally), verdict, "n {n}: {tally:?}");
            assert_eq!(m.settled(tally), verdict != Open, "n {n}: {tally:?}");
        }
    }

    #[test]
    fn reached() {
        assert!(Majority::of(3).reached(2));
        assert!(!Majority::of(3).reached(1));
        assert!(Majority::of(1).reached(1));
        assert!(!Majority::of(4).reached(2));
    }
}
