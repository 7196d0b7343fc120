//! Errors gathered across the stages, so that one compile reports every mistake at once.

/// Every error found so far, combined into one `syn::Error` (which holds many).
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, err: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(err),
            None => self.0 = Some(err),
        }
    }

    /// The value, or `None` after recording why there is none.
    pub(crate) fn push_result<T>(&mut self, result: syn::Result<T>) -> Option<T> {
        result.map_err(|err| self.push(err)).ok()
    }

    pub(crate) fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}
