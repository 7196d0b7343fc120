//! The kind of a hold, carried from the options to the lease: a lock's key, one of a lock's N
//! permits, or a place among the shared holders of a read-write lock.
//!
//! [`HoldKind`] is what a caller asks for; [`Held`] is what a granted attempt holds. Each layer
//! keeps what differs per kind in one place: the scripts in `server/` (one file per kind), the
//! attempt, undo and release in `deployment/` (one implementation of `deployment::Mode` per
//! kind), and these two types here.

use super::keys::{Keys, PERMITS_MARK};

/// What one hold takes, as the options ask for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoldKind {
    /// The lock's key: one holder at a time.
    Exclusive,
    /// One of the lock's N permits (N > 1).
    Permits(u32),
    /// A place among the shared holders; they exclude exclusive holders, not each other.
    Shared,
}

impl HoldKind {
    /// The kind as the metrics and events label it: `"exclusive"`, `"permits"` or `"shared"`.
    pub(crate) const fn label(self) -> &'static str {
        match self {
            Self::Exclusive => "exclusive",
            Self::Permits(_) => "permits",
            Self::Shared => "shared",
        }
    }

    /// The kind as an error message names it.
    pub(crate) fn describe(self) -> String {
        match self {
            Self::Exclusive => "an exclusive hold".to_owned(),
            Self::Permits(n) => format!("permits = {n}"),
            Self::Shared => "a shared hold".to_owned(),
        }
    }

    /// Whether the key a granted attempt holds is known before the reply: only the lock's own
    /// key is (a permit's key and a shared hold's value are chosen by the server), so only an
    /// exclusive attempt still unanswered can be renewed early.
    pub(crate) const fn held_key_known_before_reply(self) -> bool {
        matches!(self, Self::Exclusive)
    }

    /// What a release that hands the lock to this caller's attempt grants it: the permit it
    /// names (`permit`), or the lock's key. `None` for a grant of another kind (a lock of another
    /// mode handed on to this waiter): not this caller's to hold.
    pub(crate) const fn held_by_grant(self, permit: Option<u32>) -> Option<Held> {
        match (self, permit) {
            (Self::Permits(of), Some(index)) => Some(Held::Permit { index, of }),
            (Self::Permits(_), None) | (_, Some(_)) => None,
            (Self::Exclusive, None) => Some(Held::Key),
            // A shared holder is never granted the lock by a release: it joins the holders.
            (Self::Shared, None) => None,
        }
    }
}

/// What a granted attempt holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Held {
    /// The lock's key.
    Key,
    /// Permit `index` (from 1) of a lock with `permits = of`.
    Permit { index: u32, of: u32 },
    /// A place among the shared holders: `value` is what the lock's key holds (every shared
    /// holder renews it), `member` this holder's own place in the set of holders
    /// (`<token> <fence>`).
    Shared { value: String, member: String },
}

impl Held {
    /// The kind of hold this is.
    pub(crate) const fn kind(&self) -> HoldKind {
        match self {
            Self::Key => HoldKind::Exclusive,
            Self::Permit { of, .. } => HoldKind::Permits(*of),
            Self::Shared { .. } => HoldKind::Shared,
        }
    }

    /// The names of the key this hold holds, of the lock `lock`: the lock's own, or its
    /// permit's.
    pub(crate) fn keys(&self, lock: &Keys) -> Keys {
        match self {
            Self::Permit { index, of } => lock.permit(*index, *of),
            Self::Key | Self::Shared { .. } => lock.clone(),
        }
    }

    /// The token the lease renews its key with: the attempt's `token`, or a shared holder's
    /// value of the lock's key.
    pub(crate) fn token(&self, token: String) -> String {
        match self {
            Self::Shared { value, .. } => value.clone(),
            Self::Key | Self::Permit { .. } => token,
        }
    }

    /// A second key each renewal renews beside the held key (`(key, token)`): a shared holder's
    /// place among the holders; a permit's, the mark on its lock's key that keeps other modes
    /// out. `keys` are the names of the held key.
    pub(crate) fn also_renews(&self, keys: &Keys) -> Option<(String, String)> {
        match self {
            Self::Key => None,
            Self::Permit { of, .. } => {
                Some((keys.lock_key().to_owned(), format!("{PERMITS_MARK}{of}")))
            }
            Self::Shared { member, .. } => Some((keys.readers().to_string(), member.clone())),
        }
    }

    /// The value a holder is known by among the holders (see `Holding::value`): a shared
    /// holder's own token (its place without the fence); `token` for the others.
    pub(crate) fn holder_value<'a>(&'a self, token: &'a str) -> &'a str {
        match self {
            Self::Shared { member, .. } => member.split(' ').next().unwrap_or(member),
            Self::Key | Self::Permit { .. } => token,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::keys::KeyFormat;

    #[test]
    fn a_grant_is_held_only_by_a_caller_of_its_kind() {
        let cases = [
            (HoldKind::Exclusive, None, Some(Held::Key)),
            (HoldKind::Exclusive, Some(2), None),
            (
                HoldKind::Permits(3),
                Some(2),
                Some(Held::Permit { index: 2, of: 3 }),
            ),
            (HoldKind::Permits(3), None, None),
            (HoldKind::Shared, None, None),
            (HoldKind::Shared, Some(1), None),
        ];
        for (kind, permit, held) in cases {
            assert_eq!(
                kind.held_by_grant(permit),
                held,
                "{kind:?} granted {permit:?}"
            );
        }
    }

    #[test]
    fn each_hold_renews_what_keeps_it() {
        let lock = Keys::new("app:{a}".to_owned(), KeyFormat::HashTagged);
        assert_eq!(Held::Key.also_renews(&lock), None);
        let permit = Held::Permit { index: 2, of: 3 };
        let keys = permit.keys(&lock);
        assert_ne!(keys.key, lock.key);
        assert_eq!(
            permit.also_renews(&keys),
            Some((lock.key.clone(), format!("{PERMITS_MARK}3")))
        );
        let shared = Held::Shared {
            value: "shared:t1".to_owned(),
            member: "t2 17".to_owned(),
        };
        assert_eq!(
            shared.also_renews(&lock),
            Some((lock.readers().to_string(), "t2 17".to_owned()))
        );
        assert_eq!(shared.holder_value("ignored"), "t2");
        assert_eq!(shared.token("t2".to_owned()), "shared:t1");
        assert_eq!(Held::Key.holder_value("t"), "t");
    }

    #[test]
    fn labels_and_descriptions_name_the_kind() {
        let kinds = [HoldKind::Exclusive, HoldKind::Permits(4), HoldKind::Shared];
        let labels: Vec<_> = kinds.iter().map(|k| k.label()).collect();
        assert_eq!(labels, ["exclusive", "permits", "shared"]);
        assert_eq!(HoldKind::Permits(4).describe(), "permits = 4");
        assert!(HoldKind::Exclusive.held_key_known_before_reply());
        assert!(!HoldKind::Shared.held_key_known_before_reply());
    }
}
