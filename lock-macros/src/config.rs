//! One `build` step from the options as written to a checked [`Config`]: required options,
//! durations converted to whole milliseconds, the rules between them (`lock_rules`, the code the
//! runtime checks `LockOptions` with), the guard's name, and the key template against the
//! function's parameters. Each error points at the value it is about.

use lock_rules::{DurationKey, Durations};
use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::{Expr, Ident, LitStr, Path};

use crate::errors::Errors;
use crate::options::OptionKey;
use crate::parse::RawArgs;
use crate::suggest;
use crate::template::{self, Piece};

/// The checked options, ready for expansion.
pub(crate) struct Config {
    /// `format!` string of the key, spanned like the `name` literal.
    pub key_format: LitStr,
    /// The `name` literal as written: the low-cardinality label of metrics and spans.
    pub template: LitStr,
    /// The parameters the placeholders name, in order.
    pub key_args: Vec<Ident>,
    /// For `name = [..]`: every name's `format!` string and parameters, in the order written
    /// (the first is `key_format`); empty for one name.
    pub several: Vec<(LitStr, Vec<Ident>)>,
    pub ttl_ms: u64,
    pub lease_ms: Option<u64>,
    pub max_exec_ms: Option<u64>,
    pub renew_ms: Option<u64>,
    pub wait_ms: Option<u64>,
    pub min_hold_ms: Option<u64>,
    pub permits: Option<u64>,
    pub shared: bool,
    pub fail_open: bool,
    pub locker: Option<Expr>,
    pub guard: Option<Ident>,
    pub krate: Path,
}

/// Checks the options as a whole, adding each problem to `errors`; `params` are the names the
/// function's parameters bind. `None` when `name` or `ttl` is unusable; a `Config` may still come
/// with errors (about other options), so the caller checks `errors` before using it.
pub(crate) fn build(raw: RawArgs, params: &[Ident], errors: &mut Errors) -> Option<Config> {
    let key = match &raw.name {
        Some(lit) => errors.push_result(key(lit, params)),
        None if raw.seen.contains(&OptionKey::Name) || raw.meant.contains(&OptionKey::Name) => None,
        None => {
            errors.push(missing(
                OptionKey::Name,
                "the lock's key, like `name = \"job:{id}\"`",
            ));
            None
        }
    };
    let mut ms = |key: OptionKey, lit: &Option<LitStr>| {
        let lit = lit.as_ref()?;
        errors.push_result(
            parse_millis(key.name(), &lit.value()).map_err(|m| syn::Error::new(lit.span(), m)),
        )
    };
    let ttl = ms(OptionKey::Ttl, &raw.ttl);
    let lease = ms(OptionKey::Lease, &raw.lease);
    let max_exec = ms(OptionKey::MaxExec, &raw.max_exec);
    let renew = ms(OptionKey::Renew, &raw.renew);
    let wait_ms = ms(OptionKey::Wait, &raw.wait);
    let min_hold = ms(OptionKey::MinHold, &raw.min_hold);
    if !raw.seen.contains(&OptionKey::Ttl) && !raw.meant.contains(&OptionKey::Ttl) {
        errors.push(missing(
            OptionKey::Ttl,
            "how long the lease lasts, like `ttl = \"30s\"`",
        ));
    }
    // The rules compare with ttl; a value that did not parse has been reported already.
    if let Some(ttl) = ttl {
        let durations = Durations {
            ttl,
            lease,
            max_exec,
            renew,
            min_hold,
        };
        for (_, err) in rule_errors(&raw, durations) {
            errors.push(err);
        }
    }
    if let Some(guard) = &raw.guard {
        errors.push_result(check_guard(guard, params));
    }
    let several = several(&raw, params, errors);
    let permits = permits(&raw, errors);
    fail_open(&raw, permits, errors);
    let (key_format, key_args) = key?;
    let template = template_of(&raw)?;
    Some(Config {
        key_format,
        template,
        key_args,
        several,
        ttl_ms: ttl?,
        lease_ms: lease,
        max_exec_ms: max_exec,
        renew_ms: renew,
        wait_ms,
        min_hold_ms: min_hold,
        permits,
        shared: raw.shared.is_some(),
        fail_open: raw.fail_open.is_some(),
        locker: raw.locker,
        guard: raw.guard,
        krate: raw
            .krate
            .unwrap_or_else(|| syn::parse_quote!(::lock_runtime)),
    })
}

