//! Connecting to PostgreSQL the way libpq (and so psql) does: a `--dsn`
//! (`key=value` or `postgresql://` URI) whose keys override the PG*
//! environment variables, which override the defaults; the password from
//! the DSN, `PGPASSWORD` or the password file; TLS per `sslmode`; and a
//! failure told as psql would tell it, on one line with its fix, never with
//! the password.
//!
//! The `postgres` crate reads none of the environment, the password file or
//! most `sslmode`s, so all of that is resolved here into its `Config`.
//!
//! `spec` resolves the parameters, `attempt` connects to each server in
//! turn, and `explain` tells why an attempt failed.
mod attempt;
pub mod conninfo;
mod explain;
mod failure;
pub mod pgpass;
mod spec;
mod tls;

use std::time::Duration;

pub use attempt::{connect, Connected};
pub use spec::{ConnSpec, Host, SslMode, Target};
pub use tls::Verify;

/// Where libpq looks when no host is given: Debian's socket directory, then
/// the upstream default.
/// The application_name every pgbelow connection sets (also how one
/// pgbelow tells another's session from a user's).
pub const APPLICATION_NAME: &str = "pgbelow";
pub const DEFAULT_SOCKET_DIRS: [&str; 2] = ["/var/run/postgresql", "/tmp"];
/// The socket directory libpq's password file lookup calls `localhost`
/// (libpq compares with its compiled-in default, Debian's).
const PGPASS_LOCALHOST_DIR: &str = "/var/run/postgresql";
const DEFAULT_PORT: u16 = 5432;
/// libpq waits forever by default; an observer should not.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The environment variables that name a server: any of them set counts as
/// "a connection was given" when `--dsn` is absent.
pub const SERVER_ENV: [&str; 5] = ["PGHOST", "PGHOSTADDR", "PGPORT", "PGUSER", "PGDATABASE"];

/// Keywords pgbelow uses, with their environment variable (libpq's names).
const KEYWORDS: [(&str, &str); 14] = [
    ("host", "PGHOST"),
    ("hostaddr", "PGHOSTADDR"),
    ("port", "PGPORT"),
    ("dbname", "PGDATABASE"),
    ("user", "PGUSER"),
    ("password", "PGPASSWORD"),
    ("passfile", "PGPASSFILE"),
    ("sslmode", "PGSSLMODE"),
    ("sslrootcert", "PGSSLROOTCERT"),
    ("sslcert", "PGSSLCERT"),
    ("sslkey", "PGSSLKEY"),
    ("connect_timeout", "PGCONNECT_TIMEOUT"),
    ("options", "PGOPTIONS"),
    ("channel_binding", "PGCHANNELBINDING"),
];

/// libpq keywords that change nothing for a read-only observer; accepted
/// and ignored (`application_name` is always "pgbelow").
const IGNORED: [&str; 11] = [
    "application_name",
    "fallback_application_name",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "sslsni",
    "sslcompression",
    "krbsrvname",
    "gsslib",
];

