//! Telling a failed attempt as psql would: the cause on one line, and its fix.
use super::failure::{no_socket, AttemptError, Encryption, Failure};
use super::spec::{ConnSpec, Host, Password, PasswordSource, SslMode, Target};
use super::tls;

pub(super) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub(super) fn sqlstate(e: &postgres::Error) -> Option<&str> {
    e.code().map(|c| c.code())
}

/// tokio-postgres's kinds are private; its Display names them.
pub(super) fn is_tls(e: &postgres::Error) -> bool {
    e.to_string() == "error performing TLS handshake"
}

fn source_text(e: &postgres::Error) -> String {
    std::error::Error::source(e)
        .map(|s| s.to_string())
        .unwrap_or_default()
}

/// The cause of a failed attempt in psql's words, and the fix.
pub(super) fn explain(
    spec: &ConnSpec,
    t: &Target,
    password: Option<&Password>,
    passfile_ignored: Option<&str>,
    enc: Encryption,
    err: &AttemptError,
) -> Failure {
    let at = t.describe();
    let e = match err {
        AttemptError::Setup(why) => {
            return Failure {
                what: format!("cannot set up TLS for {at}: {why}"),
                fix: "pass sslrootcert=/sslcert=/sslkey= readable PEM files, or sslmode=disable where the server allows it".into(),
            }
        }
        AttemptError::Deadline(d) => {
            return Failure {
                what: format!(
                    "timeout: no answer from {at} within {} s (is a PostgreSQL server listening there?)",
                    d.as_secs()
                ),
                fix: "check host= and port= (psql with the same parameters must connect), or raise connect_timeout=".into(),
            }
        }
        AttemptError::Pg(e) => e,
    };
    let user = &spec.user;
    if let Some(db) = e.as_db_error() {
        let msg = db.message();
        let code = db.code().code();
        let pw_from = match password.map(|p| &p.source) {
            Some(PasswordSource::File(f)) => format!(", password from file \"{}\"", f.display()),
            Some(PasswordSource::Env) => ", password from PGPASSWORD".into(),
            Some(PasswordSource::Dsn) => ", password from --dsn".into(),
            None => String::new(),
        };
        let what = format!("{msg} (server at {at}{pw_from})");
        let fix = match code {
            "28P01" => match password.map(|p| &p.source) {
                Some(PasswordSource::File(f)) => format!(
                    "correct the password for user \"{user}\" in {} (line {}:{}:{}:{}:PASSWORD, or * wildcards)",
                    f.display(),
                    pgpass_escape(&spec.pgpass_host(t)),
                    t.port,
                    pgpass_escape(&spec.dbname),
                    pgpass_escape(user)
                ),
                Some(PasswordSource::Env) => format!("set PGPASSWORD to the password of role \"{user}\" (or unset it and use ~/.pgpass)"),
                _ => format!("give the password of role \"{user}\": password= in --dsn, PGPASSWORD, or a ~/.pgpass line (chmod 600)"),
            },
            "28000" if msg.contains("pg_hba.conf") && msg.contains("no encryption") && enc == Encryption::Plain => format!(
                "the server takes only TLS connections from here (hostssl in pg_hba.conf), but {}: use sslmode=require (or prefer, the default)",
                spec.sslmode_origin
            ),
            "28000" if msg.contains("pg_hba.conf") => format!(
                "add a line for this address, user \"{user}\" and database \"{}\" to the server's pg_hba.conf and reload it (SELECT pg_reload_conf()), or connect as it allows",
                spec.dbname
            ),
            "28000" if msg.starts_with("Peer authentication failed") || msg.starts_with("Ident authentication failed") => format!(
                "peer authentication admits only the OS user named \"{user}\", and pgbelow runs as another: connect over TCP with a password (host=localhost, password in ~/.pgpass), or map this OS user to \"{user}\" in pg_ident.conf"
            ),
            "28000" if msg.starts_with("role") => "pass user= a role that exists and may log in (psql: \\du lists them)".into(),
            "3D000" => "pass dbname= an existing database (psql -l lists them), e.g. dbname=postgres".into(),
            "53300" => "wait for a free connection slot, or raise max_connections (a superuser may use the reserved slots)".into(),
            "57P03" => "wait until the server accepts connections (pg_isready), then run again".into(),
            "42501" => format!("GRANT CONNECT ON DATABASE {} TO {user}, or pass another dbname=", spec.dbname),
            _ => format!("fix what the server reports (SQLSTATE {code}); psql with the same parameters must connect"),
        };
        return Failure { what, fix };
    }
    let src = source_text(e);
    if e.to_string() == "invalid configuration" && src.contains("password missing") {
        let ignored = passfile_ignored
            .map(|w| format!("; {w}"))
            .unwrap_or_default();
        return Failure {
            what: format!(
                "the server at {at} asks user \"{user}\" for a password, and none was given (no password= in --dsn, no PGPASSWORD, no matching line in {}{ignored})",
                spec.passfile.display()
            ),
            fix: match passfile_ignored {
                Some(_) => format!("chmod 600 {}", spec.passfile.display()),
                None => format!(
                    "add the line {}:{}:{}:{}:PASSWORD to {} (chmod 600; PGPASSFILE names another file), or set PGPASSWORD",
                    pgpass_escape(&spec.pgpass_host(t)),
                    t.port,
                    pgpass_escape(&spec.dbname),
                    pgpass_escape(user),
                    spec.passfile.display()
                ),
            },
        };
    }
    if is_tls(e) {
        if src.contains("server does not support TLS") {
            return Failure {
                what: format!(
                    "the server at {at} does not accept TLS (ssl = off), but {} requires it",
                    spec.sslmode_origin
                ),
                fix: "turn ssl on at the server, or use sslmode=prefer (TLS when the server offers it)".into(),
            };
        }
        if src.contains("certificate verify failed") {
            // postgres-openssl appends OpenSSL's verify result ("self-signed
            // certificate", "IP address mismatch") to the error stack's text.
            let reason = src.rsplit(": ").next().unwrap_or(&src);
            let root = match &spec.root_cert {
                Some(tls::RootCert::File(f)) => format!(" against {}", f.display()),
                Some(tls::RootCert::System) => " against the system's roots".into(),
                None => String::new(),
            };
            return Failure {
                what: format!(
                    "the server's certificate at {at} failed verification{root} ({}): {reason}",
                    spec.sslmode_origin
                ),
                fix: match spec.sslmode {
                    SslMode::VerifyFull => "pass sslrootcert= the CA certificate that signed the server's, and host= a name the certificate holds; or sslmode=require to encrypt without checking".into(),
                    _ => "pass sslrootcert= the CA certificate that signed the server's, or sslmode=require without a root certificate to encrypt without checking".into(),
                },
            };
        }
        return Failure {
            what: format!("TLS handshake with {at} failed: {src}"),
            fix: "check the server's ssl settings and certificate (its log says more); sslmode=disable avoids TLS where pg_hba.conf allows it".into(),
        };
    }
    if let Some(io) = std::error::Error::source(e).and_then(|s| s.downcast_ref::<std::io::Error>())
    {
        use std::io::ErrorKind as K;
        let sock = t.socket();
        return match (io.kind(), &sock) {
            (K::NotFound, Some(s)) => no_socket(s),
            (K::ConnectionRefused, Some(s)) => Failure {
                what: format!("connection refused on socket {} (a stale socket of a stopped server?)", s.display()),
                fix: "start the server, or pass host= and port= of the running one".into(),
            },
            (K::ConnectionRefused, None) => Failure {
                what: format!("connection refused at {at} (is the server running on that host and accepting TCP/IP connections on that port?)"),
                fix: "check host= and port= (SHOW port), and that listen_addresses includes this address".into(),
            },
            (K::PermissionDenied, _) => Failure {
                what: format!("permission denied connecting to {at}"),
                fix: "run pgbelow as root, or as a user allowed to use that socket".into(),
            },
            (K::TimedOut, _) => Failure {
                what: format!(
                    "timeout: {at} did not answer within {} s",
                    spec.connect_timeout.map_or(0, |d| d.as_secs())
                ),
                fix: "check that the host is reachable and the port open (firewall), or raise connect_timeout=".into(),
            },
            _ if io.to_string().contains("lookup address") || io.to_string().contains("resolve") => Failure {
                what: match &t.host {
                    Host::Tcp(h) => format!("could not translate host name \"{h}\" to address: {io}"),
                    Host::Unix(_) => format!("cannot connect to {at}: {io}"),
                },
                fix: "check host= (a name this machine resolves, an address, or a socket directory)".into(),
            },
            // The socket connected, then the exchange broke off.
            _ if e.to_string() == "error communicating with the server" => Failure {
                what: format!("{at} closed the connection during PostgreSQL's startup ({io})"),
                fix: "check that port= is a PostgreSQL server's (SHOW port); if it is, its log says why it closed the connection".into(),
            },
            _ => Failure {
                what: format!("cannot connect to {at}: {io}"),
                fix: "check host= and port= (psql with the same parameters must connect)".into(),
            },
        };
    }
    let detail = if src.is_empty() {
        String::new()
    } else {
        format!(": {src}")
    };
    Failure {
        what: format!("cannot connect to {at}: {e}{detail}"),
        fix: match e.to_string().as_str() {
            "authentication error" => "pgbelow authenticates with trust, peer, password, md5 and scram-sha-256 (not GSSAPI, SSPI or Kerberos): give its user one of those in pg_hba.conf".into(),
            "connection closed" | "error communicating with the server" => "check that a PostgreSQL server listens there (the server's log tells why it closed the connection)".into(),
            _ => "psql with the same parameters must connect; fix what it reports".into(),
        },
    }
}

/// A value as it must appear in a password file line.
fn pgpass_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace(':', "\\:")
}
