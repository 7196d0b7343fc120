//! One request to every server at once, polled in place (no task per server), decided as soon as
//! the replies so far decide it; the requests still out can be followed afterwards.

use std::pin::Pin;
use std::task::Poll;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Requests to N servers and the replies in so far, in server order.
pub(crate) struct Fanout<T> {
    pending: Vec<Option<BoxFuture<T>>>,
    replies: Vec<Option<T>>,
    left: usize,
}

impl<T: Send + 'static> Fanout<T> {
    /// Starts nothing yet: the requests go out on the first poll, all in the same one.
    pub(crate) fn new<F>(requests: impl IntoIterator<Item = F>) -> Self
    where
        F: Future<Output = T> + Send + 'static,
    {
        let pending: Vec<Option<BoxFuture<T>>> = requests
            .into_iter()
            .map(|f| Some(Box::pin(f) as BoxFuture<T>))
            .collect();
        let left = pending.len();
        Self {
            replies: (0..left).map(|_| None).collect(),
            pending,
            left,
        }
    }

    /// No requests: nothing late to follow.
    pub(crate) fn none() -> Self {
        Self {
            pending: Vec::new(),
            replies: Vec::new(),
            left: 0,
        }
    }

    /// Polls until `decided(replies so far)` holds or every server replied.
    pub(crate) async fn until(&mut self, mut decided: impl FnMut(&[Option<T>]) -> bool) {
        std::future::poll_fn(|cx| {
            for (slot, reply) in self.pending.iter_mut().zip(self.replies.iter_mut()) {
                if let Some(fut) = slot
                    && let Poll::Ready(v) = fut.as_mut().poll(cx)
                {
                    *reply = Some(v);
                    *slot = None;
                    self.left -= 1;
                }
            }
            if self.left == 0 || decided(&self.replies) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    }

    /// Waits for every reply.
    pub(crate) async fn all(mut self) -> Vec<T> {
        self.until(|_| false).await;
        self.replies
            .into_iter()
            .map(|r| r.expect("every request finished"))
            .collect()
    }

    /// The replies in so far, in server order (`None`: still out).
    pub(crate) fn replies(&self) -> &[Option<T>] {
        &self.replies
    }

    /// Takes the replies in so far; the requests still out stay, for [`Self::next_late`].
    pub(crate) fn take_replies(&mut self) -> Vec<Option<T>> {
        self.replies.iter_mut().map(Option::take).collect()
    }

    /// Whether some requests are still out.
    pub(crate) fn has_late(&self) -> bool {
        self.left > 0
    }

    /// The next late reply, with its server's index; `None` when none is left.
    pub(crate) async fn next_late(&mut self) -> Option<(usize, T)> {
        if self.left == 0 {
            return None;
        }
        std::future::poll_fn(|cx| {
            for (i, slot) in self.pending.iter_mut().enumerate() {
                if let Some(fut) = slot
                    && let Poll::Ready(v) = fut.as_mut().poll(cx)
                {
                    *slot = None;
                    self.left -= 1;
                    return Poll::Ready(Some((i, v)));
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Lets the requests still out finish in the background, their replies unread.
    pub(crate) fn detach(self) {
        if self.left > 0 {
            let mut rest = self;
            tokio::spawn(async move { while rest.next_late().await.is_some() {} });
        }
    }
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

/// Runs every future at once, polled in place; returns their outputs in order.
pub(crate) async fn join_all_values<F: Future>(
    futures: impl IntoIterator<Item = F>,
) -> Vec<F::Output> {
    let mut pending: Vec<Option<Pin<Box<F>>>> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut left = false;
        for (slot, out) in pending.iter_mut().zip(outputs.iter_mut()) {
            if let Some(fut) = slot {
                match fut.as_mut().poll(cx) {
                    Poll::Ready(v) => {
                        *out = Some(v);
                        *slot = None;
                    }
                    Poll::Pending => left = true,
                }
            }
        }
        if left { Poll::Pending } else { Poll::Ready(()) }
    })
    .await;
    outputs
        .into_iter()
        .map(|o| o.expect("every future finished"))
        .collect()
}
