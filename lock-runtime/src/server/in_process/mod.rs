//! The scripts' twins for the server in this process (`Locker::in_memory`): each script of
//! `lua/` has one here, which takes the same `KEYS` and `ARGV`, takes the same steps on the
//! in-process keyspace, and returns the same reply, so that everything above the server is the
//! one engine. Every row of the script tables (`script_tests.rs`) runs on the twins too.

mod exclusive;
mod hand_over;
mod lib;
mod permits;
mod renew;
mod shared;

use crate::transport::in_process::Twin;

use super::scripts;

/// Every script's SHA1 with its twin.
pub(crate) fn twins() -> Vec<(String, Twin)> {
    let twin = |script: &redis::Script, twin: Twin| (script.get_hash().to_owned(), twin);
    vec![
        twin(&scripts::ACQUIRE, exclusive::acquire),
        twin(&scripts::ACQUIRE_UNQUEUED, exclusive::acquire_unqueued),
        twin(&scripts::RELEASE, exclusive::release),
        twin(&scripts::RELEASE_SHORT, exclusive::release_short),
        twin(&scripts::FENCE, exclusive::fence),
        twin(&scripts::RAISE_FENCE, exclusive::raise_fence),
        twin(&scripts::RENEW, renew::renew),
        twin(&scripts::RENEW_ANY_SLOT, renew::renew_any_slot),
        twin(&scripts::ACQUIRE_PERMIT, permits::acquire_permit),
        twin(&scripts::FORGET_PERMIT, permits::forget_permit),
        twin(&scripts::ACQUIRE_SHARED, shared::acquire_shared),
        twin(&scripts::RELEASE_SHARED, shared::release_shared),
    ]
}
