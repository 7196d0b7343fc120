//! One `build` step from the options as written to a checked [`Config`]: required options,
//! durations converted to whole milliseconds, the rules between them, and the key template
//! against the function's parameters. Each error points at the value it is about.

use std::time::Duration;

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::{Expr, Ident, LitStr, Path};

use crate::parse::{self, RawArgs};
use crate::template::{self, Piece};

/// The checked options, ready for expansion.
pub(crate) struct Config {
    /// `format!` string of the key, spanned like the `name` literal.
    pub key_format: LitStr,
    /// The parameters the placeholders name, in order.
    pub key_args: Vec<Ident>,
    pub ttl_ms: u64,
    pub max_exec_ms: Option<u64>,
    pub renew_ms: Option<u64>,
    pub wait_ms: Option<u64>,
    pub min_hold_ms: Option<u64>,
    pub locker: Option<Expr>,
    pub guard: Option<Ident>,
    pub krate: Path,
}

/// Gathers errors so that one compile reports all of them.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, err: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(err),
            None => self.0 = Some(err),
        }
    }

    pub(crate) fn push_result<T>(&mut self, result: syn::Result<T>) -> Option<T> {
        result.map_err(|err| self.push(err)).ok()
    }

    pub(crate) fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

/// Checks the options as a whole, adding each problem to `errors`; `params` are the names the
/// function's parameters bind. `None` when `name` or `ttl` is unusable; a `Config` may still come
/// with errors (about other options), so the caller checks `errors` before using it.
pub(crate) fn build(raw: RawArgs, params: &[Ident], errors: &mut Errors) -> Option<Config> {
    let key = match &raw.name {
        Some(lit) => errors.push_result(key(lit, params)),
        None if raw.seen.contains(&"name") => None,
        None => {
            errors.push(missing(
                "name",
                "the lock's key, like `name = \"job:{id}\"`",
            ));
            None
        }
    };
    let mut ms = |lit: &Option<LitStr>, option: &str| {
        let lit = lit.as_ref()?;
        errors.push_result(
            parse_millis(option, &lit.value()).map_err(|m| syn::Error::new(lit.span(), m)),
        )
    };
    let ttl = ms(&raw.ttl, "ttl");
    let max_exec = ms(&raw.max_exec, "max_exec");
    let renew = ms(&raw.renew, "renew");
    let wait_ms = ms(&raw.wait, "wait");
    let min_hold = ms(&raw.min_hold, "min_hold");
    if !raw.seen.contains(&"ttl") {
        errors.push(missing(
            "ttl",
            "how long the lease lasts, like `ttl = \"30s\"`",
        ));
    }
    // The rules compare with ttl; a value that did not parse has been reported already.
    if let Some(ttl) = ttl {
        for (option, message) in check_rules(ttl, max_exec, renew, min_hold) {
            let lit = match option {
                "max_exec" => &raw.max_exec,
                "renew" => &raw.renew,
                "min_hold" => &raw.min_hold,
                _ => &raw.ttl,
            };
            errors.push(syn::Error::new(
                lit.as_ref().map_or_else(Span::call_site, LitStr::span),
                message,
            ));
        }
    }
    let (key_format, key_args) = key?;
    Some(Config {
        key_format,
        key_args,
        ttl_ms: ttl?,
        max_exec_ms: max_exec,
        renew_ms: renew,
        wait_ms,
        min_hold_ms: min_hold,
        locker: raw.locker,
        guard: raw.guard,
        krate: raw
            .krate
            .unwrap_or_else(|| syn::parse_quote!(::lock_runtime)),
    })
}

fn missing(option: &str, what: &str) -> syn::Error {
    syn::Error::new(Span::call_site(), format!("missing `{option}`: {what}"))
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
    let closest = names
        .iter()
        .map(|known| (parse::edit_distance(name, known), known))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d);
    let hint = match (closest, names.is_empty()) {
        (Some((_, known)), _) => format!("did you mean `{{{known}}}`?"),
        (None, true) => "it has no parameters; add one for the value the key needs".to_owned(),
        (None, false) => {
            let listed: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
            format!("its parameters are {}", listed.join(", "))
        }
    };
    format!("`{{{name}}}` in the lock name is not a parameter of this function: {hint}")
}

const EXAMPLES: &str = "write durations like \"250ms\", \"30s\" or \"1m 30s\"";

/// A duration string in whole milliseconds; the error names the option and shows valid forms.
pub(crate) fn parse_millis(option: &str, text: &str) -> Result<u64, String> {
    let duration = humantime::parse_duration(text)
        .map_err(|err| format!("`{option} = \"{text}\"` is not a duration ({err}); {EXAMPLES}"))?;
    if duration.subsec_nanos() % 1_000_000 != 0 {
        let up = duration.as_millis() + 1;
        return Err(format!(
            "`{option} = \"{text}\"` is not a whole number of milliseconds, the unit locks are kept in; \
             round it, e.g. \"{up}ms\""
        ));
    }
    u64::try_from(duration.as_millis()).map_err(|_| format!("`{option} = \"{text}\"` is too long"))
}

