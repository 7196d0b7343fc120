//! What the servers' replies to one acquire attempt say, sorted once: who granted it (with
//! which fence), who said busy or not our turn, who failed and how. Pure: no Redis needed to
//! test it.

use std::time::Duration;

use redis::RedisResult;

use super::Failure;
use crate::server::AcquireReply;

/// The replies of one attempt, by kind.
#[derive(Default)]
pub(super) struct AcquireReplies {
    /// `(server, fence)` of each server that granted the lock.
    pub granted: Vec<(usize, u64)>,
    /// The shortest time left on a busy key (`Some(None)`: busy, time unknown); `None` when
    /// no server said busy.
    pub busy_pttl: Option<Option<Duration>>,
    /// The servers that said busy or not our turn (their release messages can change the next
    /// attempt's outcome).
    pub busy: Vec<usize>,
    /// The first in line, when a server said it is another waiter's turn.
    pub not_our_turn: Option<(String, String)>,
    /// What the lock's key holds, when a server said it is held in another mode.
    pub other_mode: Option<String>,
    pub failures: Vec<(usize, Failure)>,
    /// Servers whose request failed in a way that may still have set the key (a timeout).
    pub unsure: Vec<usize>,
}

impl AcquireReplies {
    /// Sorts `replies` (`None`: no reply yet); `replicas(i)` is how many replicas server `i`
    /// waits for.
    pub(super) fn of(
        replies: Vec<Option<RedisResult<AcquireReply>>>,
        replicas: impl Fn(usize) -> usize,
    ) -> Self {
        let mut out = Self::default();
        for (i, reply) in replies.into_iter().enumerate() {
            match reply {
                Some(Ok(AcquireReply::Taken { fence })) => out.granted.push((i, fence)),
                Some(Ok(AcquireReply::Busy { pttl })) => {
                    out.busy.push(i);
                    out.busy_pttl = Some(match out.busy_pttl {
                        Some(Some(prev)) => Some(pttl.map_or(prev, |p| p.min(prev))),
                        _ => pttl,
                    });
                }
                Some(Ok(AcquireReply::NotOurTurn { head, state })) => {
                    out.busy.push(i);
                    out.not_our_turn = Some((head, state));
                }
                Some(Ok(AcquireReply::OtherMode { held })) => {
                    out.busy.push(i);
                    out.other_mode = Some(held);
                }
                Some(Ok(AcquireReply::Foreign { key, detail })) => {
                    out.failures.push((i, Failure::Foreign { key, detail }));
                }
                Some(Ok(AcquireReply::NotReplicated { acked })) => {
                    // The node deleted the unacknowledged key already.
                    let needed = replicas(i);
                    out.failures
                        .push((i, Failure::NotReplicated { acked, needed }));
                }
                Some(Err(e)) => {
                    out.unsure.push(i);
                    out.failures.push((i, Failure::Redis(e)));
                }
                None => {}
            }
        }
        out
    }

    /// The servers that granted the lock.
    pub(super) fn granted_servers(&self) -> Vec<usize> {
        self.granted.iter().map(|&(i, _)| i).collect()
    }

    /// The lease's fence, the highest granted, and the servers whose counter is behind it
    /// (to be raised, so that the next majority, which shares a server with this one, counts
    /// past it). In step (the usual case), none is behind.
    pub(super) fn fence_and_behind(&self) -> (u64, Vec<usize>) {
        fence_and_behind(&self.granted)
    }
}

/// The highest of the `(server, fence)` pairs `fenced`, and the servers whose fence is below it.
pub(super) fn fence_and_behind(fenced: &[(usize, u64)]) -> (u64, Vec<usize>) {
    let fence = fenced.iter().map(|&(_, f)| f).max().unwrap_or(0);
    let behind = fenced
        .iter()
        .filter(|&&(_, f)| f < fence)
        .map(|&(i, _)| i)
        .collect();
    (fence, behind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn replies_are_sorted_by_kind() {
        let timeout = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        let replies = vec![
            Some(Ok(AcquireReply::Taken { fence: 7 })),
            Some(Ok(AcquireReply::Busy {
                pttl: Some(ms(300)),
            })),
            Some(Ok(AcquireReply::Busy {
                pttl: Some(ms(100)),
            })),
            Some(Ok(AcquireReply::Busy { pttl: None })),
            Some(Ok(AcquireReply::NotOurTurn {
                head: "w".into(),
                state: "s".into(),
            })),
            Some(Ok(AcquireReply::Foreign {
                key: "lock:{a}".into(),
                detail: "holds a hash value, not a lock".into(),
            })),
            Some(Ok(AcquireReply::NotReplicated { acked: 0 })),
            Some(Err(timeout)),
            None,
            Some(Ok(AcquireReply::Taken { fence: 9 })),
        ];
        let r = AcquireReplies::of(replies, |_| 2);
        assert_eq!(r.granted, [(0, 7), (9, 9)]);
        assert_eq!(r.granted_servers(), [0, 9]);
        // The shortest time left among the busy servers that told it.
        assert_eq!(r.busy_pttl, Some(Some(ms(100))));
        assert_eq!(r.busy, [1, 2, 3, 4]);
        assert_eq!(r.not_our_turn, Some(("w".into(), "s".into())));
        let failed: Vec<(usize, String)> = r
            .failures
            .iter()
            .map(|(i, f)| (*i, f.to_string()))
            .collect();
        assert_eq!(failed.len(), 3, "{failed:?}");
        assert_eq!(failed[0].0, 5);
        assert!(failed[1].1.contains("0 of the 2"), "{failed:?}");
        assert_eq!(r.unsure, [7]);
        assert_eq!(r.fence_and_behind(), (9, vec![0]));
    }

    #[test]
    fn busy_time_left() {
        let busy = |pttls: &[Option<u64>]| {
            let replies = pttls
                .iter()
                .map(|p| Some(Ok(AcquireReply::Busy { pttl: p.map(ms) })))
                .collect();
            AcquireReplies::of(replies, |_| 0).busy_pttl
        };
        assert_eq!(busy(&[]), None);
        assert_eq!(busy(&[None]), Some(None));
        assert_eq!(busy(&[Some(5), None]), Some(Some(ms(5))));
        assert_eq!(busy(&[None, Some(5)]), Some(Some(ms(5))));
        assert_eq!(busy(&[Some(9), Some(5), Some(7)]), Some(Some(ms(5))));
    }

    #[test]
    fn fences_in_step_need_no_raising() {
        let taken = |fences: &[u64]| {
            let replies = fences
                .iter()
                .map(|&fence| Some(Ok(AcquireReply::Taken { fence })))
                .collect();
            AcquireReplies::of(replies, |_| 0).fence_and_behind()
        };
        assert_eq!(taken(&[5, 5, 5]), (5, vec![]));
        assert_eq!(taken(&[5, 8, 6]), (8, vec![0, 2]));
        assert_eq!(taken(&[]), (0, vec![]));
    }
}
