//! The key template: text with `{param}` placeholders.
//!
//! Placeholders are plain parameter names, nothing else (no fields, indexes or format specs):
//! the key is what other processes contend on, so it should read the same in the source and in
//! Redis. The text cannot hold braces, not even as `{{` or `}}`: the runtime wraps the name in a
//! Redis Cluster hash tag, `lock:{<name>}`, which a brace inside the name would end early.

/// A run of literal text, or a placeholder naming a parameter.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Piece {
    Text(String),
    /// The parameter's name, without any `r#`.
    Param(String),
}

/// Splits a template into pieces; the error says what is wrong and how to write it.
pub(crate) fn parse(template: &str) -> Result<Vec<Piece>, String> {
    if template.is_empty() {
        return Err("the lock name is empty: give it a key like \"job:{id}\"".into());
    }
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' | '}' if chars.peek() == Some(&c) => return Err(literal_brace(c)),
            '}' => {
                return Err(
                    "unmatched `}` in the lock name: braces only surround placeholders, like `{id}`; \
                     remove it, or open the placeholder with `{`"
                        .into(),
                );
            }
            '{' => {
                let mut inner = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => inner.push(c),
                        None => {
                            return Err(format!(
                                "unclosed `{{{inner}` in the lock name: close it with `}}`"
                            ));
                        }
                    }
                }
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                pieces.push(Piece::Param(placeholder(&inner)?));
            }
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

/// Why `{{` or `}}` (a literal brace in other format strings) cannot be used here.
fn literal_brace(brace: char) -> String {
    format!(
        "`{brace}{brace}` in the lock name would put a `{brace}` in the key: keys are `lock:{{<name>}}`, \
         and that `{{...}}` hash tag keeps a lock's keys (lock, fence counter, waiters) in one \
         Redis Cluster slot, which a brace in the name breaks; use another character, such as \
         `:` or `-`"
    )
}

/// Checks the inside of `{...}` is an identifier, and returns it without `r#`.
fn placeholder(inner: &str) -> Result<String, String> {
    if inner.is_empty() {
        return Err("empty `{}` in the lock name: name a parameter inside, like `{id}`".into());
    }
    if inner == "self" || inner.starts_with("self.") {
        return Err(format!(
            "`{{{inner}}}` cannot be used in the lock name: the key can only name parameters; \
             add a parameter with the value and write `{{param}}`"
        ));
    }
    let name = inner.strip_prefix("r#").unwrap_or(inner);
    let mut chars = name.chars();
    let starts_well = chars.next().is_some_and(|c| c == '_' || c.is_alphabetic());
    if !starts_well || name == "_" || !chars.all(|c| c == '_' || c.is_alphanumeric()) {
        return Err(format!(
            "`{{{inner}}}` in the lock name is not a parameter name: placeholders name a \
             parameter of the function, like `{{id}}` (no fields, indexes or format specs)"
        ));
    }
    Ok(name.to_owned())
}

/// The `format!` string for these pieces: each placeholder becomes a positional `{}` (the text
/// holds no braces to escape).
pub(crate) fn format_string(pieces: &[Piece]) -> String {
    let mut out = String::new();
    for piece in pieces {
        match piece {
            Piece::Text(text) => out.push_str(text),
            Piece::Param(_) => out.push_str("{}"),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::Piece::{Param, Text};
    use super::*;

    fn text(s: &str) -> Piece {
        Text(s.into())
    }
    fn param(s: &str) -> Piece {
        Param(s.into())
    }

    #[test]
    fn splits_text_and_placeholders() {
        assert_eq!(parse("job").unwrap(), vec![text("job")]);
        assert_eq!(
            parse("invoice:{tenant}:{id}").unwrap(),
            vec![text("invoice:"), param("tenant"), text(":"), param("id")]
        );
        assert_eq!(parse("{a}{b}").unwrap(), vec![param("a"), param("b")]);
        assert_eq!(parse("{r#type}").unwrap(), vec![param("type")]);
        assert_eq!(
            parse("{_x1}é{ß}").unwrap(),
            vec![param("_x1"), text("é"), param("ß")]
        );
    }

    #[test]
    fn doubled_braces_are_refused_for_the_hash_tag() {
        for bad in ["{{x}}", "a{{{b}}}c", "}}", "job:{id}}}", "{{"] {
            let err = parse(bad).unwrap_err();
            assert!(
                err.contains("hash tag")
                    && err.contains("Redis Cluster slot")
                    && err.contains("such as `:` or `-`"),
                "{bad}: {err}"
            );
        }
        assert!(
            parse("{{")
                .unwrap_err()
                .starts_with("`{{` in the lock name")
        );
        assert!(
            parse("a}}")
                .unwrap_err()
                .starts_with("`}}` in the lock name")
        );
    }

    #[test]
    fn format_string_has_one_slot_per_placeholder() {
        let pieces = parse("lit:{a}:{b}-").unwrap();
        assert_eq!(format_string(&pieces), "lit:{}:{}-");
        assert_eq!(format_string(&parse("x").unwrap()), "x");
    }

    #[test]
    fn rejects_bad_templates() {
        let err = |s: &str| parse(s).unwrap_err();
        assert!(err("").contains("empty"));
        assert!(err("a{b").starts_with("unclosed `{b`"));
        assert!(err("a{").starts_with("unclosed `{`"));
        assert!(err("a}b").starts_with("unmatched `}`"));
        assert!(err("{}").starts_with("empty `{}`"));
        assert!(err("{self}").contains("only name parameters"));
        assert!(err("{self.id}").contains("only name parameters"));
        for bad in ["{a.b}", "{0}", "{x:?}", "{ x }", "{_}", "{a-b}", "{b{c}"] {
            assert!(
                err(bad).contains("is not a parameter name"),
                "{bad}: {}",
                err(bad)
            );
        }
    }
}