/// `fail_open`, checked with the options it cannot go with (an error on `fail_open`).
fn fail_open(raw: &RawArgs, permits: Option<u64>, errors: &mut Errors) {
    let Some(fail_open) = &raw.fail_open else {
        return;
    };
    let message = if raw.names.is_empty() {
        lock_rules::check_fail_open(true, permits.unwrap_or(1), raw.guard.is_some())
    } else {
        Some(
            "fail_open is for one name: a call over several names runs under all of them or not \
             at all; drop fail_open"
                .to_owned(),
        )
    };
    if let Some(message) = message {
        errors.push(syn::Error::new(fail_open.span(), message));
    }
}

/// The names of `name = [..]`, each checked as one name is; a name written twice is an error
/// at its second literal.
fn several(raw: &RawArgs, params: &[Ident], errors: &mut Errors) -> Vec<(LitStr, Vec<Ident>)> {
    let mut keys = Vec::with_capacity(raw.names.len());
    for (i, lit) in raw.names.iter().enumerate() {
        if raw.names[..i]
            .iter()
            .any(|seen| seen.value() == lit.value())
        {
            errors.push(syn::Error::new(
                lit.span(),
                format!(
                    "`{}` is named twice: a call cannot take one lock twice; name each lock once",
                    lit.value()
                ),
            ));
            continue;
        }
        // The first name's errors are reported with it (see `build`).
        let key = if i == 0 {
            key(lit, params).ok()
        } else {
            errors.push_result(key(lit, params))
        };
        keys.extend(key);
    }
    keys
}

/// The metrics label and span template: the `name` literal, or the distinct literals of
/// `name = [..]` joined by `, `.
fn template_of(raw: &RawArgs) -> Option<LitStr> {
    let first = raw.name.clone()?;
    if raw.names.is_empty() {
        return Some(first);
    }
    let mut distinct: Vec<String> = Vec::new();
    for lit in &raw.names {
        if !distinct.contains(&lit.value()) {
            distinct.push(lit.value());
        }
    }
    Some(LitStr::new(&distinct.join(", "), first.span()))
}

/// `permits`, checked on its literal, and with `shared` (an error on `shared`).
fn permits(raw: &RawArgs, errors: &mut Errors) -> Option<u64> {
    let permits = raw.permits.as_ref().and_then(|lit| {
        let n = lit.base10_parse::<u64>().unwrap_or(0);
        match lock_rules::check_permits(n) {
            Some(message) => {
                errors.push(syn::Error::new(lit.span(), message));
                None
            }
            None => Some(n),
        }
    });
    if let (Some(shared), Some(n)) = (&raw.shared, permits)
        && let Some(message) = lock_rules::check_shared(true, n)
    {
        errors.push(syn::Error::new(shared.span(), message));
    }
    permits
}

/// Each rule the durations break, as an error on the literal of the option it blames.
fn rule_errors(raw: &RawArgs, durations: Durations) -> Vec<(DurationKey, syn::Error)> {
    lock_rules::check(durations)
        .into_iter()
        .map(|broken| {
            let span = raw
                .duration(broken.key)
                .map_or_else(Span::call_site, LitStr::span);
            (broken.key, syn::Error::new(span, broken.message))
        })
        .collect()
}

/// The guard is a new binding in the body: it must not hide a parameter of the same name.
fn check_guard(guard: &Ident, params: &[Ident]) -> syn::Result<()> {
    let taken = |name: &str| params.iter().any(|p| p.unraw() == name);
    if !taken(&guard.unraw().to_string()) {
        return Ok(());
    }
    let other = ["lock_lease", "held_lease", "lock_guard"]
        .into_iter()
        .find(|name| !taken(name))
        .unwrap_or("lock_lease");
    Err(syn::Error::new(
        guard.span(),
        format!(
            "`guard = {guard}` would hide the parameter `{guard}` inside the body; name the lease \
             something else, like `guard = {other}`"
        ),
    ))
}

fn missing(option: OptionKey, what: &str) -> syn::Error {
    syn::Error::new(
        Span::call_site(),
        format!("missing `{}`: {what}", option.name()),
    )
}

