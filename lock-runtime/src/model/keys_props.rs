//! Properties of the key formats over generated names and prefixes: names are built from the
//! pieces that could collide (the engine's suffixes, braces, separators, digits), so that a name
//! that reaches another lock's keys is found where a table of chosen names would miss it.

use std::collections::HashSet;

use proptest::prelude::*;

use super::keys::{KeyFormat, Keys, check_name};

/// How many permits the generated locks have (their permit keys are among their names).
const PERMITS: u32 = 3;

/// The pieces of generated lock names: the engine's suffixes, braces, separators, digits.
const PIECES: [&str; 16] = [
    "a",
    "b",
    ":",
    "{",
    "}",
    ":fence",
    ":released",
    ":waiters",
    ":waiters:state",
    ":readers",
    ":permit:",
    "0",
    "12",
    "lock:",
    " ",
    "é",
];

/// A format, and a prefix the builder accepts for it (a plain key's prefix is not empty and
/// does not start with `{`).
fn format_and_prefix() -> impl Strategy<Value = (KeyFormat, String)> {
    let plain = prop::sample::select(vec!["lock:", "a", "app:{x}:", "}", "lock:permit:"]);
    let tagged = prop::sample::select(vec!["", "lock:", "{x}", "a}", "lock:permit:"]);
    prop_oneof![
        plain.prop_map(|p| (KeyFormat::Plain, p.to_owned())),
        tagged.prop_map(|p| (KeyFormat::HashTagged, p.to_owned())),
    ]
}

/// A lock name that `format` accepts, of 1 to 5 pieces (a hash-tagged name has no braces).
fn name_for(format: KeyFormat) -> impl Strategy<Value = String> {
    let pieces: Vec<&str> = PIECES
        .into_iter()
        .filter(|p| format == KeyFormat::Plain || !p.contains(['{', '}']))
        .collect();
    prop::collection::vec(prop::sample::select(pieces), 1..6).prop_map(move |p| {
        let name = p.concat();
        assert!(check_name(&name, format).is_ok(), "{name:?}");
        name
    })
}

/// Every Redis name of lock `name`: its key, its derived names and its permits' keys.
fn all_names(format: KeyFormat, prefix: &str, name: &str) -> Vec<String> {
    let keys = Keys::new(format.key(prefix, name), format);
    let mut out = vec![keys.key.clone()];
    out.extend(derived_names(&keys));
    out.extend((0..PERMITS).map(|i| keys.permit(i, PERMITS).key));
    out
}

fn derived_names(keys: &Keys) -> Vec<String> {
    let derived = [
        keys.fence(),
        keys.channel(),
        keys.queue(),
        keys.queue_states(),
        keys.readers(),
    ];
    derived.iter().map(ToString::to_string).collect()
}

/// Redis Cluster's hash tag of `key`: what lies between its first `{` and the first `}` after
/// it, when that is not empty; else the whole key.
fn hash_tag(key: &str) -> &str {
    let Some(open) = key.find('{') else {
        return key;
    };
    match key[open + 1..].find('}') {
        Some(len) if len > 0 => &key[open + 1..open + 1 + len],
        _ => key,
    }
}

proptest! {
    // A failing case is printed, not written into the source tree.
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// A lock's key parses back to its name, and a permit's key to the name of its lock;
    /// no other name of the lock parses as a lock's key or a permit's.
    #[test]
    fn every_key_parses_back_to_its_name(
        (format, prefix, name) in format_and_prefix()
            .prop_flat_map(|(f, p)| (Just(f), Just(p), name_for(f)))
    ) {
        let keys = Keys::new(format.key(&prefix, &name), format);
        prop_assert_eq!(format.name_of(&prefix, &keys.key), Some(name.clone()));
        prop_assert_eq!(format.name_of_permit(&prefix, &keys.key), None);
        for i in 0..PERMITS {
            let permit = keys.permit(i, PERMITS).key;
            prop_assert_eq!(format.name_of_permit(&prefix, &permit), Some(name.clone()));
            prop_assert_eq!(format.name_of(&prefix, &permit), None, "{}", permit);
        }
        for derived in derived_names(&keys) {
            prop_assert_eq!(format.name_of(&prefix, &derived), None, "{}", derived);
            prop_assert_eq!(format.name_of_permit(&prefix, &derived), None, "{}", derived);
        }
    }

    /// Two locks of one format and prefix share no Redis name, and one lock's names are all
    /// different: no name reaches another lock's key, counter, queue, channel or permits.
    #[test]
    fn two_names_never_share_a_key(
        (format, prefix, a, b) in format_and_prefix()
            .prop_flat_map(|(f, p)| (Just(f), Just(p), name_for(f), name_for(f)))
    ) {
        let mine = all_names(format, &prefix, &a);
        let distinct: HashSet<&String> = mine.iter().collect();
        prop_assert_eq!(distinct.len(), mine.len(), "{:?}", mine);
        if a != b {
            let theirs = all_names(format, &prefix, &b);
            let shared: Vec<&String> = theirs.iter().filter(|k| distinct.contains(k)).collect();
            prop_assert!(shared.is_empty(), "{:?} and {:?} share {:?}", a, b, shared);
        }
    }

    /// Across formats under one prefix, a plain lock's derived names and permit keys (all
    /// under `{<key>}`) are never a name of a hash-tagged lock. The other way round is allowed
    /// by design: a plain name may be any string, so a plain lock may be named like a tagged
    /// lock's counter; the scripts refuse to write a key of the other format's shape.
    #[test]
    fn a_plain_locks_derived_names_are_no_tagged_locks_names(
        (prefix, plain, tagged) in prop::sample::select(vec!["lock:", "a", "app:{x}:", "}"])
            .prop_flat_map(|p| (
                Just(p),
                name_for(KeyFormat::Plain),
                name_for(KeyFormat::HashTagged),
            ))
    ) {
        let theirs: HashSet<String> =
            all_names(KeyFormat::HashTagged, prefix, &tagged).into_iter().collect();
        for name in &all_names(KeyFormat::Plain, prefix, &plain)[1..] {
            prop_assert!(!theirs.contains(name), "plain {:?} and tagged {:?}: {}", plain, tagged, name);
        }
    }

    /// One lock's names are in one Redis Cluster slot: with hash-tagged keys (and a prefix
    /// without braces) every name's hash tag is the lock's name; a plain lock's derived names
    /// and permit keys share one tag (its key is the other clients' and has no tag of ours).
    #[test]
    fn a_locks_names_share_one_hash_tag(
        (format, prefix, name) in format_and_prefix()
            .prop_filter("a prefix without braces", |(_, p)| !p.contains(['{', '}']))
            .prop_flat_map(|(f, p)| (Just(f), Just(p), name_for(f)))
    ) {
        let names = all_names(format, &prefix, &name);
        let tags: HashSet<&str> = names[1..].iter().map(|k| hash_tag(k)).collect();
        prop_assert_eq!(tags.len(), 1, "{:?}", names);
        if format == KeyFormat::HashTagged {
            prop_assert_eq!(hash_tag(&names[0]), name.as_str());
            prop_assert!(tags.contains(name.as_str()), "{:?}", names);
        }
    }
}
