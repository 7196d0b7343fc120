//! What one sequential cycle costs besides time: allocations, context switches, server commands

use crate::alloc::counting_allocs;
use crate::cycle::{Cycle, Target, cycle_name, one_cycle};
use crate::raw::{command_stats, reads_stats, reset_stats};
use crate::threads::ThreadClock;

/// Client heap allocations, client context switches and server commands (with the µs each call
/// ran) per cycle of `kind`, over 1000 sequential cycles.
pub(crate) async fn per_cycle_profile(t: &Target, kind: Cycle) -> String {
    const N: u64 = 1000;
    let mut raw = t.raw.clone();
    reset_stats(&mut raw).await;
    let name = cycle_name(kind, 999);
    let key = t.locker.key_of(&name);
    let clock = ThreadClock::start("self", None);
    let ((), allocs, _) = counting_allocs(async {
        for seq in 0..N {
            one_cycle(t, &mut raw, kind, &name, &key, (999 << 40) | seq).await;
        }
    })
    .await;
    let (_, switches) = clock.elapsed();
    let mut stats = command_stats(&mut raw).await;
    stats.retain(|(name, _, _)| !reads_stats(name));
    stats.sort();
    let commands = stats
        .iter()
        .map(|(name, calls, usec)| {
            let per_call = *usec as f64 / (*calls).max(1) as f64;
            format!("{name} {:.0} ({per_call:.2} µs)", *calls as f64 / N as f64)
        })
        .collect::<Vec<_>>()
        .join(" ");
    format!(
        "{:.0} allocations, {:.1} context switches; server: {commands}",
        allocs as f64 / N as f64,
        switches as f64 / N as f64
    )
}