/// libpq keywords pgbelow cannot honour; refused rather than ignored, since
/// ignoring them would connect less safely or elsewhere than asked.
const UNSUPPORTED: [&str; 13] = [
    "service",
    "requirepeer",
    "sslpassword",
    "sslcrl",
    "sslcrldir",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "sslcertmode",
    "sslnegotiation",
    "require_auth",
    "target_session_attrs",
    "load_balance_hosts",
    "replication",
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};

    use anyhow::Result;

    fn spec(dsn: Option<&str>, env: &[(&str, &str)]) -> Result<ConnSpec> {
        let env: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ConnSpec::resolve_with(
            dsn,
            &|k| env.get(k).cloned(),
            "osuser",
            Path::new("/home/osuser"),
        )
    }

    fn err(dsn: Option<&str>, env: &[(&str, &str)]) -> String {
        match spec(dsn, env) {
            Ok(s) => panic!("{dsn:?} resolved: {s:?}"),
            Err(e) => crate::error::find_fixable(&e)
                .map(|f| f.to_string())
                .unwrap_or_else(|| format!("{e:#}")),
        }
    }

    #[test]
    fn defaults_are_libpqs() {
        let s = spec(None, &[]).unwrap();
        assert!(s.default_host);
        assert_eq!(
            s.targets.iter().map(|t| t.host.clone()).collect::<Vec<_>>(),
            vec![
                Host::Unix("/var/run/postgresql".into()),
                Host::Unix("/tmp".into())
            ]
        );
        assert!(s.targets.iter().all(|t| t.port == 5432));
        assert_eq!(s.user, "osuser");
        assert_eq!(s.dbname, "osuser");
        assert_eq!(s.sslmode, SslMode::Prefer);
        assert_eq!(s.passfile, PathBuf::from("/home/osuser/.pgpass"));
        assert_eq!(s.connect_timeout, Some(DEFAULT_CONNECT_TIMEOUT));
        assert_eq!(s.pgpass_host(&s.targets[1]), "localhost");
    }

    #[test]
    fn dsn_keys_override_the_environment() {
        let env = [
            ("PGHOST", "db.example"),
            ("PGPORT", "5999"),
            ("PGUSER", "envuser"),
            ("PGDATABASE", "envdb"),
            ("PGSSLMODE", "require"),
            ("PGPASSFILE", "/etc/pgpass"),
        ];
        let s = spec(Some("host=/run/pg user=dsnuser"), &env).unwrap();
        assert_eq!(s.targets.len(), 1);
        assert_eq!(s.targets[0].host, Host::Unix("/run/pg".into()));
        assert_eq!(s.targets[0].port, 5999);
        assert_eq!(s.user, "dsnuser");
        assert_eq!(s.dbname, "envdb");
        assert_eq!(s.sslmode, SslMode::Require);
        assert_eq!(s.passfile, PathBuf::from("/etc/pgpass"));
        // Environment only.
        let s = spec(None, &env).unwrap();
        assert_eq!(s.targets[0].host, Host::Tcp("db.example".into()));
        assert_eq!(s.user, "envuser");
        // The URI form too; its user is the database's default.
        let s = spec(Some("postgresql://u@h:6000"), &[]).unwrap();
        assert_eq!(s.targets[0].describe(), "h:6000");
        assert_eq!((s.user.as_str(), s.dbname.as_str()), ("u", "u"));
    }

    #[test]
    fn hosts_ports_and_addresses_pair_up() {
        let s = spec(Some("host=a,b,/s port=1,2,3"), &[]).unwrap();
        let d: Vec<String> = s.targets.iter().map(Target::describe).collect();
        assert_eq!(d, vec!["a:1", "b:2", "socket /s/.s.PGSQL.3"]);
        let s = spec(Some("hostaddr=::1 port=7"), &[]).unwrap();
        assert_eq!(s.targets[0].describe(), "[::1]:7");
        let s = spec(Some("host=db hostaddr=10.0.0.1"), &[]).unwrap();
        assert_eq!(s.targets[0].describe(), "db (10.0.0.1):5432");
        assert!(err(Some("host=a,b port=1,2,3"), &[]).contains("3 port numbers for 2 hosts"));
        assert!(err(Some("host=a,b hostaddr=1.2.3.4"), &[]).contains("hostaddr"));
        assert!(err(Some("hostaddr=db.example"), &[]).contains("could not parse network address"));
        assert!(err(Some("port=x"), &[]).contains("invalid port number: \"x\""));
        assert!(err(None, &[("PGPORT", "0")]).contains("unset PGPORT"));
    }

    #[test]
    fn bad_keywords_and_values_are_refused_with_the_fix() {
        assert!(err(Some("hots=x"), &[]).contains("invalid connection option \"hots\""));
        assert!(err(Some("service=x"), &[]).contains("not supported by pgbelow"));
        assert!(err(Some("sslmode=maybe"), &[]).contains("invalid sslmode value: \"maybe\""));
        assert!(err(None, &[("PGSSLMODE", "on")]).contains("unset PGSSLMODE"));
        assert!(err(None, &[("PGSERVICE", "prod")]).contains("pg_service.conf"));
        assert!(err(Some("connect_timeout=soon"), &[]).contains("connect_timeout"));
        // Harmless keywords are accepted.
        spec(
            Some("application_name=x keepalives=1 gssencmode=disable"),
            &[],
        )
        .unwrap();
    }

    #[test]
    fn connect_timeout_as_libpq() {
        let t = |v: &str| {
            spec(Some(&format!("connect_timeout={v}")), &[])
                .unwrap()
                .connect_timeout
        };
        assert_eq!(t("0"), None);
        assert_eq!(t("1"), Some(Duration::from_secs(2)));
        assert_eq!(t("30"), Some(Duration::from_secs(30)));
        assert_eq!(t("99999999999999999"), Some(Duration::from_secs(86_400)));
        assert_eq!(t("-5"), None);
    }

    #[test]
    fn the_password_never_shows_in_debug_or_errors() {
        let s = spec(Some("password=hunter2 host=h"), &[]).unwrap();
        assert!(!format!("{s:?}").contains("hunter2"));
        let e = err(Some("password=hun ter2 host=h"), &[]);
        assert!(!e.contains("hun"), "{e}");
        let e = err(Some("postgresql://u:hunter2@h/db?bogus=1"), &[]);
        assert!(!e.contains("hunter2"), "{e}");
    }

    #[test]
    fn pgpass_host_is_localhost_for_the_default_socket_directory_only() {
        let s = spec(Some("host=/var/run/postgresql"), &[]).unwrap();
        assert_eq!(s.pgpass_host(&s.targets[0]), "localhost");
        let s = spec(Some("host=/tmp/pg"), &[]).unwrap();
        assert_eq!(s.pgpass_host(&s.targets[0]), "/tmp/pg");
        let s = spec(Some("host=127.0.0.1"), &[]).unwrap();
        assert_eq!(s.pgpass_host(&s.targets[0]), "127.0.0.1");
    }

    #[test]
    fn verification_follows_sslmode() {
        let s = spec(Some("host=h sslmode=require"), &[]).unwrap();
        assert_eq!(s.verify(), Verify::None);
        let e = err(
            Some("host=h sslmode=verify-ca sslrootcert=/nonexistent/ca.pem"),
            &[],
        );
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
        assert!(e.contains("does not exist"), "{e}");
        // No root.crt in the (nonexistent) home: verify-full has nothing to check against.
        let e = err(Some("host=h sslmode=verify-full"), &[]);
        assert!(e.contains("/home/osuser/.postgresql/root.crt"), "{e}");
        // Over a unix socket libpq ignores sslmode, so nothing is needed.
        let s = spec(Some("host=/tmp sslmode=verify-full"), &[]).unwrap();
        assert_eq!(s.verify(), Verify::Full);
        assert_eq!(s.root_cert, None);
        let s = spec(Some("host=h sslmode=verify-full sslrootcert=system"), &[]).unwrap();
        assert_eq!(s.verify(), Verify::Full);
        let e = err(Some("host=h sslmode=require sslrootcert=system"), &[]);
        assert!(e.contains("sslrootcert=system"), "{e}");
    }
}
