//! Rows 1 and 2: uncontended cycles, one task and 64 tasks, and what they cost the server

use std::time::Duration;

use lock_testing::RedisServer;

use crate::Config;
use crate::compare::{Comparison, RUN_OF};
use crate::cycle::{Cycle, Target, future_sizes};
use crate::placement::Placement;
use crate::profile::per_cycle_profile;
use crate::report::{Report, Verdict, rate, us, verdict};

const FLOOR: &str = "SET NX PX + EVALSHA del";
const FENCED_FLOOR: &str = "SET NX PX and INCR pipelined + EVALSHA del";
/// The bound on the server CPU of the engine's cycle, as a multiple of the floor's.
const SERVER_CPU_TARGET: f64 = 1.3;

pub(crate) async fn uncontended(cfg: &Config, report: &mut Report) {
    eprintln!("rows 1-2: uncontended cycles");
    let server = RedisServer::start();
    let t = Target::connect(&server.url(), server.pid()).await;
    let placement = Placement::of(server.pid());
    let place = placement.short();
    report.context("affinity (rows 1-2)", placement.describe());

    let kinds = [
        Cycle::Floor,
        Cycle::FencedFloor,
        Cycle::ScriptFloor,
        Cycle::Rslock,
        Cycle::Acquire,
        Cycle::Run,
        Cycle::Attr,
        Cycle::AttrFenced,
    ];
    // Row 1's rates and ratios: every kind's cycles interleaved in one task. The separate slices
    // give the CPU figures (2d and the notes), and show what the placement does to row 1.
    let one = Comparison::interleaved(&t, &kinds, cfg.slice, cfg.rounds).await;
    let sliced = Comparison::run(&t, &kinds, 1, cfg.slice, cfg.rounds).await;
    let floor = format!("{} ({FLOOR})", rate(one.rate(Cycle::Floor)));
    let rows = [
        (
            "1a",
            "Locker::acquire + Lease::release",
            Cycle::Acquire,
            0.95,
        ),
        ("1b", "Locker::run, empty body", Cycle::Run, 0.95),
        (
            "1c",
            "#[distributed_lock], empty body, no guard",
            Cycle::Attr,
            0.93,
        ),
    ];
    for (id, case, kind, target) in rows {
        let ratio = one.ratio(kind, Cycle::Floor);
        report.row(
            id,
            &format!("uncontended, 1 task, {place}: {case}"),
            rate(one.rate(kind)),
            floor.clone(),
            one.ratio_text(kind, Cycle::Floor),
            &format!(">= {target:.2}"),
            verdict(ratio >= target),
        );
    }
    report.row(
        "1g",
        &format!("uncontended, 1 task, {place}: #[distributed_lock] with guard (fence read)"),
        rate(one.rate(Cycle::AttrFenced)),
        floor.clone(),
        one.ratio_text(Cycle::AttrFenced, Cycle::Floor),
        "(diagnostic)",
        Verdict::Info,
    );
    let fenced_floor = format!(
        "{} ({FENCED_FLOOR}; {} of the floor)",
        rate(one.rate(Cycle::FencedFloor)),
        one.ratio_text(Cycle::FencedFloor, Cycle::Floor)
    );
    let fenced = [
        ("1h", "Locker::acquire + Lease::release", Cycle::Acquire),
        ("1i", "#[distributed_lock] with guard", Cycle::AttrFenced),
    ];
    for (id, case, kind) in fenced {
        report.row(
            id,
            &format!("uncontended, 1 task, {place}: {case}, against the fenced floor"),
            rate(one.rate(kind)),
            fenced_floor.clone(),
            one.ratio_text(kind, Cycle::FencedFloor),
            ">= 0.95",
            verdict(one.ratio(kind, Cycle::FencedFloor) >= 0.95),
        );
    }
    report.row(
        "1d",
        &format!("uncontended, 1 task, {place}: floor + fence INCR + PUBLISH, as 2 scripts"),
        rate(one.rate(Cycle::ScriptFloor)),
        floor.clone(),
        one.ratio_text(Cycle::ScriptFloor, Cycle::Floor),
        "(diagnostic)",
        Verdict::Info,
    );
    let vs_rslock = one.ratio(Cycle::Attr, Cycle::Rslock);
    report.row(
        "1e",
        &format!("uncontended, 1 task, {place}: #[distributed_lock] vs rslock 0.10"),
        rate(one.rate(Cycle::Attr)),
        format!("{} (rslock lock + unlock)", rate(one.rate(Cycle::Rslock))),
        one.ratio_text(Cycle::Attr, Cycle::Rslock),
        ">= 1.00",
        verdict(vs_rslock >= 1.0),
    );
    report.row(
        "1f",
        &format!("uncontended, 1 task, {place}: rslock 0.10 lock + unlock"),
        rate(one.rate(Cycle::Rslock)),
        floor,
        one.ratio_text(Cycle::Rslock, Cycle::Floor),
        "(baseline)",
        Verdict::Info,
    );

    let kinds = [
        Cycle::Floor,
        Cycle::FencedFloor,
        Cycle::ScriptFloor,
        Cycle::Acquire,
        Cycle::Attr,
    ];
    let many = Comparison::run(&t, &kinds, 64, cfg.slice, cfg.rounds).await;
    let floor = format!(
        "{} (64 tasks, one multiplexed conn)",
        rate(many.rate(Cycle::Floor))
    );
    let acquire = many.ratio(Cycle::Acquire, Cycle::Floor);
    report.row(
        "2a",
        "64 tasks, distinct names, one Locker: acquire + release",
        rate(many.rate(Cycle::Acquire)),
        floor.clone(),
        many.ratio_text(Cycle::Acquire, Cycle::Floor),
        ">= 0.90",
        verdict(acquire >= 0.9),
    );
    report.row(
        "2b",
        "64 tasks, distinct names, one Locker: #[distributed_lock]",
        rate(many.rate(Cycle::Attr)),
        floor.clone(),
        many.ratio_text(Cycle::Attr, Cycle::Floor),
        "(>= 0.90)",
        if many.ratio(Cycle::Attr, Cycle::Floor) >= 0.9 {
            Verdict::Info
        } else {
            Verdict::Miss
        },
    );
    report.row(
        "2f",
        "64 tasks, distinct names, one Locker: acquire + release, against the fenced floor",
        rate(many.rate(Cycle::Acquire)),
        format!(
            "{} ({FENCED_FLOOR}, 64 tasks; {} of the floor)",
            rate(many.rate(Cycle::FencedFloor)),
            many.ratio_text(Cycle::FencedFloor, Cycle::Floor)
        ),
        many.ratio_text(Cycle::Acquire, Cycle::FencedFloor),
        "(diagnostic)",
        Verdict::Info,
    );
    report.row(
        "2c",
        "64 tasks: floor + fence INCR + PUBLISH, as 2 scripts",
        rate(many.rate(Cycle::ScriptFloor)),
        floor,
        many.ratio_text(Cycle::ScriptFloor, Cycle::Floor),
        "(diagnostic)",
        Verdict::Info,
    );
    for (id, tasks, cmp) in [("2d", "1 task", &sliced), ("2e", "64 tasks", &many)] {
        let ratio = cmp.server_cpu_ratio(Cycle::Attr, Cycle::Floor);
        report.row(
            id,
            &format!("server CPU per cycle, {tasks}, {place}: #[distributed_lock], no guard"),
            format!("{:.1} µs", cmp.cpu_us(Cycle::Attr).1),
            format!("{:.1} µs ({FLOOR})", cmp.cpu_us(Cycle::Floor).1),
            format!("{ratio:.2}"),
            &format!("<= {SERVER_CPU_TARGET:.2}"),
            verdict(ratio <= SERVER_CPU_TARGET),
        );
    }

    notes(&t, [&one, &sliced, &many], &placement, cfg.slice, report).await;
}

