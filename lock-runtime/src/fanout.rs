//! Sending one request to every node at once.

use std::sync::Arc;

use std::pin::Pin;
use std::task::Poll;

use crate::node::Node;

/// Runs `f` on every node at once; results in node order.
pub(crate) async fn on_all_nodes<T, F, Fut>(nodes: &[Arc<Node>], f: F) -> Vec<T>
where
    F: Fn(Arc<Node>) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    on_nodes_until(nodes, f, |_| false)
        .await
        .into_iter()
        .map(|v| v.expect("every node task finished"))
        .collect()
}

/// Runs `f` on every node at once and returns as soon as `settled` says that the replies so far
/// decide the outcome (a majority), or when every node has replied: one slow or unreachable node
/// must not hold up a decision the others already made. Requests still out go on in the
/// background. Results in node order; `None` for a node that had not replied yet.
///
/// The requests are polled in place, not spawned, so the common case costs no task per node.
pub(crate) async fn on_nodes_until<T, F, Fut, S>(
    nodes: &[Arc<Node>],
    f: F,
    mut settled: S,
) -> Vec<Option<T>>
where
    F: Fn(Arc<Node>) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
    S: FnMut(&[Option<T>]) -> bool,
{
    let mut pending: Vec<Option<Pin<Box<Fut>>>> = nodes
        .iter()
        .map(|node| Some(Box::pin(f(Arc::clone(node)))))
        .collect();
    let mut out: Vec<Option<T>> = (0..nodes.len()).map(|_| None).collect();
    let mut left = nodes.len();
    std::future::poll_fn(|cx| {
        for (slot, reply) in pending.iter_mut().zip(out.iter_mut()) {
            if let Some(fut) = slot
                && let Poll::Ready(v) = fut.as_mut().poll(cx)
            {
                *reply = Some(v);
                *slot = None;
                left -= 1;
            }
        }
        if left == 0 || settled(&out) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    for fut in pending.into_iter().flatten() {
        tokio::spawn(fut);
    }
    out
}

/// Runs every future at once, polled in place; returns when all are done.
pub(crate) async fn join_all<F: Future<Output = ()>>(futures: Vec<F>) {
    let mut pending: Vec<Option<Pin<Box<F>>>> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    std::future::poll_fn(|cx| {
        let mut left = false;
        for slot in &mut pending {
            if let Some(fut) = slot {
                if fut.as_mut().poll(cx).is_ready() {
                    *slot = None;
                } else {
                    left = true;
                }
            }
        }
        if left { Poll::Pending } else { Poll::Ready(()) }
    })
    .await;
}
