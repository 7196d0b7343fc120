//! Reads `key = value, ...` into [`RawArgs`], one field per option, each value keeping its span.
//!
//! Only the kind of each value is checked here (a string, an identifier, a path); rules between
//! options and against the function live in `config`.

use lock_rules::DurationKey;
use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, Ident, Lit, LitInt, LitStr, Path, Token};

use crate::errors::Errors;
use crate::options::OptionKey;

/// The options as written; `None` when not given or when its value was of the wrong kind.
#[derive(Default)]
pub(crate) struct RawArgs {
    /// Every known option written, valid or not: a bad `ttl` is not also reported as missing.
    pub seen: Vec<OptionKey>,
    /// The options that unknown keys were taken to mean: a `key = ".."` is not also reported as
    /// a missing `name`.
    pub meant: Vec<OptionKey>,
    pub name: Option<LitStr>,
    /// Every name of `name = ["a:{x}", "b:{y}"]`, the first also in `name`; empty for one name.
    pub names: Vec<LitStr>,
    pub ttl: Option<LitStr>,
    pub lease: Option<LitStr>,
    pub max_exec: Option<LitStr>,
    pub renew: Option<LitStr>,
    pub wait: Option<LitStr>,
    pub min_hold: Option<LitStr>,
    pub permits: Option<LitInt>,
    /// `shared` as written (a bare flag, or `shared = true`), when the hold is shared.
    pub shared: Option<Ident>,
    /// `fail_open` as written (a bare flag, or `fail_open = true`), when it is on.
    pub fail_open: Option<Ident>,
    pub locker: Option<Expr>,
    pub guard: Option<Ident>,
    pub krate: Option<Path>,
}

impl RawArgs {
    /// The literal of a duration option, if given and a string.
    pub(crate) fn duration(&self, key: DurationKey) -> Option<&LitStr> {
        match key {
            DurationKey::Ttl => self.ttl.as_ref(),
            DurationKey::Lease => self.lease.as_ref(),
            DurationKey::MaxExec => self.max_exec.as_ref(),
            DurationKey::Renew => self.renew.as_ref(),
            DurationKey::MinHold => self.min_hold.as_ref(),
        }
    }
}

/// One `key = value`, or a bare `key` (a flag: `shared`). The value is read as an expression
/// whatever the key, so that an unknown or mistyped key still parses and every error of the list
/// is reported at once.
struct Arg {
    key: Ident,
    value: Option<Expr>,
}

impl Parse for Arg {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        if !input.peek(Ident::peek_any) {
            return Err(
                input.error("expected an option like `name = \"job:{id}\"` or `ttl = \"30s\"`")
            );
        }
        // `parse_any` so that the keyword `crate` is accepted as a key.
        let key = Ident::parse_any(input)?;
        if !input.peek(Token![=]) {
            if input.is_empty() || input.peek(Token![,]) {
                return Ok(Self { key, value: None });
            }
            return Err(syn::Error::new(
                key.span(),
                format!("expected `=` after `{key}`: write `{key} = ...`"),
            ));
        }
        input.parse::<Token![=]>()?;
        let value = Some(input.parse()?);
        Ok(Self { key, value })
    }
}

/// Parses the attribute's arguments, adding each problem to `errors`. The options that are fine
/// are still returned, so that `config` can check them too and one compile reports everything;
/// `None` only when the list itself does not parse.
pub(crate) fn parse_args(tokens: TokenStream, errors: &mut Errors) -> Option<RawArgs> {
    let args = errors.push_result(Punctuated::<Arg, Token![,]>::parse_terminated.parse2(tokens))?;
    let mut raw = RawArgs::default();
    for Arg { key, value } in args {
        let name = key.unraw().to_string();
        let Some(option) = OptionKey::from_name(&name) else {
            let meant = OptionKey::meant_for(&name);
            errors.push(syn::Error::new(
                key.span(),
                OptionKey::unknown(&name, &meant),
            ));
            raw.meant.extend(meant);
            continue;
        };
        if raw.seen.contains(&option) {
            errors.push(syn::Error::new(
                key.span(),
                format!("`{}` is given twice; keep one", option.name()),
            ));
            continue;
        }
        raw.seen.push(option);
        let value = match (value, option) {
            (None, OptionKey::Shared) => {
                raw.shared = Some(key);
                continue;
            }
            (None, OptionKey::FailOpen) => {
                raw.fail_open = Some(key);
                continue;
            }
            (Some(value), _) => value,
            (None, _) => {
                errors.push(syn::Error::new(
                    key.span(),
                    format!("expected `=` after `{name}`: write `{name} = ...`"),
                ));
                continue;
            }
        };
        let result = match option {
            OptionKey::Name => names(value).map(|names| {
                raw.name = names.first().cloned();
                // One name in an array is one name.
                if names.len() > 1 {
                    raw.names = names;
                }
            }),
            OptionKey::Ttl => set(&mut raw.ttl, duration(value)),
            OptionKey::Lease => set(&mut raw.lease, duration(value)),
            OptionKey::MaxExec => set(&mut raw.max_exec, duration(value)),
            OptionKey::Renew => set(&mut raw.renew, duration(value)),
            OptionKey::Wait => set(&mut raw.wait, duration(value)),
            OptionKey::MinHold => set(&mut raw.min_hold, duration(value)),
            OptionKey::Permits => set(&mut raw.permits, count(value)),
            OptionKey::Shared => flag(value, "shared").map(|on| raw.shared = on.then_some(key)),
            OptionKey::FailOpen => {
                flag(value, "fail_open").map(|on| raw.fail_open = on.then_some(key))
            }
            OptionKey::Locker => set(&mut raw.locker, Ok(value)),
            OptionKey::Guard => set(&mut raw.guard, guard(value)),
            OptionKey::Crate => set(&mut raw.krate, crate_path(value)),
        };
        errors.push_result(result);
    }
    Some(raw)
}