/// The round trip, what the placement does to separate slices, CPU and per-cycle profiles.
async fn notes(
    t: &Target,
    [one, sliced, many]: [&Comparison; 3],
    placement: &Placement,
    slice: Duration,
    report: &mut Report,
) {
    let rtt = Duration::from_secs_f64(0.5 / one.rate(Cycle::Floor));
    let mut text = format!(
        "1: one floor round trip took {} on average (two per cycle), {}. Row 1 interleaves the \
         kinds' cycles in one task (runs of {RUN_OF} of each kind, in a fresh random order each \
         step); in separate slices of {} ms each, as rows 2 and 6 run, 1c was {} and 1e {}",
        us(rtt),
        placement.describe(),
        slice.as_millis(),
        sliced.ratio_text(Cycle::Attr, Cycle::Floor),
        sliced.ratio_text(Cycle::Attr, Cycle::Rslock),
    );
    // Every other kind does at least the floor's work; faster than it means the cost of waking
    // threads across CPUs dominates (see the module docs of main.rs).
    let others = [
        Cycle::Rslock,
        Cycle::Acquire,
        Cycle::Run,
        Cycle::Attr,
        Cycle::AttrFenced,
    ];
    let faster = |cmp: &Comparison| others.iter().any(|&k| cmp.ratio(k, Cycle::Floor) > 1.05);
    if faster(sliced) {
        text.push_str(
            ". In those slices a cycle that does more work than the floor came out faster than \
             it: on this machine a sequential round trip depends on where the OS runs the \
             client's threads and the server (a virtual machine whose idle vCPUs take long to \
             wake), each slice draws its own placement, and separate slices compare placements, \
             not cycles",
        );
    }
    if faster(one) {
        text.push_str(
            ". WARNING: interleaved too, a cycle that does more work than the floor came out \
             faster than it; row 1 is not meaningful in that state. For reproducible sequential \
             figures run `BENCH_ONLY=1 taskset -c 0 cargo bench -p lock-bench` (client and \
             server on one CPU)",
        );
    }
    report.note(text);
    let cpu = |cmp: &Comparison, kinds: &[Cycle]| {
        kinds
            .iter()
            .map(|&k| {
                let (reads, writes) = cmp.server_io(k);
                format!(
                    "{} {} (server reads/writes {reads:.2}/{writes:.2}, {:.2} µs per EVALSHA)",
                    k.label(),
                    cmp.cpu_text(k),
                    cmp.script_us(k)
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    report.note(format!(
        "1, 2d: CPU µs per cycle, client / server (schedstat of every thread of this process and \
         of the redis-server process; a sequential cycle also pays for every wake-up), with the \
         server's read/write system calls per cycle (/proc/<pid>/io) and the µs each script call \
         ran (INFO commandstats: the script's work alone): {}",
        cpu(
            sliced,
            &[
                Cycle::Floor,
                Cycle::ScriptFloor,
                Cycle::Rslock,
                Cycle::Acquire,
                Cycle::Run,
                Cycle::Attr,
                Cycle::AttrFenced
            ]
        )
    ));
    report.note(format!(
        "2, 2e: CPU µs per cycle, client / server (pipelined, so close to the pure work; read/write \
         calls and script µs as above): {}",
        cpu(
            many,
            &[
                Cycle::Floor,
                Cycle::ScriptFloor,
                Cycle::Acquire,
                Cycle::Attr
            ]
        )
    ));
    let mut profile = Vec::new();
    for kind in [
        Cycle::Floor,
        Cycle::ScriptFloor,
        Cycle::Rslock,
        Cycle::Acquire,
        Cycle::Run,
        Cycle::Attr,
        Cycle::AttrFenced,
    ] {
        profile.push(format!(
            "{}: {}",
            kind.label(),
            per_cycle_profile(t, kind).await
        ));
    }
    let (attribute, acquire) = future_sizes(&t.locker);
    report.note(format!(
        "1/2: the future of one call is {attribute} bytes through the attribute and {acquire} \
         through Locker::acquire (moved, so copied, at every layer that awaits it)"
    ));
    report.note(format!(
        "1/2: per sequential uncontended cycle, client heap allocations, client thread context \
         switches (each is a thread parking or being woken) and server commands, with the µs \
         each call ran (INFO commandstats; commands run inside scripts count too, and a \
         script's µs include theirs): {}",
        profile.join("; ")
    ));
}
