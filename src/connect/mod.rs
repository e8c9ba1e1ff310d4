//! Connecting to PostgreSQL the way libpq (and so psql) does: a `--dsn`
//! (`key=value` or `postgresql://` URI) whose keys override the PG*
//! environment variables, which override the defaults; the password from
//! the DSN, `PGPASSWORD` or the password file; TLS per `sslmode`; and a
//! failure told as psql would tell it, on one line with its fix, never with
//! the password.
//!
//! The `postgres` crate reads none of the environment, the password file or
//! most `sslmode`s, so all of that is resolved here into its `Config`.
pub mod conninfo;
pub mod pgpass;
mod tls;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Result;

use crate::error::fixable;
pub use tls::Verify;

/// Where libpq looks when no host is given: Debian's socket directory, then
/// the upstream default.
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(s: &str) -> Option<SslMode> {
        Some(match s {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    /// A unix-socket directory.
    Unix(PathBuf),
    Tcp(String),
}

/// One server to try: libpq tries the hosts of a list in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub host: Host,
    pub hostaddr: Option<IpAddr>,
    pub port: u16,
}

impl Target {
    fn socket(&self) -> Option<PathBuf> {
        match &self.host {
            Host::Unix(dir) => Some(dir.join(format!(".s.PGSQL.{}", self.port))),
            Host::Tcp(_) => None,
        }
    }

    /// `socket /dir/.s.PGSQL.5432` or `host:port` (an IPv6 address in brackets).
    pub fn describe(&self) -> String {
        match (&self.host, self.socket()) {
            (_, Some(s)) => format!("socket {}", s.display()),
            (Host::Tcp(h), None) => {
                let h = match self.hostaddr {
                    Some(a) if a.to_string() != *h => format!("{h} ({a})"),
                    _ => h.clone(),
                };
                if h.contains(':') && !h.contains(' ') {
                    format!("[{h}]:{}", self.port)
                } else {
                    format!("{h}:{}", self.port)
                }
            }
            (Host::Unix(d), None) => d.display().to_string(),
        }
    }
}

/// Where a password came from, for the message when it is refused.
#[derive(Clone, PartialEq, Eq)]
enum PasswordSource {
    Dsn,
    Env,
    File(PathBuf),
}

#[derive(Clone, PartialEq, Eq)]
struct Password {
    value: String,
    source: PasswordSource,
}

// Never print the password itself.
impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Password(***)")
    }
}

/// A connection's parameters after libpq's precedence: `--dsn`, then the
/// environment, then the defaults.
#[derive(Clone, Debug)]
pub struct ConnSpec {
    /// The servers to try, in order.
    pub targets: Vec<Target>,
    /// No host was given: try [`DEFAULT_SOCKET_DIRS`] in order (whichever
    /// has the socket).
    pub default_host: bool,
    pub user: String,
    pub dbname: String,
    password: Option<Password>,
    passfile: PathBuf,
    pub sslmode: SslMode,
    /// "sslmode=… (from PGSSLMODE)": for messages.
    sslmode_origin: String,
    root_cert: Option<tls::RootCert>,
    client_cert: Option<(PathBuf, PathBuf)>,
    connect_timeout: Option<Duration>,
    options: Option<String>,
    channel_binding: postgres::config::ChannelBinding,
}

/// Where a parameter was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    Dsn,
    Env(&'static str),
}

struct Params<'a> {
    dsn: Vec<(String, String)>,
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl Params<'_> {
    /// The value of `key`: the DSN's last, else its environment variable
    /// (empty values count as unset, as they do for most libpq keywords).
    fn get(&self, key: &str) -> Option<(String, Origin)> {
        if let Some((_, v)) = self.dsn.iter().rev().find(|(k, _)| k == key) {
            return (!v.is_empty()).then(|| (v.clone(), Origin::Dsn));
        }
        let var = KEYWORDS.iter().find(|(k, _)| *k == key)?.1;
        (self.env)(var)
            .filter(|v| !v.is_empty())
            .map(|v| (v, Origin::Env(var)))
    }

    fn value(&self, key: &str) -> Option<String> {
        self.get(key).map(|(v, _)| v)
    }
}

