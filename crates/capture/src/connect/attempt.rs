//! Connecting: each target in turn, with libpq's sslmode fallbacks and a deadline.
use std::time::Duration;

use anyhow::Result;

use super::explain::{explain, is_tls, one_line, sqlstate};
use super::failure::{no_socket, AttemptError, Encryption, Failure};
use super::spec::{ConnSpec, Host, Password, SslMode, Target};
use super::tls::{self, Verify};
use crate::error::fixable;

/// An open session and how it was reached.
pub struct Connected {
    pub client: postgres::Client,
    pub target: Target,
}

/// Connect to the first target that accepts, with `options` appended to
/// the session's (`-c default_transaction_read_only=on` for the observer).
pub fn connect(spec: &ConnSpec, options: &str) -> Result<Connected> {
    let mut failures = Vec::new();
    if spec.default_host {
        // One server: whichever default directory has its socket.
        let found = spec
            .targets
            .iter()
            .find(|t| t.socket().is_some_and(|s| s.exists()));
        match found {
            Some(t) => match connect_target(spec, t, options) {
                Ok(c) => return Ok(c),
                Err(f) => failures.push(f),
            },
            None => {
                let socks: Vec<String> = spec
                    .targets
                    .iter()
                    .filter_map(|t| t.socket().map(|s| s.display().to_string()))
                    .collect();
                failures.push(Failure {
                    what: format!(
                        "no server socket at {} (no host given; is the server running locally and accepting connections on a socket there?)",
                        socks.join(" or ")
                    ),
                    fix: "pass host= the server's socket directory (SHOW unix_socket_directories) and port=, or host=localhost port=… for TCP, in --dsn or PGHOST/PGPORT".into(),
                });
            }
        }
    } else {
        for t in &spec.targets {
            match connect_target(spec, t, options) {
                Ok(c) => return Ok(c),
                Err(f) => failures.push(f),
            }
        }
    }
    let what = failures
        .iter()
        .map(|f| f.what.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    let fix = failures
        .last()
        .map(|f| f.fix.clone())
        .unwrap_or_else(|| "pass --dsn".into());
    Err(fixable(one_line(&what), one_line(&fix)))
}

/// One server, with libpq's sslmode fallbacks.
fn connect_target(spec: &ConnSpec, t: &Target, options: &str) -> Result<Connected, Failure> {
    let (password, ignored) = spec.password_for(t);
    let verify = spec.verify();
    let fail = |e: AttemptError, enc: Encryption| {
        explain(spec, t, password.as_ref(), ignored.as_deref(), enc, &e)
    };
    if let Some(sock) = t.socket() {
        if !sock.exists() {
            return Err(no_socket(&sock));
        }
        // libpq never asks for TLS over a unix socket, whatever sslmode says.
        return attempt(spec, t, password.as_ref(), options, Encryption::Plain)
            .map_err(|e| fail(e, Encryption::Plain));
    }
    let first = match spec.sslmode {
        SslMode::Disable | SslMode::Allow => Encryption::Plain,
        SslMode::Prefer => Encryption::Prefer(verify),
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Encryption::Require(verify),
    };
    let err = match attempt(spec, t, password.as_ref(), options, first) {
        Ok(c) => return Ok(c),
        Err(e) => e,
    };
    // libpq's second tries: allow adds TLS when the server refused a plain
    // session; prefer drops it when the handshake or the TLS session failed.
    let second = match (spec.sslmode, &err) {
        (SslMode::Allow, AttemptError::Pg(e)) if sqlstate(e) == Some("28000") => {
            Some(Encryption::Require(verify))
        }
        (SslMode::Prefer, AttemptError::Pg(e))
            if is_tls(e)
                || (sqlstate(e) == Some("28000")
                    && e.as_db_error().is_some_and(|d| {
                        d.message().contains("SSL encryption") || d.message().contains("SSL on")
                    })) =>
        {
            Some(Encryption::Plain)
        }
        _ => None,
    };
    let Some(second) = second else {
        return Err(fail(err, first));
    };
    let first_failure = fail(err, first);
    attempt(spec, t, password.as_ref(), options, second).map_err(|e| {
        let f = fail(e, second);
        Failure {
            what: format!(
                "{}; then {}: {}",
                first_failure.what,
                enc_name(second),
                f.what
            ),
            fix: f.fix,
        }
    })
}

fn enc_name(e: Encryption) -> &'static str {
    match e {
        Encryption::Plain => "without TLS",
        _ => "with TLS",
    }
}

