//! An error and its causes as one line: a leaf the registry's error type, auth and transport
//! all use, so auth need not import the error module that names its errors.

/// `e` and its causes, `: `-joined; reqwest's own message omits the interesting part.
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
