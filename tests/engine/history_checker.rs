//! The fenced store's history checker, on histories written by hand: it reports overlapping
//! holds, lost updates and stale writes accepted, tells refused stale writes and cancelled
//! bodies apart from overlaps, and sorts out-of-order input; for a name with N permits, more
//! than N inside at once; for a read-write lock, an exclusive hold inside with a shared one; for
//! a name held in several modes, holds of modes that exclude each other inside at once.

use crate::support;

use support::history::{Event, HoldMode, check};

fn enter_as(seq: u64, client: &str, fence: u64, mode: HoldMode) -> Event {
    Event::Enter {
        seq,
        client: client.into(),
        fence,
        basis: 0,
        mode,
    }
}

fn leave(seq: u64, client: &str, fence: u64) -> Event {
    Event::Leave {
        seq,
        client: client.into(),
        fence,
    }
}

#[test]
fn checker_reports_overlaps_lost_updates_and_stale_writes() {
    let enter = |seq, client: &str, fence, basis| Event::Enter {
        seq,
        client: client.into(),
        fence,
        basis,
        mode: HoldMode::Exclusive,
    };
    let write = |seq, client: &str, fence, basis, accepted| Event::Write {
        seq,
        client: client.into(),
        fence,
        basis,
        accepted,
    };
    // Two clean sections, one after the other.
    let clean = check(&[
        enter(1, "a", 1, 0),
        write(2, "a", 1, 0, true),
        enter(3, "b", 2, 1),
        write(4, "b", 2, 1, true),
    ]);
    assert_eq!(
        (clean.overlaps.len(), clean.violations(), clean.final_value),
        (0, 0, 2)
    );
    assert!(clean.fences_increasing);
    // Two holders read the counter, `a` under fence 1, then `b` under fence 2; then both write:
    // each write as (client, fence, accepted), in the order they reach the store.
    let both_read_then_write = |first: (&str, u64, bool), second: (&str, u64, bool)| {
        check(&[
            enter(1, "a", 1, 0),
            enter(2, "b", 2, 0),
            write(3, first.0, first.1, 0, first.2),
            write(4, second.0, second.1, 0, second.2),
        ])
    };
    // A stale holder (fence 1) writes after a newer one (fence 2) read and wrote: refused.
    let fenced = both_read_then_write(("b", 2, true), ("a", 1, false));
    assert_eq!(
        (
            fenced.overlaps.len(),
            fenced.unsafe_overlaps,
            fenced.refused.len()
        ),
        (1, 0, 1)
    );
    assert_eq!(fenced.violations(), 0);
    // The same history with the stale write accepted: an overlap, a lost update, a stale write.
    let unfenced = both_read_then_write(("b", 2, true), ("a", 1, true));
    assert_eq!(unfenced.unsafe_overlaps, 1);
    assert_eq!(unfenced.lost_updates, vec![4]);
    assert_eq!(unfenced.stale_accepted, vec![4]);
    // Two holders inside at once with increasing fences: the second write lost the first one's update.
    let overlap = both_read_then_write(("a", 1, true), ("b", 2, true));
    assert_eq!(
        (overlap.unsafe_overlaps, overlap.lost_updates.len()),
        (1, 1)
    );
    // A body cancelled after its read is incomplete, not an overlap; out-of-order input is sorted.
    let cancelled = check(&[
        enter(3, "b", 2, 0),
        write(4, "b", 2, 0, true),
        enter(1, "a", 1, 0),
    ]);
    assert_eq!(
        (
            cancelled.incomplete,
            cancelled.overlaps.len(),
            cancelled.violations()
        ),
        (1, 0, 0)
    );
}

/// Three permit holds inside at once pass with 3 permits; a fourth entering before any left is
/// one crowd (a violation); with 2 permits the same clean history is crowded. Holds without an
/// end are not counted, and `excuse` takes a hold out of the count.
#[test]
fn checker_reports_more_permit_holders_than_permits() {
    let permits = |n| {
        let p = HoldMode::Permit(n);
        [
            enter_as(1, "a", 1, p),
            enter_as(2, "b", 2, p),
            enter_as(3, "c", 3, p),
            leave(4, "a", 1),
            enter_as(5, "d", 4, p),
            leave(6, "b", 2),
            leave(7, "c", 3),
            leave(8, "d", 4),
            // Cancelled inside: no end, not counted.
            enter_as(9, "e", 5, p),
        ]
    };
    let three = permits(3);
    let clean = check(&three);
    assert_eq!(
        (clean.violations(), clean.most_inside, clean.incomplete),
        (0, 3, 1),
        "{clean}"
    );
    // No lock's checks apply to permit holds: no overlaps, no writes.
    assert_eq!((clean.overlaps.len(), clean.accepted), (0, 0));
    let told_two = check(&permits(2));
    assert_eq!(told_two.crowds.len(), 2, "{told_two}");

    // `d` enters while `a`, `b` and `c` are all inside.
    let mut four = three.to_vec();
    four[3] = leave(5, "a", 1);
    four[4] = enter_as(4, "d", 4, HoldMode::Permit(3));
    let mut crowded = check(&four);
    assert_eq!(crowded.violations(), 1, "{crowded}");
    assert_eq!(crowded.crowds[0].seq, 4);
    assert_eq!(crowded.crowds[0].inside.len(), 4);
    assert_eq!(crowded.most_inside, 4);
    // Its key deleted under it, `a` stayed in until it learnt: excused, the crowd is gone.
    crowded.excuse(|h| h.client == "a");
    assert_eq!((crowded.violations(), crowded.excused), (0, 1), "{crowded}");
}