fn origin_text(key: &str, value: &str, o: Origin) -> String {
    match o {
        Origin::Dsn => format!("{key}={value} in --dsn"),
        Origin::Env(var) => format!("{key}={value} from {var}"),
    }
}

/// A bad `--dsn` or PG* variable: what, and the fix.
fn bad_param(what: String, o: Option<Origin>) -> anyhow::Error {
    let fix = match o {
        Some(Origin::Env(var)) => format!("correct or unset {var}"),
        _ => "correct --dsn (libpq key=value pairs or a postgresql:// URI, as psql takes)".into(),
    };
    fixable(what, fix)
}

impl ConnSpec {
    /// Resolve `dsn` (absent: the environment and defaults alone) with this
    /// process's environment and account.
    pub fn resolve(dsn: Option<&str>) -> Result<ConnSpec> {
        let account = crate::account::Account::current()?;
        ConnSpec::resolve_with(
            dsn,
            &|k| std::env::var(k).ok(),
            &account.name,
            &account.home,
        )
    }

    /// [`ConnSpec::resolve`] with the environment, OS user and home given.
    pub fn resolve_with(
        dsn: Option<&str>,
        env: &dyn Fn(&str) -> Option<String>,
        os_user: &str,
        home: &Path,
    ) -> Result<ConnSpec> {
        let pairs = conninfo::parse(dsn.unwrap_or("")).map_err(|e| bad_param(e, None))?;
        for (k, v) in &pairs {
            let known = KEYWORDS.iter().any(|(kw, _)| kw == k) || IGNORED.contains(&k.as_str());
            if known {
                continue;
            }
            // Harmless spellings of libpq's defaults.
            if matches!(
                (k.as_str(), v.as_str()),
                ("gssencmode", "disable" | "prefer")
                    | ("sslnegotiation", "postgres")
                    | ("target_session_attrs", "any")
                    | ("load_balance_hosts", "disable")
            ) {
                continue;
            }
            if UNSUPPORTED.contains(&k.as_str()) || k == "gssencmode" {
                return Err(fixable(
                    format!("connection option \"{k}\" is not supported by pgbelow"),
                    format!(
                        "remove {k} from --dsn (pgbelow takes host, hostaddr, port, dbname, user, password, passfile, sslmode, sslrootcert, sslcert, sslkey, connect_timeout, options, channel_binding)"
                    ),
                ));
            }
            return Err(bad_param(
                format!("invalid connection option {}", conninfo::quoted_keyword(k)),
                None,
            ));
        }
        // A service could name another server; with a host given it cannot.
        let names_host = pairs
            .iter()
            .any(|(k, v)| (k == "host" || k == "hostaddr") && !v.is_empty());
        if let Some(s) = env("PGSERVICE").filter(|s| !s.is_empty() && !names_host) {
            return Err(fixable(
                format!("PGSERVICE={s} is set, but pgbelow does not read pg_service.conf"),
                "unset PGSERVICE and give the service's host, port, user and dbname in --dsn or PGHOST/PGPORT/PGUSER/PGDATABASE",
            ));
        }
        let p = Params { dsn: pairs, env };

        // Hosts, their addresses and ports, paired as libpq pairs them.
        let split = |key: &str| -> Vec<String> {
            p.value(key)
                .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
                .unwrap_or_default()
        };
        let hosts = split("host");
        let addrs = split("hostaddr");
        let ports = split("port");
        let mut hostaddrs = Vec::new();
        for a in &addrs {
            let ip = a.parse::<IpAddr>().map_err(|_| {
                bad_param(
                    format!("could not parse network address \"{a}\" (hostaddr is a numeric IP address)"),
                    p.get("hostaddr").map(|x| x.1),
                )
            })?;
            hostaddrs.push(ip);
        }
        if !hosts.is_empty() && !hostaddrs.is_empty() && hosts.len() != hostaddrs.len() {
            return Err(bad_param(
                format!(
                    "{} host names but {} hostaddr values",
                    hosts.len(),
                    hostaddrs.len()
                ),
                p.get("hostaddr").map(|x| x.1),
            ));
        }
        let default_host = hosts.iter().all(|h| h.is_empty()) && hostaddrs.is_empty();
        let n = if default_host {
            DEFAULT_SOCKET_DIRS.len()
        } else {
            hosts.len().max(hostaddrs.len())
        };
        let mut port_nums = Vec::new();
        for s in &ports {
            let port = if s.is_empty() {
                DEFAULT_PORT
            } else {
                s.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                    bad_param(
                        format!("invalid port number: \"{s}\""),
                        p.get("port").map(|x| x.1),
                    )
                })?
            };
            port_nums.push(port);
        }
        if port_nums.len() > 1 && port_nums.len() != n {
            return Err(bad_param(
                format!(
                    "{} port numbers for {} hosts (give one port, or one per host)",
                    port_nums.len(),
                    n
                ),
                p.get("port").map(|x| x.1),
            ));
        }
        let mut targets = Vec::new();
        for i in 0..n {
            let port = port_nums
                .get(i)
                .or(port_nums.first())
                .copied()
                .unwrap_or(DEFAULT_PORT);
            let hostaddr = hostaddrs.get(i).copied();
            let host = if default_host {
                Host::Unix(PathBuf::from(
                    DEFAULT_SOCKET_DIRS
                        .get(i)
                        .unwrap_or(&DEFAULT_SOCKET_DIRS[0]),
                ))
            } else {
                match hosts.get(i).filter(|h| !h.is_empty()) {
                    Some(h) if h.starts_with('/') => Host::Unix(PathBuf::from(h)),
                    Some(h) => Host::Tcp(h.clone()),
                    // Only an address: it is also the name TLS checks.
                    None => match hostaddr {
                        Some(a) => Host::Tcp(a.to_string()),
                        None => Host::Unix(PathBuf::from(DEFAULT_SOCKET_DIRS[0])),
                    },
                }
            };
            targets.push(Target {
                host,
                hostaddr,
                port,
            });
        }

        let user = p.value("user").unwrap_or_else(|| os_user.to_string());
        let dbname = p.value("dbname").unwrap_or_else(|| user.clone());
        let password = p.get("password").map(|(value, o)| Password {
            value,
            source: match o {
                Origin::Dsn => PasswordSource::Dsn,
                Origin::Env(_) => PasswordSource::Env,
            },
        });
        let passfile = p
            .value("passfile")
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join(".pgpass"));

        let (sslmode, sslmode_origin) = match p.get("sslmode") {
            Some((v, o)) => (
                SslMode::parse(&v).ok_or_else(|| {
                    bad_param(
                        format!("invalid sslmode value: \"{v}\" (disable, allow, prefer, require, verify-ca or verify-full)"),
                        Some(o),
                    )
                })?,
                origin_text("sslmode", &v, o),
            ),
            // libpq 16: the system's roots are only worth a host name check.
            None if p.value("sslrootcert").as_deref() == Some("system") => (
                SslMode::VerifyFull,
                "sslmode=verify-full (the default with sslrootcert=system)".into(),
            ),
            None => (SslMode::Prefer, "sslmode=prefer (the default)".into()),
        };
        // Certificates matter only over TCP: libpq never uses TLS on a socket.
        let tls_possible =
            sslmode != SslMode::Disable && targets.iter().any(|t| matches!(t.host, Host::Tcp(_)));
        let root_cert = if tls_possible {
            tls::root_cert(
                p.get("sslrootcert").map(|(v, _)| v),
                home,
                sslmode,
                &sslmode_origin,
            )?
        } else {
            None
        };
        let client_cert = if tls_possible {
            tls::client_cert(p.value("sslcert"), p.value("sslkey"), home)?
        } else {
            None
        };

        let connect_timeout = match p.get("connect_timeout") {
            None => Some(DEFAULT_CONNECT_TIMEOUT),
            Some((v, o)) => {
                let secs = v.trim().parse::<i64>().map_err(|_| {
                    bad_param(
                        format!("invalid integer value \"{v}\" for connection option \"connect_timeout\""),
                        Some(o),
                    )
                })?;
                // libpq: 0 or less waits forever, and at least 2 s (a day at
                // most here, so that deadlines never overflow).
                (secs > 0).then(|| Duration::from_secs(secs.clamp(2, 86_400) as u64))
            }
        };
        let channel_binding = match p.get("channel_binding") {
            None => postgres::config::ChannelBinding::Prefer,
            Some((v, o)) => match v.as_str() {
                "disable" => postgres::config::ChannelBinding::Disable,
                "prefer" => postgres::config::ChannelBinding::Prefer,
                "require" => postgres::config::ChannelBinding::Require,
                _ => {
                    return Err(bad_param(
                        format!(
                            "invalid channel_binding value: \"{v}\" (disable, prefer or require)"
                        ),
                        Some(o),
                    ))
                }
            },
        };
        Ok(ConnSpec {
            targets,
            default_host,
            user,
            dbname,
            password,
            passfile,
            sslmode,
            sslmode_origin,
            root_cert,
            client_cert,
            connect_timeout,
            options: p.value("options"),
            channel_binding,
        })
    }

    /// The password for `t`: given, else from the password file (with
    /// libpq's warning when the file is ignored).
    fn password_for(&self, t: &Target) -> (Option<Password>, Option<String>) {
        if let Some(p) = &self.password {
            return (Some(p.clone()), None);
        }
        let port = t.port.to_string();
        let host = self.pgpass_host(t);
        let key = pgpass::Key {
            host: &host,
            port: &port,
            database: &self.dbname,
            user: &self.user,
        };
        match pgpass::lookup_file(&self.passfile, &key) {
            Ok(found) => (
                found.map(|value| Password {
                    value,
                    source: PasswordSource::File(self.passfile.clone()),
                }),
                None,
            ),
            Err(ignored) => {
                let w = ignored.warning(&self.passfile);
                warn_once(&w);
                (None, Some(w))
            }
        }
    }

    /// The host as libpq matches it in the password file.
    fn pgpass_host(&self, t: &Target) -> String {
        match &t.host {
            Host::Unix(_) if self.default_host => "localhost".into(),
            Host::Unix(d) if d == Path::new(PGPASS_LOCALHOST_DIR) => "localhost".into(),
            Host::Unix(d) => d.display().to_string(),
            Host::Tcp(h) => h.clone(),
        }
    }
}