fn set<T>(slot: &mut Option<T>, value: syn::Result<T>) -> syn::Result<()> {
    *slot = Some(value?);
    Ok(())
}

/// `name`: one string literal, or an array of them (several names taken at once).
fn names(value: Expr) -> syn::Result<Vec<LitStr>> {
    const ONE: &str = "a string literal, like `name = \"job:{id}\"`, or an array of them, like \
                       `name = [\"account:{from}\", \"account:{to}\"]`";
    match value {
        Expr::Array(array) if array.elems.is_empty() => Err(syn::Error::new_spanned(
            array,
            "expected at least one name in the array",
        )),
        Expr::Array(array) => array.elems.into_iter().map(|e| string(e, ONE)).collect(),
        other => string(other, ONE).map(|lit| vec![lit]),
    }
}

fn string(value: Expr, expected: &str) -> syn::Result<LitStr> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Ok(s),
        other => Err(syn::Error::new_spanned(
            other,
            format!("expected {expected}"),
        )),
    }
}

fn duration(value: Expr) -> syn::Result<LitStr> {
    // `ttl = 30s` lexes as the number 30 with suffix `s`: suggest the quoted form.
    if let Expr::Lit(ExprLit {
        lit: Lit::Int(n), ..
    }) = &value
        && !n.suffix().is_empty()
    {
        let text = n.to_token_stream().to_string();
        return Err(syn::Error::new_spanned(
            &value,
            format!("expected a string: write \"{text}\""),
        ));
    }
    string(
        value,
        "a string like \"30s\" (durations are written \"250ms\", \"30s\", \"1m 30s\")",
    )
}

fn flag(value: Expr, name: &str) -> syn::Result<bool> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Bool(b), ..
        }) => Ok(b.value),
        other => Err(syn::Error::new_spanned(
            other,
            format!("expected `true` or `false`, or the bare flag: `{name}`"),
        )),
    }
}

fn count(value: Expr) -> syn::Result<LitInt> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(n), ..
        }) if n.suffix().is_empty() => Ok(n),
        other => Err(syn::Error::new_spanned(
            other,
            "expected a whole number, like `permits = 5`",
        )),
    }
}

fn guard(value: Expr) -> syn::Result<Ident> {
    let ident = match &value {
        Expr::Path(p) if p.qself.is_none() && p.attrs.is_empty() => p.path.get_ident(),
        _ => None,
    };
    match ident {
        // `self`, `crate` etc. are paths too, but cannot name a new binding.
        Some(ident)
            if !matches!(
                ident.to_string().as_str(),
                "self" | "Self" | "super" | "crate"
            ) =>
        {
            Ok(ident.clone())
        }
        _ => Err(syn::Error::new_spanned(
            value,
            "expected an identifier, like `guard = lease`: it names the `&Lease` bound in the body",
        )),
    }
}

fn crate_path(value: Expr) -> syn::Result<syn::Path> {
    match value {
        Expr::Path(p) if p.qself.is_none() && p.attrs.is_empty() => Ok(p.path),
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Err(syn::Error::new(
            s.span(),
            format!(
                "expected a path, not a string: write `crate = {}`",
                s.value()
            ),
        )),
        other => Err(syn::Error::new_spanned(
            other,
            "expected a path, like `crate = ::lock_runtime`",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    #[test]
    fn reads_every_option() {
        let mut errors = Errors::default();
        let args = quote!(
            name = "a:{b}",
            ttl = "1s",
            max_exec = "500ms",
            renew = "100ms",
            wait = "2s",
            min_hold = "1s",
            locker = self.locker,
            guard = lease,
            crate = ::my::path,
        );
        let raw = parse_args(args, &mut errors).unwrap();
        assert!(errors.finish().is_ok());
        assert_eq!(raw.name.unwrap().value(), "a:{b}");
        assert_eq!(raw.guard.unwrap().to_string(), "lease");
        assert!(raw.locker.is_some() && raw.krate.is_some() && raw.min_hold.is_some());
    }

    #[test]
    fn reports_all_problems_at_once() {
        let mut errors = Errors::default();
        let raw = parse_args(
            quote!(ttl = 10, tll = "1s", guard = a.b, ttl = "1s", wait = "1s"),
            &mut errors,
        )
        .unwrap();
        let messages: Vec<String> = errors
            .finish()
            .unwrap_err()
            .into_iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(messages.len(), 4, "{messages:?}");
        assert!(messages[0].starts_with("expected a string like \"30s\""));
        assert_eq!(messages[1], "unknown option `tll`; did you mean `ttl`?");
        assert!(messages[2].starts_with("expected an identifier"));
        assert_eq!(messages[3], "`ttl` is given twice; keep one");
        // The good option is kept, and the bad ones are known to have been written.
        assert!(raw.wait.is_some() && raw.ttl.is_none());
        assert_eq!(
            raw.seen,
            [OptionKey::Ttl, OptionKey::Guard, OptionKey::Wait]
        );
    }

    #[test]
    fn a_list_that_does_not_parse_is_one_error() {
        let mut errors = Errors::default();
        assert!(parse_args(quote!(name "x"), &mut errors).is_none());
        let message = errors.finish().unwrap_err().to_string();
        assert_eq!(message, "expected `=` after `name`: write `name = ...`");
    }
}
