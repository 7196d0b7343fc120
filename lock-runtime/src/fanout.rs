//! Sending one request to every node at once.

use std::sync::Arc;

use tokio::task::JoinSet;

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
    let mut set = JoinSet::new();
    for (i, node) in nodes.iter().enumerate() {
        let fut = f(Arc::clone(node));
        set.spawn(async move { (i, fut.await) });
    }
    let mut out: Vec<Option<T>> = (0..nodes.len()).map(|_| None).collect();
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok((i, v)) => out[i] = Some(v),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => {}
        }
        if settled(&out) {
            break;
        }
    }
    set.detach_all();
    out
}