/// The key's `format!` string and its arguments: each placeholder must name a parameter.
fn key(lit: &LitStr, params: &[Ident]) -> syn::Result<(LitStr, Vec<Ident>)> {
    let pieces = template::parse(&lit.value()).map_err(|m| syn::Error::new(lit.span(), m))?;
    let mut args = Vec::new();
    for piece in &pieces {
        if let Piece::Param(name) = piece {
            match params.iter().find(|p| p.unraw() == name) {
                Some(param) => args.push(param.clone()),
                None => return Err(syn::Error::new(lit.span(), unknown_param(name, params))),
            }
        }
    }
    Ok((
        LitStr::new(&template::format_string(&pieces), lit.span()),
        args,
    ))
}

fn unknown_param(name: &str, params: &[Ident]) -> String {
    let names: Vec<String> = params.iter().map(|p| p.unraw().to_string()).collect();
    let closest = suggest::closest(name, names.iter().map(String::as_str));
    let hint = match (closest, names.is_empty()) {
        (Some(known), _) => format!("did you mean `{{{known}}}`?"),
        (None, true) => "it has no parameters; add one for the value the key needs".to_owned(),
        (None, false) => {
            let listed: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
            format!("its parameters are {}", listed.join(", "))
        }
    };
    format!("`{{{name}}}` in the lock name is not a parameter of this function: {hint}")
}

const EXAMPLES: &str = "write it like \"250ms\", \"10s\" or \"1m 30s\"";

/// A duration string in whole milliseconds; the error names the option and shows valid forms.
pub(crate) fn parse_millis(option: &str, text: &str) -> Result<u64, String> {
    let duration = humantime::parse_duration(text)
        .map_err(|err| not_a_duration(&format!("`{option} = \"{text}\"`"), &err))?;
    if duration.subsec_nanos() % 1_000_000 != 0 {
        let up = duration.as_millis() + 1;
        return Err(format!(
            "`{option} = \"{text}\"` is not a whole number of milliseconds, the unit locks are kept in; \
             round it, e.g. \"{up}ms\""
        ));
    }
    u64::try_from(duration.as_millis()).map_err(|_| format!("`{option} = \"{text}\"` is too long"))
}

