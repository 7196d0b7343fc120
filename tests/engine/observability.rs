//! What an operator sees through `tracing`: one `lock` span per locked call with its name, key,
//! fence, wait and outcome, and events at acquire, loss, `max_exec` and release (the release at
//! INFO, with the wait and the hold time), on the documented targets only; a `()` job that skips
//! a busy tick logs at DEBUG, a real failure at WARN.

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lock_runtime::{LockError, Locker, distributed_lock};
use support::{Env, ms, opts};

/// Field names and values, in the order recorded.
type FieldList = Vec<(String, String)>;

/// Spans (with every field recorded on them) and events (with level, message and fields).
#[derive(Clone, Default)]
struct Recorded {
    spans: Arc<Mutex<HashMap<u64, FieldList>>>,
    /// Level, target and fields of each event.
    events: Arc<Mutex<Vec<(tracing::Level, String, FieldList)>>>,
    next: Arc<AtomicU64>,
}

struct Fields<'a>(&'a mut FieldList);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

impl tracing::Subscriber for Recorded {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let id = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        let meta = attrs.metadata();
        let mut fields = vec![
            ("span".to_owned(), meta.name().to_owned()),
            ("target".to_owned(), meta.target().to_owned()),
        ];
        attrs.record(&mut Fields(&mut fields));
        self.spans.lock().unwrap().insert(id, fields);
        tracing::span::Id::from_u64(id)
    }
    fn record(&self, id: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        if let Some(fields) = self.spans.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Fields(fields));
        }
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Vec::new();
        event.record(&mut Fields(&mut fields));
        let meta = event.metadata();
        self.events
            .lock()
            .unwrap()
            .push((*meta.level(), meta.target().to_owned(), fields));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

impl Recorded {
    fn lock_spans(&self) -> Vec<HashMap<String, String>> {
        let spans = self.spans.lock().unwrap();
        let mut ids: Vec<&u64> = spans.keys().collect();
        ids.sort();
        ids.into_iter()
            .map(|id| spans[id].iter().cloned().collect::<HashMap<_, _>>())
            .filter(|f| f.get("span").map(String::as_str) == Some("lock"))
            .collect()
    }

    /// Asserts that an event with `message` was logged at WARN for the lock `lock`.
    fn assert_warned(&self, message: &str, lock: &str) {
        let events = self.events_with(message);
        assert!(
            events
                .iter()
                .any(|(l, f)| *l == tracing::Level::WARN && f["lock"] == lock),
            "{events:?}"
        );
    }

    fn events_with(&self, message: &str) -> Vec<(tracing::Level, HashMap<String, String>)> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .map(|(level, target, f)| {
                let mut f: HashMap<_, _> = f.iter().cloned().collect();
                f.insert("target".to_owned(), target.clone());
                (*level, f)
            })
            .filter(|(_, f)| f.get("message").is_some_and(|m| m.contains(message)))
            .collect()
    }

    /// The targets of the engine's events and spans so far.
    fn engine_targets(&self) -> Vec<String> {
        let events = self.events.lock().unwrap();
        let spans = self.spans.lock().unwrap();
        let event_targets = events.iter().map(|(_, target, _)| target.clone());
        let span_targets = spans.values().filter_map(|f| {
            f.iter()
                .find(|(k, _)| k == "target")
                .map(|(_, t)| t.clone())
        });
        let mut targets: Vec<String> = event_targets
            .chain(span_targets)
            .filter(|t| t.starts_with("lock_runtime"))
            .collect();
        targets.sort();
        targets.dedup();
        targets
    }
}

#[distributed_lock(name = "report:{tenant}", ttl = "5s", wait = "2s", locker = locker, guard = lease)]
async fn report(locker: &Locker, tenant: &str) -> Result<u64, LockError> {
    Ok(lease.fence())
}

#[distributed_lock(name = "nightly", ttl = "5s", locker = locker)]
async fn nightly(locker: &Locker) {}