impl ConnSpec {
    /// Certificate checks for the TLS attempts: none, unless sslmode asks or
    /// a root certificate is there (libpq then checks it for require too).
    pub(super) fn verify(&self) -> Verify {
        match (self.sslmode, &self.root_cert) {
            (SslMode::VerifyFull, _) => Verify::Full,
            (SslMode::VerifyCa, _) => Verify::Ca,
            (SslMode::Require | SslMode::Prefer, Some(_)) => Verify::Ca,
            _ => Verify::None,
        }
    }
}

fn attempt(
    spec: &ConnSpec,
    t: &Target,
    password: Option<&Password>,
    options: &str,
    enc: Encryption,
) -> Result<Connected, AttemptError> {
    let mut cfg = postgres::Config::new();
    cfg.user(&spec.user);
    cfg.dbname(&spec.dbname);
    cfg.application_name(super::APPLICATION_NAME);
    let opts = match &spec.options {
        Some(o) => format!("{o} {options}"),
        None => options.to_string(),
    };
    if !opts.trim().is_empty() {
        cfg.options(opts.trim());
    }
    if let Some(p) = password {
        cfg.password(&p.value);
    }
    match &t.host {
        Host::Unix(d) => {
            cfg.host_path(d);
        }
        Host::Tcp(h) => {
            cfg.host(h);
        }
    }
    if let Some(a) = t.hostaddr {
        cfg.hostaddr(a);
    }
    cfg.port(t.port);
    if let Some(d) = spec.connect_timeout {
        cfg.connect_timeout(d);
    }
    cfg.channel_binding(spec.channel_binding);
    let (mode, verify) = match enc {
        Encryption::Plain => (postgres::config::SslMode::Disable, Verify::None),
        Encryption::Prefer(v) => (postgres::config::SslMode::Prefer, v),
        Encryption::Require(v) => (postgres::config::SslMode::Require, v),
    };
    cfg.ssl_mode(mode);
    // A plain session (every unix socket) needs no TLS connector: building
    // one parses the system's CA bundle, which `watch` did every window.
    let client = if enc == Encryption::Plain {
        with_deadline(spec.connect_timeout, move || cfg.connect(postgres::NoTls))?
    } else {
        let tls = tls::connector(verify, spec.root_cert.as_ref(), spec.client_cert.as_ref())
            .map_err(AttemptError::Setup)?;
        with_deadline(spec.connect_timeout, move || cfg.connect(tls))?
    };
    Ok(Connected {
        client,
        target: t.clone(),
    })
}

/// Run the connection on its own thread so that a server that accepts but
/// never answers cannot hang pgbelow (the `postgres` crate's timeout covers
/// only the socket's connect).
fn with_deadline(
    timeout: Option<Duration>,
    f: impl FnOnce() -> Result<postgres::Client, postgres::Error> + Send + 'static,
) -> Result<postgres::Client, AttemptError> {
    let Some(timeout) = timeout else {
        return f().map_err(AttemptError::Pg);
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("pgbelow-connect".into())
        .spawn(move || {
            let _ = tx.send(f());
        });
    if spawned.is_err() {
        return Err(AttemptError::Setup("cannot start a thread".into()));
    }
    // libpq's connect_timeout bounds the whole attempt; the socket's own
    // timeout (the same) reports first when the connect itself hangs.
    match rx.recv_timeout(timeout + Duration::from_millis(500)) {
        Ok(r) => r.map_err(AttemptError::Pg),
        Err(_) => Err(AttemptError::Deadline(timeout)),
    }
}