/// Print a warning once per process (the pgstat collector connects again).
fn warn_once(w: &str) {
    static SEEN: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    if let Ok(mut seen) = SEEN.lock() {
        if seen.insert(w.to_string()) {
            eprintln!("pgbelow: warning: {w}");
        }
    }
}

/// An open session and how it was reached.
pub struct Connected {
    pub client: postgres::Client,
    pub target: Target,
}

/// Why one attempt failed: the cause and its fix, one line each.
#[derive(Debug)]
struct Failure {
    what: String,
    fix: String,
}

/// How one attempt negotiates encryption.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encryption {
    Plain,
    /// TLS if the server offers it (sslmode=prefer).
    Prefer(Verify),
    Require(Verify),
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

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
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

fn no_socket(sock: &Path) -> Failure {
    Failure {
        what: format!(
            "no server socket at {} (is the server running locally and accepting connections on that socket?)",
            sock.display()
        ),
        fix: "pass host= the server's socket directory (SHOW unix_socket_directories) and port= the server's port, or host=localhost for TCP".into(),
    }
}

impl ConnSpec {
    /// Certificate checks for the TLS attempts: none, unless sslmode asks or
    /// a root certificate is there (libpq then checks it for require too).
    fn verify(&self) -> Verify {
        match (self.sslmode, &self.root_cert) {
            (SslMode::VerifyFull, _) => Verify::Full,
            (SslMode::VerifyCa, _) => Verify::Ca,
            (SslMode::Require | SslMode::Prefer, Some(_)) => Verify::Ca,
            _ => Verify::None,
        }
    }
}

enum AttemptError {
    Pg(postgres::Error),
    /// The TLS configuration (a certificate file) could not be loaded.
    Setup(String),
    /// No answer within the connect timeout.
    Deadline(Duration),
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
    cfg.application_name("pgbelow");
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

fn sqlstate(e: &postgres::Error) -> Option<&str> {
    e.code().map(|c| c.code())
}

/// tokio-postgres's kinds are private; its Display names them.
fn is_tls(e: &postgres::Error) -> bool {
    e.to_string() == "error performing TLS handshake"
}

fn source_text(e: &postgres::Error) -> String {
    std::error::Error::source(e)
        .map(|s| s.to_string())
        .unwrap_or_default()
}

/// The cause of a failed attempt in psql's words, and the fix.
fn explain(
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

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