/// Why `text` (`written`: the option as written) is not a duration, in this crate's words.
fn not_a_duration(written: &str, err: &humantime::DurationError) -> String {
    use humantime::DurationError as E;
    match err {
        E::Empty => format!("{written}: empty; {EXAMPLES}"),
        E::UnknownUnit { unit, value, .. } if unit.is_empty() => {
            format!("{written}: a number needs a unit; write \"{value}s\" or \"{value}ms\"")
        }
        E::UnknownUnit { unit, .. } => {
            format!("{written}: `{unit}` is not a unit (use ms, s, m, h or d); {EXAMPLES}")
        }
        E::NumberOverflow => format!("{written}: too long to be a duration"),
        E::InvalidCharacter(_) | E::NumberExpected(_) => {
            format!("{written}: not a duration; {EXAMPLES}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_whole_milliseconds() {
        assert_eq!(parse_millis("ttl", "250ms"), Ok(250));
        assert_eq!(parse_millis("ttl", "10s"), Ok(10_000));
        assert_eq!(parse_millis("ttl", "1m 30s"), Ok(90_000));
        assert_eq!(parse_millis("wait", "0s"), Ok(0));
        assert_eq!(parse_millis("ttl", "2000us"), Ok(2));
        let err = parse_millis("renew", "1500us").unwrap_err();
        assert!(
            err.contains("whole number of milliseconds") && err.contains("\"2ms\""),
            "{err}"
        );
        let said = |option, text| parse_millis(option, text).unwrap_err();
        assert_eq!(
            said("ttl", "30"),
            "`ttl = \"30\"`: a number needs a unit; write \"30s\" or \"30ms\""
        );
        assert_eq!(
            said("ttl", "3x"),
            "`ttl = \"3x\"`: `x` is not a unit (use ms, s, m, h or d); write it like \"250ms\", \
             \"10s\" or \"1m 30s\""
        );
        assert_eq!(
            said("wait", "a while"),
            "`wait = \"a while\"`: not a duration; write it like \"250ms\", \"10s\" or \"1m 30s\""
        );
        assert_eq!(
            said("ttl", ""),
            "`ttl = \"\"`: empty; write it like \"250ms\", \"10s\" or \"1m 30s\""
        );
        assert_eq!(
            said("ttl", "99999999999999999999s"),
            "`ttl = \"99999999999999999999s\"`: too long to be a duration"
        );
        // No word of the parser's own.
        for text in ["30", "3x", "a while", "", "1.5.5s", "-1s"] {
            let message = said("ttl", text);
            assert!(
                ![
                    "expected number",
                    "invalid character",
                    "time unit needed",
                    "supported units"
                ]
                .iter()
                .any(|word| message.contains(word)),
                "{message}"
            );
        }
        assert!(parse_millis("ttl", "soon").is_err());
        assert!(parse_millis("ttl", "").is_err());
    }

    fn build_with(args: proc_macro2::TokenStream, params: &[&str]) -> Result<(), Vec<String>> {
        let mut errors = Errors::default();
        let raw = crate::parse::parse_args(args, &mut errors).unwrap();
        let params: Vec<Ident> = params
            .iter()
            .map(|p| Ident::new(p, Span::call_site()))
            .collect();
        let config = build(raw, &params, &mut errors);
        errors
            .finish()
            .map_err(|err| err.into_iter().map(|e| e.to_string()).collect::<Vec<_>>())?;
        assert!(config.is_some());
        Ok(())
    }

    /// The table the runtime's `LockOptions::validate` test runs too: the attribute accepts and
    /// rejects the same durations, with the same messages, on the literal of the option blamed.
    #[test]
    fn rules_follow_the_shared_table() {
        let lit = |ms: u64| LitStr::new(&format!("{ms}ms"), Span::call_site());
        for case in lock_rules::CASES {
            let d = case.durations;
            let ttl = lit(d.ttl);
            let mut args = quote::quote!(name = "job", ttl = #ttl);
            let optional = [
                ("lease", d.lease),
                ("max_exec", d.max_exec),
                ("renew", d.renew),
                ("min_hold", d.min_hold),
            ];
            for (option, value) in optional {
                if let Some(ms) = value {
                    let option = Ident::new(option, Span::call_site());
                    let value = lit(ms);
                    args.extend(quote::quote!(, #option = #value));
                }
            }
            let mut errors = Errors::default();
            let raw = crate::parse::parse_args(args.clone(), &mut errors).unwrap();
            let blamed: Vec<DurationKey> =
                rule_errors(&raw, d).into_iter().map(|(k, _)| k).collect();
            assert_eq!(blamed, case.blamed, "{case:?}");
            let expected: Vec<String> = lock_rules::check(d)
                .into_iter()
                .map(|b| b.message)
                .collect();
            match build_with(args, &[]) {
                Ok(()) => assert!(expected.is_empty(), "{case:?}"),
                Err(messages) => assert_eq!(messages, expected, "{case:?}"),
            }
        }
    }

    #[test]
    fn an_unknown_option_taken_for_a_required_one_is_not_also_missing() {
        let err = build_with(quote::quote!(key = "job", lockAtMostFor = "1s"), &[]).unwrap_err();
        assert_eq!(err.len(), 2, "{err:?}");
        assert!(
            err.iter().all(|e| e.starts_with("unknown option")),
            "{err:?}"
        );
        let err = build_with(quote::quote!(wait = "1s"), &[]).unwrap_err();
        assert!(
            err[0].starts_with("missing `name`") && err[1].starts_with("missing `ttl`"),
            "{err:?}"
        );
    }

    #[test]
    fn the_guard_cannot_hide_a_parameter() {
        let err = build_with(
            quote::quote!(name = "job:{id}", ttl = "1s", guard = lease),
            &["id", "lease"],
        )
        .unwrap_err();
        assert_eq!(
            err,
            [
                "`guard = lease` would hide the parameter `lease` inside the body; name the lease \
              something else, like `guard = lock_lease`"
            ]
        );
        assert!(
            build_with(
                quote::quote!(name = "job:{id}", ttl = "1s", guard = lease),
                &["id"]
            )
            .is_ok()
        );
    }

    #[test]
    fn placeholders_name_parameters() {
        let err = build_with(
            quote::quote!(name = "invoice:{tenat}", ttl = "1s"),
            &["tenant", "year"],
        )
        .unwrap_err();
        assert_eq!(
            err,
            [
                "`{tenat}` in the lock name is not a parameter of this function: did you mean `{tenant}`?"
            ]
        );
        let err = build_with(quote::quote!(name = "{x}", ttl = "1s"), &[]).unwrap_err();
        assert!(
            err[0].ends_with("it has no parameters; add one for the value the key needs"),
            "{err:?}"
        );
        let err =
            build_with(quote::quote!(name = "{customer}", ttl = "1s"), &["a", "b"]).unwrap_err();
        assert!(err[0].ends_with("its parameters are `a`, `b`"), "{err:?}");
    }
}