fn show(ms: u128) -> String {
    let ms = u64::try_from(ms).unwrap_or(u64::MAX);
    humantime::format_duration(Duration::from_millis(ms)).to_string()
}

/// The rules between durations, all in whole milliseconds as the runtime checks them:
/// `drift = ttl/100 + 2ms`, `0 < max_exec <= ttl - drift`, `0 < renew <= ttl/2`, `min_hold <= ttl`.
/// Returns each broken rule with the option to blame.
pub(crate) fn check_rules(
    ttl: u64,
    max_exec: Option<u64>,
    renew: Option<u64>,
    min_hold: Option<u64>,
) -> Vec<(&'static str, String)> {
    let (ttl, mut broken) = (u128::from(ttl), Vec::new());
    let drift = ttl / 100 + 2;
    // Below 3ms, the default max_exec (ttl - drift) would be zero: no time for the body.
    if ttl <= drift {
        let message = format!(
            "ttl = {} is too short: the body may run for ttl - (ttl/100 + 2ms), so ttl must be at least 3ms",
            show(ttl)
        );
        return vec![("ttl", message)];
    }
    let limit = ttl - drift;
    match max_exec.map(u128::from) {
        Some(0) => broken.push(("max_exec", "max_exec must be above zero: it is how long the body may run".into())),
        Some(max) if max > limit => broken.push((
            "max_exec",
            format!(
                "max_exec = {} is too long for ttl = {}: it must be at most ttl - (ttl/100 + 2ms) = {}, so the \
                 body is stopped before the key can expire; lower max_exec or raise ttl",
                show(max),
                show(ttl),
                show(limit)
            ),
        )),
        _ => {}
    }
    match renew.map(u128::from) {
        Some(0) => broken.push(("renew", "renew must be above zero: it is how often the lease is renewed".into())),
        Some(every) if every * 2 > ttl => broken.push((
            "renew",
            format!(
                "renew = {} is too long for ttl = {}: renew at least twice per lease (renew <= ttl/2), so a \
                 failed renewal can be retried before the key expires; lower renew or raise ttl",
                show(every),
                show(ttl)
            ),
        )),
        _ => {}
    }
    if let Some(hold) = min_hold.map(u128::from).filter(|hold| *hold > ttl) {
        broken.push((
            "min_hold",
            format!(
                "min_hold = {} must be at most ttl = {}: the key cannot be kept past its lease; lower min_hold or raise ttl",
                show(hold),
                show(ttl)
            ),
        ));
    }
    broken
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
        let err = parse_millis("ttl", "30").unwrap_err();
        assert!(
            err.starts_with("`ttl = \"30\"` is not a duration") && err.contains("\"1m 30s\""),
            "{err}"
        );
        assert!(parse_millis("ttl", "soon").is_err());
        assert!(parse_millis("ttl", "").is_err());
    }

    fn blamed(
        ttl: u64,
        max_exec: Option<u64>,
        renew: Option<u64>,
        min_hold: Option<u64>,
    ) -> Vec<&'static str> {
        check_rules(ttl, max_exec, renew, min_hold)
            .into_iter()
            .map(|(o, _)| o)
            .collect()
    }

    #[test]
    fn ttl_leaves_time_for_the_body() {
        assert_eq!(blamed(0, None, None, None), ["ttl"]);
        assert_eq!(blamed(2, None, None, None), ["ttl"]);
        assert!(blamed(3, None, None, None).is_empty());
    }

    #[test]
    fn max_exec_stays_below_ttl_minus_drift() {
        // ttl 30s: drift = 300 + 2 ms, limit 29_698 ms.
        assert!(blamed(30_000, Some(29_698), None, None).is_empty());
        assert_eq!(blamed(30_000, Some(29_699), None, None), ["max_exec"]);
        assert_eq!(blamed(30_000, Some(0), None, None), ["max_exec"]);
        // ttl 150ms: drift = 1 + 2 ms (integer division), limit 147 ms.
        assert!(blamed(150, Some(147), None, None).is_empty());
        assert_eq!(blamed(150, Some(148), None, None), ["max_exec"]);
        let (_, message) = &check_rules(30_000, Some(30_000), None, None)[0];
        assert!(message.contains("= 29s 698ms"), "{message}");
    }

    #[test]
    fn renew_is_positive_and_at_most_half_the_ttl() {
        assert!(blamed(30_000, None, Some(15_000), None).is_empty());
        assert_eq!(blamed(30_000, None, Some(15_001), None), ["renew"]);
        assert_eq!(blamed(30_000, None, Some(0), None), ["renew"]);
        // Odd ttl: 3ms / 2 = 1.5ms, so 1ms passes and 2ms does not.
        assert!(blamed(3, None, Some(1), None).is_empty());
        assert_eq!(blamed(3, None, Some(2), None), ["renew"]);
    }

    #[test]
    fn min_hold_fits_in_the_ttl_and_rules_add_up() {
        assert!(blamed(30_000, None, None, Some(30_000)).is_empty());
        assert_eq!(blamed(30_000, None, None, Some(30_001)), ["min_hold"]);
        assert_eq!(
            blamed(1_000, Some(1_000), Some(600), Some(2_000)),
            ["max_exec", "renew", "min_hold"]
        );
    }
}