/// A read-write lock: shared holds inside together pass, an exclusive hold alone passes; an
/// exclusive hold inside with a shared one is a crowd, whichever entered first.
#[test]
fn checker_reports_an_exclusive_hold_inside_with_any_other() {
    let (s, x) = (HoldMode::Shared, HoldMode::Exclusive);
    let clean = check(&[
        enter_as(1, "r1", 1, s),
        enter_as(2, "r2", 2, s),
        leave(3, "r1", 1),
        enter_as(4, "r3", 3, s),
        leave(5, "r2", 2),
        leave(6, "r3", 3),
        enter_as(7, "w", 4, x),
        leave(8, "w", 4),
        enter_as(9, "r4", 5, s),
        leave(10, "r4", 5),
    ]);
    assert_eq!((clean.violations(), clean.most_inside), (0, 2), "{clean}");
    // A writer enters while a reader is inside; a reader enters while a writer is inside.
    let writer_joins = check(&[
        enter_as(1, "r1", 1, s),
        enter_as(2, "w", 2, x),
        leave(3, "r1", 1),
        leave(4, "w", 2),
    ]);
    assert_eq!(writer_joins.violations(), 1, "{writer_joins}");
    let reader_joins = check(&[
        enter_as(1, "w", 1, x),
        enter_as(2, "r1", 2, s),
        enter_as(3, "r2", 3, s),
        leave(4, "w", 1),
        leave(5, "r1", 2),
        leave(6, "r2", 3),
    ]);
    assert_eq!(reader_joins.crowds.len(), 2, "{reader_joins}");
    assert_eq!(reader_joins.violations(), 2);
    // Two writers that leave without writing: only this check sees them.
    let two_writers = check(&[
        enter_as(1, "w1", 1, x),
        enter_as(2, "w2", 2, x),
        leave(3, "w1", 1),
        leave(4, "w2", 2),
    ]);
    assert_eq!(two_writers.violations(), 1, "{two_writers}");
}

/// One name held in several modes: holds of modes that agree, one after the other, pass; an
/// exclusive hold inside with a permit, a shared hold with a permit, and permits of 3 with a
/// permit of 2 are each a crowd, whichever entered first. A crowd of a hold that `excuse` takes
/// out (its key was taken under it) is gone.
#[test]
fn checker_reports_holds_of_modes_that_exclude_each_other() {
    let (x, s, p2, p3) = (
        HoldMode::Exclusive,
        HoldMode::Shared,
        HoldMode::Permit(2),
        HoldMode::Permit(3),
    );
    let clean = check(&[
        enter_as(1, "p3a", 1, p3),
        enter_as(2, "p3b", 2, p3),
        enter_as(3, "p3c", 3, p3),
        leave(4, "p3a", 1),
        leave(5, "p3b", 2),
        leave(6, "p3c", 3),
        enter_as(7, "r1", 4, s),
        enter_as(8, "r2", 5, s),
        leave(9, "r1", 4),
        leave(10, "r2", 5),
        enter_as(11, "w", 6, x),
        leave(12, "w", 6),
        enter_as(13, "p2a", 7, p2),
        enter_as(14, "p2b", 8, p2),
        leave(15, "p2a", 7),
        leave(16, "p2b", 8),
    ]);
    assert_eq!((clean.violations(), clean.most_inside), (0, 3), "{clean}");
    // Two holds of modes `a` and `b`, the second entering while the first is inside.
    let pair = |a, b| {
        check(&[
            enter_as(1, "a", 1, a),
            enter_as(2, "b", 2, b),
            leave(3, "a", 1),
            leave(4, "b", 2),
        ])
    };
    for (a, b) in [(x, p3), (p3, x), (s, p3), (p2, s), (p3, p2), (p2, p3)] {
        let report = pair(a, b);
        assert_eq!(report.violations(), 1, "{a} then {b}: {report}");
        assert_eq!(report.crowds[0].inside, [0, 1], "{a} then {b}: {report}");
    }
    // Agreeing modes are no crowd: permits of one N, shared holds.
    for (a, b) in [(p2, p2), (p3, p3), (s, s)] {
        assert_eq!(pair(a, b).violations(), 0, "{a} with {b}");
    }
    let mut excused = pair(p3, x);
    excused.excuse(|h| h.client == "a");
    assert_eq!((excused.violations(), excused.excused), (0, 1), "{excused}");
}
