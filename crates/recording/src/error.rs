//! Errors a user can act on: each names the object and the exact fix.
use std::fmt;

/// An environment or usage problem. `main` prints it on one line and exits 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fixable {
    /// What failed, naming the object (a path, a version, a setting).
    pub what: String,
    /// The exact fix, as a command or a setting where possible.
    pub fix: String,
}

impl fmt::Display for Fixable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (fix: {})", self.what, self.fix)
    }
}

impl std::error::Error for Fixable {}

/// Build an `anyhow::Error` carrying a [`Fixable`].
pub fn fixable(what: impl Into<String>, fix: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Fixable {
        what: what.into(),
        fix: fix.into(),
    })
}

/// A [`Fixable`] that is a privilege pgbelow lacks: waiting and retrying
/// cannot help (`watch` exits on it instead of retrying).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unprivileged(pub Fixable);

impl fmt::Display for Unprivileged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Unprivileged {}

/// Build an `anyhow::Error` carrying an [`Unprivileged`].
pub fn unprivileged(what: impl Into<String>, fix: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Unprivileged(Fixable {
        what: what.into(),
        fix: fix.into(),
    }))
}

/// Is a missing privilege somewhere in the chain?
pub fn is_unprivileged(err: &anyhow::Error) -> bool {
    err.chain().any(|e| e.is::<Unprivileged>())
}

/// The first [`Fixable`] in an error chain, if any.
pub fn find_fixable(err: &anyhow::Error) -> Option<&Fixable> {
    err.chain().find_map(|e| {
        e.downcast_ref::<Fixable>()
            .or_else(|| e.downcast_ref::<Unprivileged>().map(|u| &u.0))
    })
}

/// An error as one line, as `pgbelow: error:` prints it: the first
/// [`Fixable`] of the chain (what, why and the fix), else the whole chain
/// with its line breaks collapsed.
pub fn one_line(err: &anyhow::Error) -> String {
    match find_fixable(err) {
        Some(f) => f.to_string(),
        None => format!("{err:#}")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixable_is_found_under_context() {
        let e = fixable("pgbench not found", "apt-get install postgresql-client")
            .context("starting the workload");
        let f = find_fixable(&e).expect("fixable in chain");
        assert_eq!(f.fix, "apt-get install postgresql-client");
        assert_eq!(
            f.to_string(),
            "pgbench not found (fix: apt-get install postgresql-client)"
        );
    }
}
