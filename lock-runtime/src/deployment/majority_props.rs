//! Properties of the majority rule over generated replies: any number of servers, any mix of
//! yes, no and failures, in any order of arrival. The table tests in `majority.rs` name the
//! cases; these check that no order of replies reaches a corner the table missed.

use proptest::prelude::*;

use super::majority::{Majority, Tally, Verdict};

/// One server's reply: `Some(answer)`, or `None` for a failed request (as [`Tally::of`] reads
/// replies that arrived).
type Reply = Option<bool>;

fn reply() -> impl Strategy<Value = Reply> {
    prop_oneof![Just(Some(true)), Just(Some(false)), Just(None)]
}

/// The replies of 1 to 9 servers, in the order they arrive.
fn replies() -> impl Strategy<Value = Vec<Reply>> {
    prop::collection::vec(reply(), 1..=9).prop_shuffle()
}

/// The tally of the first `k` replies of `all`, the others still to come.
fn prefix(all: &[Reply], k: usize) -> Tally {
    let arrived = all.iter().enumerate().map(|(i, r)| (i < k).then_some(*r));
    Tally::of(arrived)
}

/// The verdict once every server has replied as `so_far` did and then every one still to
/// answer replied `rest`.
fn completed(m: Majority, n: usize, so_far: Tally, rest: Reply) -> Verdict {
    let left = n - so_far.yes - so_far.no - so_far.failed;
    let mut t = so_far;
    match rest {
        Some(true) => t.yes += left,
        Some(false) => t.no += left,
        None => t.failed += left,
    }
    m.verdict(t)
}

proptest! {
    // A failing case is printed, not written into the source tree.
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// The quorum is `N/2 + 1` of the configured N: more than half, so that two quorums share
    /// a server, and never more than N, so that all servers saying yes is a grant.
    #[test]
    fn the_quorum_is_more_than_half_of_the_configured_n(n in 1usize..=64) {
        let m = Majority::of(n);
        prop_assert_eq!(m.needed(), n / 2 + 1);
        prop_assert!(2 * m.needed() > n && m.needed() <= n);
        prop_assert!(m.reached(m.needed()) && !m.reached(m.needed() - 1));
    }

    /// The tally counts each reply that arrived once, and no reply still to come.
    #[test]
    fn a_tally_counts_the_replies_that_arrived(all in replies(), k in 0usize..=9) {
        let k = k.min(all.len());
        let t = prefix(&all, k);
        let count = |r: Reply| all[..k].iter().filter(|x| **x == r).count();
        prop_assert_eq!((t.yes, t.no, t.failed), (count(Some(true)), count(Some(false)), count(None)));
    }

    /// A grant and a refusal are never both decided: a majority of yes leaves too few servers
    /// for the noes to decide, whatever failed. A grant needs `N/2 + 1` yes of the configured N,
    /// however many servers failed.
    #[test]
    fn granted_and_busy_are_never_both_decided(all in replies()) {
        let n = all.len();
        let m = Majority::of(n);
        for k in 0..=n {
            let t = prefix(&all, k);
            prop_assert!(!(t.yes >= m.needed() && t.no > n - m.needed()), "n {} {:?}", n, t);
            prop_assert_eq!(m.verdict(t) == Verdict::Yes, t.yes >= m.needed(), "n {} {:?}", n, t);
        }
    }

    /// A verdict reached on the first replies holds once all have arrived: a grant stays a
    /// grant, a refusal (noes) a refusal, and out-of-reach never turns into a grant (more noes
    /// may make it a refusal: either way the caller does not get the lock). With every reply
    /// in, the question is settled.
    #[test]
    fn a_verdict_on_the_first_replies_never_flips(all in replies()) {
        let n = all.len();
        let m = Majority::of(n);
        let last = m.verdict(prefix(&all, n));
        prop_assert_ne!(last, Verdict::Open, "n {} {:?}", n, all);
        for k in 0..=n {
            let early = m.verdict(prefix(&all, k));
            let holds = match early {
                Verdict::Open => true,
                Verdict::OutOfReach => matches!(last, Verdict::OutOfReach | Verdict::No),
                decided => last == decided,
            };
            prop_assert!(holds, "n {}: {:?} after {} replies, {:?} after all", n, early, k, last);
            prop_assert_eq!(m.settled(prefix(&all, k)), early != Verdict::Open);
        }
    }

    /// A question is open exactly while the replies still to come can decide whether it is a
    /// grant: all of them yes would grant it, all of them failures would not.
    #[test]
    fn open_means_the_rest_can_still_decide(all in replies(), k in 0usize..=9) {
        let n = all.len();
        let m = Majority::of(n);
        let t = prefix(&all, k.min(n));
        let grantable = completed(m, n, t, Some(true)) == Verdict::Yes;
        let refusable = completed(m, n, t, None) != Verdict::Yes;
        prop_assert_eq!(m.verdict(t) == Verdict::Open, grantable && refusable, "n {} {:?}", n, t);
    }
}