#[distributed_lock(name = "slow", ttl = "1s", max_exec = "50ms", locker = locker)]
async fn slow(locker: &Locker) -> Result<(), LockError> {
    tokio::time::sleep(ms(5_000)).await;
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn spans_and_events_tell_what_each_call_did() {
    let env = Env::start().await;
    let recorded = Recorded::default();
    let _guard = tracing::dispatcher::set_default(&tracing::Dispatch::new(recorded.clone()));

    let fence = report(&env.locker, "acme").await.unwrap();
    let spans = recorded.lock_spans();
    let span = spans.last().expect("a lock span");
    assert_eq!(
        span.get("name").map(String::as_str),
        Some("report:acme"),
        "{span:?}"
    );
    assert_eq!(span["template"], "report:{tenant}", "{span:?}");
    assert_eq!(span["key"], env.key("report:acme"), "{span:?}");
    assert_eq!(span["fence"], fence.to_string(), "{span:?}");
    assert!(span.contains_key("waited_ms"), "{span:?}");
    assert_eq!(span["outcome"], "ok", "{span:?}");
    assert_eq!(span["target"], "lock_runtime", "{span:?}");
    let acquired = recorded.events_with("lock acquired");
    assert!(
        acquired.iter().any(|(l, f)| *l == tracing::Level::DEBUG
            && f["target"] == "lock_runtime::acquire"
            && f.get("fence") == Some(&fence.to_string())),
        "{acquired:?}"
    );
    // The hold's one INFO line: its fence, wait and hold time.
    let released = recorded.events_with("lock released");
    let [(level, release)] = released.as_slice() else {
        panic!("{released:?}");
    };
    assert_eq!(*level, tracing::Level::INFO);
    assert_eq!(release["target"], "lock_runtime::release");
    assert_eq!(release["lock"], "report:acme");
    assert_eq!(release["fence"], fence.to_string());
    for field in ["waited_ms", "held_ms"] {
        let ms: Option<u64> = release.get(field).and_then(|v| v.parse().ok());
        assert!(ms.is_some(), "{field}: {release:?}");
    }

    // A `()` job that finds the lock busy: the normal case for every replica but one, DEBUG.
    let holder = env.locker.acquire("nightly", &opts(5_000)).await.unwrap();
    nightly(&env.locker).await;
    let skipped = recorded.events_with("skipped");
    assert!(
        !skipped.is_empty() && skipped.iter().all(|(l, _)| *l == tracing::Level::DEBUG),
        "{skipped:?}"
    );
    assert_eq!(recorded.lock_spans().last().unwrap()["outcome"], "busy");
    holder.release().await.unwrap();

    // max_exec: an event at WARN, the span's outcome.
    let err = slow(&env.locker).await.unwrap_err();
    assert!(matches!(err, LockError::MaxExecExceeded { .. }), "{err:?}");
    recorded.assert_warned("max_exec", "slow");
    assert_eq!(recorded.lock_spans().last().unwrap()["outcome"], "max_exec");

    // Loss: the key is taken away under a held lease; its next renewal finds out.
    let lease = env.locker.acquire("taken", &opts(300)).await.unwrap();
    env.del(&env.key("taken")).await;
    tokio::time::timeout(ms(2_000), lease.lost()).await.unwrap();
    recorded.assert_warned("lock lost", "taken");
    let lost = recorded.events_with("lock lost");
    assert!(
        lost.iter()
            .all(|(_, f)| f["target"] == "lock_runtime::hold" && f.contains_key("held_ms")),
        "{lost:?}"
    );

    // A real failure of a `()` job is a WARN: here the server is gone.
    drop(lease);
    env.server.kill();
    let failing = Locker::builder()
        .url(env.server.url())
        .connect_timeout(ms(200))
        .response_timeout(ms(200))
        .build()
        .unwrap();
    nightly(&failing).await;
    recorded.assert_warned("locked call failed", "nightly");

    // Every event and span of the engine is on a documented target, none on a module path.
    let documented = [
        "lock_runtime",
        "lock_runtime::acquire",
        "lock_runtime::hold",
        "lock_runtime::release",
    ];
    let targets = recorded.engine_targets();
    assert!(
        targets.iter().all(|t| documented.contains(&t.as_str())),
        "{targets:?}"
    );
    assert_eq!(targets.len(), documented.len(), "{targets:?}");
}

/// The loss's WARN says what the loss did: a locked call's body is cancelled; a lease taken by
/// hand cancels nothing, and its holder is told where to look.
#[tokio::test(flavor = "current_thread")]
async fn a_loss_is_logged_with_what_it_cancelled() {
    let env = Env::start().await;
    let recorded = Recorded::default();
    let _guard = tracing::dispatcher::set_default(&tracing::Dispatch::new(recorded.clone()));

    let lease = env.locker.acquire("by-hand", &opts(300)).await.unwrap();
    env.del(&env.key("by-hand")).await;
    tokio::time::timeout(ms(2_000), lease.lost()).await.unwrap();

    let key = env.key("in-body");
    let err = env
        .locker
        .run("in-body", &opts(300), async |lease| {
            env.del(&key).await;
            lease.lost().await;
        })
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Lost { .. }), "{err:?}");

    let lost = recorded.events_with("lock lost while held");
    let message = |lock: &str| {
        let found: Vec<&String> = lost
            .iter()
            .filter(|(level, f)| *level == tracing::Level::WARN && f["lock"] == lock)
            .map(|(_, f)| &f["message"])
            .collect();
        assert_eq!(found.len(), 1, "{lock}: {lost:?}");
        found[0].clone()
    };
    assert_eq!(
        message("by-hand"),
        "lock lost while held by a lease taken by hand; nothing is cancelled: its holder learns \
         it from `Lease::lost` or `Lease::is_held`"
    );
    assert_eq!(
        message("in-body"),
        "lock lost while held; the body is cancelled"
    );
}

/// `Locker::in_memory()` tells the same story: the same span, fields and events.
#[tokio::test(flavor = "current_thread")]
async fn an_in_memory_locker_logs_as_a_redis_one_does() {
    let locker = Locker::in_memory();
    let recorded = Recorded::default();
    let _guard = tracing::dispatcher::set_default(&tracing::Dispatch::new(recorded.clone()));
    let fence = report(&locker, "acme").await.unwrap();
    let spans = recorded.lock_spans();
    let span = spans.last().expect("a lock span");
    assert_eq!(span["template"], "report:{tenant}", "{span:?}");
    assert_eq!(span["key"], locker.key_of("report:acme"), "{span:?}");
    assert_eq!(span["fence"], fence.to_string(), "{span:?}");
    assert_eq!(span["outcome"], "ok", "{span:?}");
    let released = recorded.events_with("lock released");
    let [(level, release)] = released.as_slice() else {
        panic!("{released:?}");
    };
    assert_eq!(
        (*level, release["fence"].clone()),
        (tracing::Level::INFO, fence.to_string())
    );
    let err = slow(&locker).await.unwrap_err();
    assert!(matches!(err, LockError::MaxExecExceeded { .. }), "{err:?}");
    recorded.assert_warned("max_exec", "slow");
    let lease = locker.acquire("taken", &opts(300)).await.unwrap();
    let value = locker.inspect("taken").await.unwrap().expect("held").value;
    assert!(locker.force_release("taken", &value).await.unwrap());
    tokio::time::timeout(ms(2_000), lease.lost()).await.unwrap();
    recorded.assert_warned("lock lost", "taken");
}
