//! The function under the attribute: that it is an `async fn` with a body, and the names its
//! parameters bind (the names a key template may use).

use proc_macro2::TokenStream;
use syn::{FnArg, Ident, ItemFn, Pat, Signature, TraitItemFn};

const WHERE: &str = "`#[distributed_lock]` goes on an `async fn` with a body";

/// Parses the item as a function with a body, or explains where the attribute goes.
pub(crate) fn parse(item: TokenStream) -> syn::Result<ItemFn> {
    if let Ok(func) = syn::parse2::<ItemFn>(item.clone()) {
        return Ok(func);
    }
    // A trait method without a default body parses as this; say where to put the attribute.
    if let Ok(method) = syn::parse2::<TraitItemFn>(item.clone()) {
        return Err(syn::Error::new_spanned(
            method.sig,
            format!(
                "{WHERE}; this trait method has none: put the attribute on its implementations"
            ),
        ));
    }
    Err(syn::Error::new_spanned(
        item,
        format!("{WHERE}, not on this item"),
    ))
}

/// Rejects a function that is not `async`: the lock is held across the body's awaits.
pub(crate) fn check_async(sig: &Signature) -> syn::Result<()> {
    match sig.asyncness {
        Some(_) => Ok(()),
        None => Err(syn::Error::new(
            sig.fn_token.span,
            "`#[distributed_lock]` needs an `async fn`: make it `async fn` (callers then `.await` it)",
        )),
    }
}

/// Every name bound by the parameters, including inside patterns like `(a, b): (u32, u32)`.
/// `self` is not one: the key is built from parameters only.
pub(crate) fn bindings(sig: &Signature) -> Vec<Ident> {
    let mut out = Vec::new();
    for input in &sig.inputs {
        if let FnArg::Typed(typed) = input {
            collect(&typed.pat, &mut out);
        }
    }
    out
}

fn collect(pat: &Pat, out: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(p) => {
            out.push(p.ident.clone());
            if let Some((_, sub)) = &p.subpat {
                collect(sub, out);
            }
        }
        Pat::Tuple(p) => p.elems.iter().for_each(|e| collect(e, out)),
        Pat::TupleStruct(p) => p.elems.iter().for_each(|e| collect(e, out)),
        Pat::Struct(p) => p.fields.iter().for_each(|f| collect(&f.pat, out)),
        Pat::Slice(p) => p.elems.iter().for_each(|e| collect(e, out)),
        Pat::Reference(p) => collect(&p.pat, out),
        Pat::Paren(p) => collect(&p.pat, out),
        Pat::Type(p) => collect(&p.pat, out),
        Pat::Or(p) => p.cases.iter().take(1).for_each(|c| collect(c, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::ext::IdentExt;

    fn names(sig: &str) -> Vec<String> {
        let sig: Signature = syn::parse_str(sig).unwrap();
        bindings(&sig)
            .iter()
            .map(|i| i.unraw().to_string())
            .collect()
    }

    #[test]
    fn finds_plain_and_pattern_bindings() {
        assert_eq!(
            names("async fn f(&self, a: u32, mut b: &str, _: u8)"),
            ["a", "b"]
        );
        assert_eq!(
            names("async fn f((a, b): (u32, u32), P { x, y: z, .. }: P)"),
            ["a", "b", "x", "z"]
        );
        assert_eq!(
            names("async fn f(&(ref a, [b, ..]): &(u8, [u8; 2]), W(c): W, r#type: u8)"),
            ["a", "b", "c", "type"]
        );
        assert_eq!(
            names("async fn f(whole @ (x, _): (u8, u8))"),
            ["whole", "x"]
        );
    }
}
