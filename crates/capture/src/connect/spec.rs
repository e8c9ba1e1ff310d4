//! A connection's parameters resolved as libpq does: `--dsn`, then PG* variables, then defaults.
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Result;

use super::{conninfo, pgpass, tls};
use super::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_PORT, DEFAULT_SOCKET_DIRS, IGNORED, KEYWORDS,
    PGPASS_LOCALHOST_DIR, UNSUPPORTED,
};
use crate::error::fixable;

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
    pub(super) fn socket(&self) -> Option<PathBuf> {
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
pub(super) enum PasswordSource {
    Dsn,
    Env,
    File(PathBuf),
}

#[derive(Clone, PartialEq, Eq)]
pub(super) struct Password {
    pub(super) value: String,
    pub(super) source: PasswordSource,
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
    pub(super) passfile: PathBuf,
    pub sslmode: SslMode,
    /// "sslmode=… (from PGSSLMODE)": for messages.
    pub(super) sslmode_origin: String,
    pub(super) root_cert: Option<tls::RootCert>,
    pub(super) client_cert: Option<(PathBuf, PathBuf)>,
    pub(super) connect_timeout: Option<Duration>,
    pub(super) options: Option<String>,
    pub(super) channel_binding: postgres::config::ChannelBinding,
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
    pub(super) fn password_for(&self, t: &Target) -> (Option<Password>, Option<String>) {
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
    pub(super) fn pgpass_host(&self, t: &Target) -> String {
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
