//! Direct recursion: an `async fn` whose body awaits a call of itself. Its future would contain
//! itself; rustc's account of that (E0733) walks through the runtime's functions that the
//! expansion adds to the cycle, so the attribute reports it first, at the call, with the fix.

use proc_macro2::Span;
use syn::visit::{self, Visit};
use syn::visit_mut::{self, VisitMut};
use syn::{Expr, ExprAwait, FnArg, Ident, Item, ItemFn, PatIdent};

/// The error for the first awaited call of `func` by itself in its own body, if there is one:
/// `name(..)`, `Self::name(..)` or `self.name(..)`, awaited as it is (a call already boxed,
/// `Box::pin(name(..)).await`, is fine). Nested items are other functions; a body that binds
/// `name` to something else (a closure, say) is not searched for plain `name(..)` calls.
pub(crate) fn check(func: &ItemFn) -> syn::Result<()> {
    let mut finder = Finder {
        calls: SelfCalls::of(func),
        found: None,
    };
    finder.visit_block(&func.block);
    let Some((span, call)) = finder.found else {
        return Ok(());
    };
    Err(syn::Error::new(
        span,
        format!(
            "`{name}` calls itself here: a recursive `async fn` must box the call; write \
             `Box::pin({call}(..)).await`",
            name = func.sig.ident,
        ),
    ))
}

/// Boxes each call that [`check`] reports, as its message says to: the function emitted as
/// written next to that error then gets no second one about the same call from rustc.
pub(crate) fn box_calls(func: &mut ItemFn) {
    let mut boxer = Boxer(SelfCalls::of(func));
    boxer.visit_block_mut(&mut func.block);
}

/// What a call of the function itself looks like in its body.
struct SelfCalls {
    name: Ident,
    /// Whether a parameter or a pattern in the body binds the function's name (then a plain
    /// `name(..)` calls that).
    shadowed: bool,
}

impl SelfCalls {
    fn of(func: &ItemFn) -> Self {
        let mut binds = Binds {
            name: &func.sig.ident,
            found: false,
        };
        for input in &func.sig.inputs {
            if let FnArg::Typed(typed) = input {
                binds.visit_pat(&typed.pat);
            }
        }
        binds.visit_block(&func.block);
        Self {
            shadowed: binds.found,
            name: func.sig.ident.clone(),
        }
    }

    /// The called name's span and the callee as written, if `expr` calls the function itself.
    fn callee(&self, expr: &Expr) -> Option<(Span, String)> {
        match expr {
            Expr::Call(call) => {
                let Expr::Path(path) = &*call.func else {
                    return None;
                };
                if path.qself.is_some() {
                    return None;
                }
                let names: Vec<&Ident> = path.path.segments.iter().map(|s| &s.ident).collect();
                match names[..] {
                    [called] if *called == self.name && !self.shadowed => {
                        Some((called.span(), called.to_string()))
                    }
                    [ty, called] if ty == "Self" && *called == self.name => {
                        Some((called.span(), format!("Self::{called}")))
                    }
                    _ => None,
                }
            }
            Expr::MethodCall(call) if call.method == self.name => match &*call.receiver {
                Expr::Path(receiver) if receiver.path.is_ident("self") => {
                    Some((call.method.span(), format!("self.{}", call.method)))
                }
                _ => None,
            },
            Expr::Paren(inner) => self.callee(&inner.expr),
            Expr::Group(inner) => self.callee(&inner.expr),
            _ => None,
        }
    }
}

/// Whether a pattern binds `name`.
struct Binds<'a> {
    name: &'a Ident,
    found: bool,
}

impl<'ast> Visit<'ast> for Binds<'_> {
    fn visit_pat_ident(&mut self, node: &'ast PatIdent) {
        self.found |= node.ident == *self.name;
        visit::visit_pat_ident(self, node);
    }

    fn visit_item(&mut self, _: &'ast Item) {}
}

/// The first awaited call of the function itself.
struct Finder {
    calls: SelfCalls,
    found: Option<(Span, String)>,
}

impl<'ast> Visit<'ast> for Finder {
    fn visit_expr_await(&mut self, node: &'ast ExprAwait) {
        if self.found.is_none() {
            self.found = self.calls.callee(&node.base);
        }
        visit::visit_expr_await(self, node);
    }

    fn visit_item(&mut self, _: &'ast Item) {}
}

/// Wraps each awaited call of the function itself in `Box::pin`.
struct Boxer(SelfCalls);

impl VisitMut for Boxer {
    fn visit_expr_await_mut(&mut self, node: &mut ExprAwait) {
        visit_mut::visit_expr_await_mut(self, node);
        if self.0.callee(&node.base).is_some() {
            let call = &node.base;
            *node.base = syn::parse_quote!(::std::boxed::Box::pin(#call));
        }
    }

    fn visit_item_mut(&mut self, _: &mut Item) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(func: &str) -> Option<String> {
        let func: ItemFn = syn::parse_str(func).unwrap();
        check(&func).err().map(|e| e.to_string())
    }

    #[test]
    fn finds_an_awaited_call_of_itself() {
        let message =
            error("async fn walk(n: u32) -> u32 { if n > 0 { walk(n - 1).await } else { 0 } }");
        assert_eq!(
            message.as_deref(),
            Some(
                "`walk` calls itself here: a recursive `async fn` must box the call; write \
                 `Box::pin(walk(..)).await`"
            )
        );
        let message =
            error("async fn walk(&self) -> Result<(), E> { Self::walk(self).await? ; Ok(()) }");
        assert!(
            message
                .unwrap()
                .ends_with("`Box::pin(Self::walk(..)).await`")
        );
        let message = error("async fn walk(&self) { let _ = (self.walk()).await; }");
        assert!(
            message
                .unwrap()
                .ends_with("`Box::pin(self.walk(..)).await`")
        );
    }

    #[test]
    fn boxed_calls_other_functions_and_other_names_are_fine() {
        for func in [
            "async fn walk(n: u32) { Box::pin(walk(n - 1)).await }",
            "async fn walk(n: u32) { other::walk(n).await; run(walk(n)).await }",
            "async fn walk(n: u32) { let walk = |n| async move { n }; walk(n).await; }",
            "async fn walk(walk: F) { walk(1).await }",
            "async fn walk() { async fn inner() { walk().await } other.walk().await }",
        ] {
            assert_eq!(error(func), None, "{func}");
        }
    }

    #[test]
    fn boxing_the_calls_ends_the_recursion() {
        let mut func: ItemFn = syn::parse_str(
            "async fn walk(&self, n: u32) { walk(n).await; Self::walk(n).await; (self.walk(n)).await? }",
        )
        .unwrap();
        box_calls(&mut func);
        assert!(check(&func).is_ok());
        let boxed = quote::quote!(#func).to_string();
        assert_eq!(boxed.matches("Box :: pin").count(), 3, "{boxed}");
    }
}
