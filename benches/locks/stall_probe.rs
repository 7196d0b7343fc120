//! A plain thread that sleeps 5 ms again and again through a hand-off run and keeps its longest
//! overrun. It touches neither tokio nor Redis, so a long overrun means nothing ran it for that
//! long: a stall of the machine (a vCPU the hypervisor did not run, say) or CPUs kept busy by
//! something else, which stretched the waits of that run too.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Long enough to cost nothing measurable (200 wake-ups a second), short enough that a stall of
/// a few milliseconds shows.
const NAP: Duration = Duration::from_millis(5);

pub(crate) struct StallProbe {
    done: Arc<AtomicBool>,
    thread: JoinHandle<Duration>,
}

impl StallProbe {
    pub(crate) fn start() -> StallProbe {
        let done = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&done);
        let thread = std::thread::spawn(move || {
            let mut longest = Duration::ZERO;
            while !flag.load(Ordering::Relaxed) {
                let before = Instant::now();
                std::thread::sleep(NAP);
                longest = longest.max(before.elapsed().saturating_sub(NAP));
            }
            longest
        });
        StallProbe { done, thread }
    }

    /// Ends the thread (within one nap, which blocks the caller's worker that long); its
    /// longest overrun of a nap.
    pub(crate) fn finish(self) -> Duration {
        self.done.store(true, Ordering::Relaxed);
        self.thread.join().expect("stall probe")
    }
}
