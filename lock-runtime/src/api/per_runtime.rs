//! The engines of an in-memory locker, one per tokio runtime (see `Locker::in_memory`): each
//! `#[tokio::test]` runs on a runtime of its own, so each test's locks, renewals and request
//! bounds live on that test's clock (paused or not), and tests that run at once never share a
//! lock, also through the process default locker.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::runtime::{Handle, Id};

use crate::plumbing::unpoisoned::Unpoisoned;
use crate::{Locker, LockerBuilder};

/// The builder of each runtime's engine, and the engines made so far.
#[derive(Debug)]
pub(crate) struct PerRuntime {
    builder: LockerBuilder,
    /// Each runtime's locker, with a token that a task in that runtime holds: once the runtime
    /// shuts down, the token is gone and the entry is dropped.
    lockers: Mutex<HashMap<Id, (Locker, Weak<()>)>>,
}

impl PerRuntime {
    /// Engines that `builder` (an in-memory one) makes, one per runtime.
    pub(crate) fn new(builder: LockerBuilder) -> Self {
        Self {
            builder,
            lockers: Mutex::default(),
        }
    }

    /// The locker of the runtime the caller runs in; `None` outside a runtime.
    pub(crate) fn here(&self) -> Option<Locker> {
        let handle = Handle::try_current().ok()?;
        let mut lockers = self.lockers.locked();
        lockers.retain(|_, (_, alive)| alive.strong_count() > 0);
        let (locker, _) = lockers.entry(handle.id()).or_insert_with(|| {
            let alive = Arc::new(());
            let token = Arc::downgrade(&alive);
            handle.spawn(async move {
                let _alive = alive;
                std::future::pending::<()>().await;
            });
            let locker = self
                .builder
                .clone()
                .build_one()
                .expect("the in-memory builder built once already");
            (locker, token)
        });
        Some(locker.clone())
    }
}
