//! Renewing a chunk of leases on every server at once.

use std::sync::Arc;

use super::majority::{Tally, Verdict};
use super::{Deployment, Renewal, Renewals};
use crate::plumbing::fanout::Fanout;
use crate::server::{Node, RenewReplies, RenewReply};
use crate::state::lease_state::LeaseState;

impl Deployment {
    /// Renews `chunk` (one script call per server), deciding each lease as soon as a majority
    /// confirmed or denied it; requests still out finish in the background.
    pub(crate) async fn renew(&self, chunk: &Arc<Vec<Arc<LeaseState>>>) -> Renewals {
        let mut fanout = Fanout::new(self.nodes.iter().map(|node| {
            let (node, chunk) = (Arc::clone(node), Arc::clone(chunk));
            async move { renew_on(&node, &chunk).await }
        }));
        let majority = self.majority;
        let lease_reply = |replies: &[Option<RenewReplies>], i: usize| {
            Tally::of(replies.iter().map(|r| {
                r.as_ref()
                    .map(|r| r.replies[i].map(|reply| reply == RenewReply::Renewed))
            }))
        };
        fanout
            .until(|replies| {
                (0..chunk.len()).all(|i| {
                    let t = lease_reply(replies, i);
                    chunk[i].is_ended() || majority.settled(t)
                })
            })
            .await;
        let verdicts = (0..chunk.len())
            .map(|i| {
                let t = lease_reply(fanout.replies(), i);
                let unreplicated = fanout.replies().iter().any(|r| {
                    r.as_ref()
                        .is_some_and(|r| r.replies[i] == Some(RenewReply::NotReplicated))
                });
                match majority.verdict(t) {
                    Verdict::Yes => Renewal::Renewed,
                    Verdict::No if unreplicated => Renewal::NotReplicated,
                    Verdict::No => Renewal::NotOwner,
                    Verdict::OutOfReach | Verdict::Open => Renewal::Undecided,
                }
            })
            .collect();
        let error = fanout
            .replies()
            .iter()
            .flatten()
            .filter_map(|r| r.error.clone())
            .next_back();
        fanout.detach();
        Renewals { verdicts, error }
    }
}

/// One server's renewal of a chunk; a lease released since the round began is left out (its
/// key may be kept for min_hold; the release script also changes such a key's value, so a
/// renewal already on its way cannot stretch it either). A lease that also renews a second key
/// (see `LeaseState::also_renews`) is renewed only if both are.
async fn renew_on(node: &Node, chunk: &[Arc<LeaseState>]) -> RenewReplies {
    let mut items: Vec<(&str, &str, u64)> = Vec::with_capacity(chunk.len());
    for l in chunk {
        let (token, ttl) = (if l.is_ended() { "" } else { l.token.as_str() }, l.ttl_ms());
        items.push((l.key(), token, ttl));
        if let Some((key, also)) = &l.also_renews {
            items.push((key.as_str(), if l.is_ended() { "" } else { also }, ttl));
        }
    }
    let renewed = node.renew(&items).await;
    if items.len() == chunk.len() {
        return renewed;
    }
    let mut replies = renewed.replies.into_iter();
    let replies = chunk
        .iter()
        .map(|l| {
            let own = replies.next().flatten();
            match &l.also_renews {
                Some(_) => both(own, replies.next().flatten()),
                None => own,
            }
        })
        .collect();
    RenewReplies {
        replies,
        error: renewed.error,
    }
}

/// What a server said of a lease that renews two keys: not ours if either is not, unknown if
/// either is unknown.
fn both(a: Option<RenewReply>, b: Option<RenewReply>) -> Option<RenewReply> {
    use RenewReply::{NotOwner, NotReplicated, Renewed};
    match (a, b) {
        (Some(NotOwner), _) | (_, Some(NotOwner)) => Some(NotOwner),
        (None, _) | (_, None) => None,
        (Some(NotReplicated), _) | (_, Some(NotReplicated)) => Some(NotReplicated),
        (Some(Renewed), Some(Renewed)) => Some(Renewed),
    }
}
