//! What one connection attempt can end in: the error, the failure said
//! as cause and fix, and the encryption it tried (shared by the attempts
//! and the explanations of their errors).
use std::path::Path;
use std::time::Duration;

use super::tls::Verify;

/// Why one attempt failed: the cause and its fix, one line each.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) what: String,
    pub(super) fix: String,
}

/// How one attempt negotiates encryption.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Encryption {
    Plain,
    /// TLS if the server offers it (sslmode=prefer).
    Prefer(Verify),
    Require(Verify),
}

pub(super) enum AttemptError {
    Pg(postgres::Error),
    /// The TLS configuration (a certificate file) could not be loaded.
    Setup(String),
    /// No answer within the connect timeout.
    Deadline(Duration),
}

pub(super) fn no_socket(sock: &Path) -> Failure {
    Failure {
        what: format!(
            "no server socket at {} (is the server running locally and accepting connections on that socket?)",
            sock.display()
        ),
        fix: "pass host= the server's socket directory (SHOW unix_socket_directories) and port= the server's port, or host=localhost for TCP".into(),
    }
}
