//! Row 6: the uncontended cycle over a link that adds 100 µs each way, vs the floor over the same
//! link: the engine must add no round trip

use std::time::Duration;

use lock_testing::{FaultProxy, RedisServer};
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use crate::Config;
use crate::compare::Comparison;
use crate::cycle::{Cycle, Target};
use crate::delay_proxy::DelayProxy;
use crate::raw::raw_connection;
use crate::report::{Report, percentile, rate, us, verdict};

const EACH_WAY: Duration = Duration::from_micros(100);
const TARGET: f64 = 0.97;
/// Slices are this many times the usual ones: a cycle over the FaultProxy takes milliseconds.
const SLICE_FACTOR: u32 = 3;

/// Median round trip of 200 sequential PINGs through `url`.
async fn ping_p50(url: &str) -> Duration {
    let mut conn: MultiplexedConnection = raw_connection(url).await;
    let mut rtts = Vec::new();
    for i in 0..220 {
        let t0 = Instant::now();
        let _: () = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .expect("PING");
        // The first 20 warm the connection up.
        if i >= 20 {
            rtts.push(t0.elapsed());
        }
    }
    rtts.sort();
    percentile(&rtts, 50.0)
}

/// The floor and the attribute over `url`, with the same slices as the other rows but longer.
async fn compare_over(url: &str, server: &RedisServer, cfg: &Config) -> Comparison {
    let t = Target::connect(url, server.pid()).await;
    let kinds = [Cycle::Floor, Cycle::Attr];
    Comparison::run(&t, &kinds, 1, cfg.slice * SLICE_FACTOR, cfg.rounds).await
}

pub(crate) async fn slow_link(cfg: &Config, report: &mut Report) {
    eprintln!("row 6: uncontended cycle over a link that adds {EACH_WAY:?} each way");
    let server = RedisServer::start();
    let direct = ping_p50(&server.url()).await;

    let fault = FaultProxy::start(server.addr()).await;
    let fault_pass = ping_p50(&fault.url()).await;
    fault.delay(EACH_WAY);
    let fault_delayed = ping_p50(&fault.url()).await;
    let over_fault = compare_over(&fault.url(), &server, cfg).await;
    drop(fault);

    let precise_pass = ping_p50(&DelayProxy::start(server.addr(), Duration::ZERO).url()).await;
    let precise = DelayProxy::start(server.addr(), EACH_WAY);
    let precise_delayed = ping_p50(&precise.url()).await;
    let over_precise = compare_over(&precise.url(), &server, cfg).await;
    drop(precise);

    let links = [
        (
            "6a",
            "FaultProxy::delay(100 µs)",
            &over_fault,
            fault_delayed,
        ),
        (
            "6b",
            "a thread proxy, 100 µs each way",
            &over_precise,
            precise_delayed,
        ),
    ];
    let mut extra = Vec::new();
    for (id, link, cmp, rtt) in links {
        let ratio = cmp.ratio(Cycle::Attr, Cycle::Floor);
        report.row(
            id,
            &format!(
                "uncontended, 1 task, over {link} (PING {}): #[distributed_lock]",
                us(rtt)
            ),
            rate(cmp.rate(Cycle::Attr)),
            format!(
                "{} (floor over the same link)",
                rate(cmp.rate(Cycle::Floor))
            ),
            cmp.ratio_text(Cycle::Attr, Cycle::Floor),
            &format!(">= {TARGET:.2}"),
            verdict(ratio >= TARGET),
        );
        // One more round trip would lengthen the cycle by `rtt`; client work, by far less.
        let cycle = |kind| Duration::from_secs_f64(1.0 / cmp.rate(kind));
        let (floor, attr) = (cycle(Cycle::Floor), cycle(Cycle::Attr));
        extra.push(format!(
            "{id}: a cycle lasts {} (floor) and {} (attribute), {} more, against a round trip of {} \
             over this link",
            us(floor),
            us(attr),
            us(attr.saturating_sub(floor)),
            us(rtt)
        ));
    }
    let fault_injects = fault_delayed.saturating_sub(fault_pass);
    let why = if fault_injects > Duration::from_micros(500) {
        ", not 200 µs: it waits on tokio's timer, which counts whole milliseconds, so each \
         direction waits for a later millisecond tick"
    } else {
        ""
    };
    report.note(format!(
        "6: what the links really inject, from the median of 200 sequential PINGs: direct {}; \
         through FaultProxy in pass mode {}; FaultProxy::delay(100 µs) {} (the delay adds {} \
         per round trip{why}); the thread proxy of this program with no delay {}, with 100 µs \
         each way {} (the delay adds {}; its threads end each timed sleep early by how late such \
         sleeps wake on average). {}",
        us(direct),
        us(fault_pass),
        us(fault_delayed),
        us(fault_injects),
        us(precise_pass),
        us(precise_delayed),
        us(precise_delayed.saturating_sub(precise_pass)),
        extra.join("; ")
    ));
}
