//! The fenced store's history checker, on histories written by hand: it reports overlapping
//! holds, lost updates and stale writes accepted, tells refused stale writes and cancelled
//! bodies apart from overlaps, and sorts out-of-order input.

pub mod support;

#[test]
fn checker_reports_overlaps_lost_updates_and_stale_writes() {
    use support::history::{Event, check};
    let enter = |seq, client: &str, fence, basis| Event::Enter {
        seq,
        client: client.into(),
        fence,
        basis,
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
