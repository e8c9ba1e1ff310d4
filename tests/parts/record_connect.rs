//! `pgbelow record` connects and finds its server as a DBA expects: from
//! `--dsn` alone or the PG* environment, with the password from
//! `PGPASSFILE`, over TLS when the server requires it, and with psql's
//! causes on one line when it cannot. Each test starts its own PostgreSQL
//! with the system's initdb/pg_ctl (not pgbelow's lab), as the `postgres`
//! account, and stops it when done (also on failure).
use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use common::userdb::{free_port, without_pg_env, RunOk, UserCluster};
use serde_json::Value;

/// initdb's options here: quick, one encoding and locale everywhere.
const INITDB: [&str; 4] = ["--no-sync", "-E", "UTF8", "--locale=C"];

/// What every server here has: TCP on 127.0.0.1 besides its socket, no fsync.
const TCP: [(&str, &str); 2] = [("listen_addresses", "127.0.0.1"), ("fsync", "off")];

/// A server with [`TCP`] and `settings`, and `hba` as its pg_hba.conf.
fn start(settings: &[(&str, &str)], hba: &str) -> UserCluster {
    let settings = [&TCP[..], settings].concat();
    UserCluster::builder()
        .initdb(&INITDB)
        .settings(&settings)
        .hba(hba)
        .start()
}

/// `pgbelow record ARGS` with a clean PG* environment plus `env`, and HOME
/// set to `home` (so root's own ~/.pgpass or ~/.postgresql cannot interfere).
fn record(args: &[&str], env: &[(&str, &str)], home: &Path) -> Output {
    let mut c = Command::new(assert_cmd::cargo::cargo_bin("pgbelow"));
    without_pg_env(&mut c);
    c.env_remove("PGBELOW_PROGRESS");
    c.env("HOME", home);
    // A ledger of its own: what another test's killed pgbelow left is
    // reclaimed (and said, on stderr) by the next start that shares its
    // ledger, which would be a second line here.
    let ledger = home.join("ledger");
    std::fs::create_dir_all(&ledger).unwrap();
    c.env("PGBELOW_LEDGER_DIR", &ledger);
    c.envs(env.iter().copied());
    c.arg("record").args(args).output().unwrap()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A short recording succeeded, of `pg`'s postmaster, and said where it is
/// (an absolute path, on stderr with --format json). Returns the report.
fn assert_recorded(o: &Output, pg: &UserCluster, out: &Path) -> Value {
    let (stdout, stderr) = text(o);
    assert_eq!(
        o.status.code(),
        Some(0),
        "record failed\nstderr: {stderr}\nstdout: {stdout}\nserver log: {}",
        pg.log()
    );
    let r: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {stdout}\nstderr: {stderr}"));
    assert_eq!(r["recording"]["mode"], "attach", "{stdout}");
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(
        manifest["postgres"]["postmaster_pid"].as_u64(),
        Some(u64::from(pg.postmaster_pid())),
        "recorded the wrong postmaster; stderr: {stderr}"
    );
    assert!(
        stderr.contains(&format!("the postmaster pid {}", pg.postmaster_pid())),
        "stderr does not say which postmaster: {stderr}"
    );
    let abs = std::fs::canonicalize(out).unwrap();
    assert!(abs.is_absolute());
    assert!(
        stderr
            .lines()
            .any(|l| l == format!("pgbelow: recording: {}", abs.display())),
        "stderr does not name the recording {}: {stderr}",
        abs.display()
    );
    // pgstat ran over the connection (it opens its own; "degraded" when
    // the role cannot see other roles' waits).
    let pgstat = collector(&manifest, "pgstat");
    assert!(
        pgstat["status"] == "ok" || pgstat["status"] == "degraded",
        "pgstat: {pgstat:#}"
    );
    r
}

/// The manifest's entry for collector `name` (null when absent).
fn collector(manifest: &Value, name: &str) -> Value {
    manifest["collectors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .cloned()
        .unwrap_or_default()
}

/// A failure: exit 2 and exactly one line on stderr, which is returned.
fn assert_one_line_failure(o: &Output) -> String {
    let (stdout, stderr) = text(o);
    assert_eq!(
        o.status.code(),
        Some(2),
        "expected exit 2\nstderr: {stderr}\nstdout: {stdout}"
    );
    assert_eq!(stderr.lines().count(), 1, "not one line: {stderr}");
    assert!(stderr.contains("(fix: "), "no fix: {stderr}");
    assert!(stdout.is_empty(), "stdout: {stdout}");
    // Shown with --nocapture, to read the messages.
    eprint!("{stderr}");
    stderr
}

const SHORT: [&str; 6] = [
    "--duration",
    "3",
    "--collectors",
    "procfs,pgstat",
    "--format",
    "json",
];

fn out_args(out: &Path) -> [&str; 2] {
    ["--out", out.to_str().unwrap()]
}

#[test]
fn dsn_alone_finds_the_postmaster_and_records() {
    let pg = start(&[], "local all all trust\n");
    let home = tempfile::tempdir().unwrap();
    let out = home.path().join("rec");
    let dsn = format!(
        "host={} port={} user=postgres dbname=postgres",
        pg.sock().display(),
        pg.port
    );
    let o = record(
        &[&["--dsn", &dsn][..], &SHORT, &out_args(&out)].concat(),
        &[],
        home.path(),
    );
    assert_recorded(&o, &pg, &out);

    // --pid and --dsn naming the same server (checked against each other).
    let pm = pg.postmaster_pid().to_string();
    let out_pid = home.path().join("rec-pid");
    let o = record(
        &[
            &["--dsn", &dsn, "--pid", &pm][..],
            &["--duration", "1", "--collectors", "procfs"],
            &out_args(&out_pid),
        ]
        .concat(),
        &[],
        home.path(),
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);

    // psql's flags instead of a connection string.
    let out_flags = home.path().join("rec-flags");
    let (sock, port) = (pg.sock().display().to_string(), pg.port.to_string());
    let o = record(
        &[
            &["-h", &sock, "-p", &port, "-U", "postgres", "-d", "postgres"][..],
            &["--duration", "1", "--collectors", "procfs"],
            &out_args(&out_flags),
        ]
        .concat(),
        &[],
        home.path(),
    );
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains(&format!("the postmaster pid {}", pg.postmaster_pid())),
        "{err}"
    );

    // The URI form, to a database that does not exist: psql's words.
    let uri = format!(
        "postgresql://postgres@{}:{}/no_such_db",
        pg.sock().display().to_string().replace('/', "%2F"),
        pg.port
    );
    let bad = home.path().join("bad");
    let o = record(
        &[&["--dsn", &uri][..], &SHORT, &out_args(&bad)].concat(),
        &[],
        home.path(),
    );
    let err = assert_one_line_failure(&o);
    assert!(
        err.contains("database \"no_such_db\" does not exist"),
        "{err}"
    );
    assert!(!bad.exists(), "a recording was started: {err}");
}

/// `--pid` alone: postmaster.pid names the port and socket directory, and
/// the server's account names the role, so the server's counters are
/// recorded as with --dsn. Where that cannot log in, the run goes on
/// without them and says how to include them.
#[test]
fn pid_alone_connects_through_postmaster_pid() {
    let pg = start(&[], "local all all trust\n");
    let home = tempfile::tempdir().unwrap();
    let out = home.path().join("rec");
    let pm = pg.postmaster_pid().to_string();
    let o = record(
        &[&["--pid", &pm][..], &SHORT, &out_args(&out)].concat(),
        &[],
        home.path(),
    );
    let (_, stderr) = text(&o);
    assert!(
        stderr.contains(&format!("host={} port={}", pg.sock().display(), pg.port)),
        "{stderr}"
    );
    assert_recorded(&o, &pg, &out);

    let pw = start(&[], "local all all scram-sha-256\n");
    let out = home.path().join("rec-pw");
    let pm = pw.postmaster_pid().to_string();
    let o = record(
        &[&["--pid", &pm][..], &SHORT, &out_args(&out)].concat(),
        &[],
        home.path(),
    );
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{stderr}\n{stdout}");
    assert!(
        stderr.contains("note: no connection") && stderr.contains("pass --dsn"),
        "{stderr}"
    );
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    let pgstat = collector(&m, "pgstat");
    assert_eq!(pgstat["status"], "failed", "{pgstat:#}");
}

#[test]
fn the_pg_environment_alone_is_enough() {
    let pg = start(&[], "local all all trust\n");
    let home = tempfile::tempdir().unwrap();
    let out = home.path().join("rec");
    let sock = pg.sock().display().to_string();
    let port = pg.port.to_string();
    let env = [
        ("PGHOST", sock.as_str()),
        ("PGPORT", port.as_str()),
        ("PGUSER", "postgres"),
        ("PGDATABASE", "postgres"),
    ];
    let o = record(&[&SHORT[..], &out_args(&out)].concat(), &env, home.path());
    assert_recorded(&o, &pg, &out);

    // --dsn keys override the environment: its wrong port loses to --dsn's.
    let out2 = home.path().join("rec2");
    let env = [
        ("PGHOST", sock.as_str()),
        ("PGPORT", "1"),
        ("PGUSER", "postgres"),
    ];
    let dsn = format!("port={port} dbname=postgres");
    let o = record(
        &[&["--dsn", &dsn][..], &SHORT, &out_args(&out2)].concat(),
        &env,
        home.path(),
    );
    assert_recorded(&o, &pg, &out2);
}

#[test]
fn password_from_pgpassfile_and_never_shown() {
    let secret = format!("Pw-{}-xQ7z", std::process::id());
    let pg = start(
        &[("password_encryption", "scram-sha-256")],
        "local all postgres trust\nhost all all 127.0.0.1/32 scram-sha-256\n",
    );
    pg.psql(
        "postgres",
        &format!("CREATE ROLE watcher LOGIN PASSWORD '{secret}'"),
    );
    let home = tempfile::tempdir().unwrap();
    let port = pg.port.to_string();
    let pgpass = home.path().join("pgpass");
    std::fs::write(
        &pgpass,
        format!("# pgbelow test\n127.0.0.1:{port}:postgres:watcher:{secret}\n"),
    )
    .unwrap();
    std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(0o600)).unwrap();
    let env = [
        ("PGHOST", "127.0.0.1"),
        ("PGPORT", port.as_str()),
        ("PGUSER", "watcher"),
        ("PGDATABASE", "postgres"),
        ("PGPASSFILE", pgpass.to_str().unwrap()),
    ];
    let out = home.path().join("rec");
    let o = record(&[&SHORT[..], &out_args(&out)].concat(), &env, home.path());
    assert_recorded(&o, &pg, &out);
    assert_secret_absent(&secret, &[&o], &out);

    // The password in --dsn itself (the riskiest place): never printed or stored.
    let out_dsn = home.path().join("rec-dsn");
    let dsn = format!("host=127.0.0.1 port={port} user=watcher dbname=postgres password={secret}");
    let o = record(
        &[&["--dsn", &dsn][..], &SHORT, &out_args(&out_dsn)].concat(),
        &[],
        home.path(),
    );
    assert_recorded(&o, &pg, &out_dsn);
    assert_secret_absent(&secret, &[&o], &out_dsn);

    // A wrong password: psql's cause, on one line, naming the file.
    let wrong = format!("Wrong-{}-kV3", std::process::id());
    let bad_pgpass = home.path().join("pgpass-wrong");
    std::fs::write(&bad_pgpass, format!("*:*:*:watcher:{wrong}\n")).unwrap();
    std::fs::set_permissions(&bad_pgpass, std::fs::Permissions::from_mode(0o600)).unwrap();
    let env_bad = [
        ("PGHOST", "127.0.0.1"),
        ("PGPORT", port.as_str()),
        ("PGUSER", "watcher"),
        ("PGDATABASE", "postgres"),
        ("PGPASSFILE", bad_pgpass.to_str().unwrap()),
    ];
    let bad = home.path().join("bad");
    let o = record(
        &[&SHORT[..], &out_args(&bad)].concat(),
        &env_bad,
        home.path(),
    );
    let err = assert_one_line_failure(&o);
    assert!(
        err.contains("password authentication failed for user \"watcher\""),
        "{err}"
    );
    assert!(err.contains(bad_pgpass.to_str().unwrap()), "{err}");
    assert!(!bad.exists());
    assert_secret_absent(&wrong, &[&o], home.path());
    // And a wrong password= in --dsn.
    let dsn = format!("host=127.0.0.1 port={port} user=watcher dbname=postgres password={wrong}");
    let o = record(
        &[&["--dsn", &dsn][..], &SHORT, &out_args(&bad)].concat(),
        &[],
        home.path(),
    );
    let err = assert_one_line_failure(&o);
    assert!(err.contains("password authentication failed"), "{err}");
    assert_secret_absent(&wrong, &[&o], home.path());

    // A group-readable password file is ignored with libpq's warning, and
    // the failure names the fix.
    std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = record(&[&SHORT[..], &out_args(&bad)].concat(), &env, home.path());
    let (_, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("has group or world access"), "{stderr}");
    assert!(
        stderr.contains(&format!("chmod 600 {}", pgpass.display())),
        "{stderr}"
    );
}

/// `secret` is in none of the outputs and no file under `dir`.
fn assert_secret_absent(secret: &str, outputs: &[&Output], dir: &Path) {
    for o in outputs {
        let (stdout, stderr) = text(o);
        assert!(!stdout.contains(secret), "password on stdout");
        assert!(!stderr.contains(secret), "password on stderr: {stderr}");
    }
    let mut files = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| {
                // The test's own password files hold it by design.
                !n.to_string_lossy().starts_with("pgpass")
            }) {
                files += 1;
                let bytes = std::fs::read(&p).unwrap();
                assert!(
                    !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                    "password stored in {}",
                    p.display()
                );
            }
        }
    }
    // An empty directory would prove nothing (when one was recorded).
    if dir.join("manifest.json").exists() {
        assert!(files >= 3, "only {files} files under {}", dir.display());
    }
}

#[test]
fn tls_when_the_server_requires_it() {
    let have_openssl = Command::new("openssl").arg("version").output().is_ok();
    assert!(
        have_openssl,
        "the openssl CLI is needed to make the test certificate (apt-get install openssl)"
    );
    let settings = [
        &TCP[..],
        &[
            ("ssl", "on"),
            ("ssl_cert_file", "server.crt"),
            ("ssl_key_file", "server.key"),
        ],
    ]
    .concat();
    let pg = UserCluster::builder()
        .initdb(&INITDB)
        .settings(&settings)
        .hba("local all all trust\nhostssl all all 127.0.0.1/32 trust\n")
        .prepare(|data| {
            Command::new("openssl")
                .args([
                    "req",
                    "-new",
                    "-x509",
                    "-days",
                    "2",
                    "-nodes",
                    "-subj",
                    "/CN=localhost",
                    "-newkey",
                    "rsa:2048",
                    "-out",
                    "server.crt",
                    "-keyout",
                    "server.key",
                ])
                .current_dir(data)
                .run_ok("openssl req");
            // The builder gives them to the server's account afterwards.
            for f in ["server.crt", "server.key"] {
                let p = data.join(f);
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
            }
        })
        .start();
    let home = tempfile::tempdir().unwrap();
    let ca = home.path().join("ca.crt");
    std::fs::copy(pg.data().join("server.crt"), &ca).unwrap();
    let port = pg.port;
    let base = format!("host=127.0.0.1 port={port} user=postgres dbname=postgres");

    let out = home.path().join("rec");
    let dsn = format!("{base} sslmode=require");
    let o = record(
        &[&["--dsn", &dsn][..], &SHORT, &out_args(&out)].concat(),
        &[],
        home.path(),
    );
    assert_recorded(&o, &pg, &out);

    // Without TLS the server's pg_hba.conf has no line: one clear line.
    let bad = home.path().join("bad");
    let dsn = format!("{base} sslmode=disable");
    let o = record(
        &[&["--dsn", &dsn][..], &SHORT, &out_args(&bad)].concat(),
        &[],
        home.path(),
    );
    let err = assert_one_line_failure(&o);
    assert!(err.contains("no encryption"), "{err}");
    assert!(err.contains("sslmode=require"), "{err}");
    assert!(!bad.exists());

    // The default (prefer) takes TLS when offered; PGSSLMODE is read.
    let quick = [
        "--duration",
        "1",
        "--collectors",
        "procfs",
        "--format",
        "json",
    ];
    let out_prefer = home.path().join("rec-prefer");
    let o = record(
        &[&["--dsn", &base][..], &quick, &out_args(&out_prefer)].concat(),
        &[],
        home.path(),
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    // allow: refused without TLS, so libpq's second try with it.
    let out_allow = home.path().join("rec-allow");
    let o = record(
        &[&["--dsn", &base][..], &quick, &out_args(&out_allow)].concat(),
        &[("PGSSLMODE", "allow")],
        home.path(),
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    let o = record(
        &[&["--dsn", &base][..], &quick, &out_args(&bad)].concat(),
        &[("PGSSLMODE", "disable")],
        home.path(),
    );
    let err = assert_one_line_failure(&o);
    assert!(err.contains("sslmode=disable from PGSSLMODE"), "{err}");

    // verify-full: the certificate names localhost, so localhost verifies
    // and 127.0.0.1 does not; verify-ca checks only the signature.
    let out_full = home.path().join("rec-full");
    let ca_s = ca.display().to_string();
    let dsn = format!(
        "host=localhost hostaddr=127.0.0.1 port={port} user=postgres dbname=postgres sslmode=verify-full sslrootcert={ca_s}"
    );
    let o = record(
        &[&["--dsn", &dsn][..], &quick, &out_args(&out_full)].concat(),
        &[],
        home.path(),
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    let dsn = format!("{base} sslmode=verify-full sslrootcert={ca_s}");
    let o = record(
        &[&["--dsn", &dsn][..], &quick, &out_args(&bad)].concat(),
        &[],
        home.path(),
    );
    let err = assert_one_line_failure(&o);
    assert!(
        err.contains("failed verification") && err.contains("IP address mismatch"),
        "{err}"
    );
    let out_ca = home.path().join("rec-ca");
    let dsn = format!("{base} sslmode=verify-ca sslrootcert={ca_s}");
    let o = record(
        &[&["--dsn", &dsn][..], &quick, &out_args(&out_ca)].concat(),
        &[],
        home.path(),
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    // A root certificate that did not sign the server's: refused under require too.
    let other = home.path().join("other.crt");
    Command::new("openssl")
        .args([
            "req",
            "-new",
            "-x509",
            "-days",
            "2",
            "-nodes",
            "-subj",
            "/CN=other",
            "-newkey",
            "rsa:2048",
            "-keyout",
        ])
        .arg(home.path().join("other.key"))
        .arg("-out")
        .arg(&other)
        .run_ok("openssl req (other)");
    let dsn = format!("{base} sslmode=verify-ca sslrootcert={}", other.display());
    let o = record(
        &[&["--dsn", &dsn][..], &quick, &out_args(&bad)].concat(),
        &[],
        home.path(),
    );
    let err = assert_one_line_failure(&o);
    assert!(
        err.contains("failed verification") && err.contains("self-signed certificate"),
        "{err}"
    );
}

#[test]
fn unreachable_servers_are_named_on_one_line() {
    let home = tempfile::tempdir().unwrap();
    let out = home.path().join("rec");
    let dir = format!("/nonexistent-pgbelow-{}", std::process::id());
    let dsn = format!("host={dir} port=5432 user=postgres");
    let o = record(
        &[&["--dsn", &dsn][..], &SHORT, &out_args(&out)].concat(),
        &[],
        home.path(),
    );
    let err = assert_one_line_failure(&o);
    assert!(
        err.contains(&format!("no server socket at {dir}/.s.PGSQL.5432")),
        "{err}"
    );

    let port = free_port();
    let dsn = format!("host=127.0.0.1 port={port} user=postgres");
    let o = record(
        &[&["--dsn", &dsn][..], &SHORT, &out_args(&out)].concat(),
        &[],
        home.path(),
    );
    let err = assert_one_line_failure(&o);
    assert!(
        err.contains(&format!("connection refused at 127.0.0.1:{port}")),
        "{err}"
    );

    // The same through the environment.
    let p = port.to_string();
    let o = record(
        &[&SHORT[..], &out_args(&out)].concat(),
        &[("PGHOST", "127.0.0.1"), ("PGPORT", &p)],
        home.path(),
    );
    let err = assert_one_line_failure(&o);
    assert!(err.contains("connection refused at 127.0.0.1"), "{err}");

    // Neither a connection nor a pid: the fix is named.
    let o = record(&[&SHORT[..], &out_args(&out)].concat(), &[], home.path());
    let err = assert_one_line_failure(&o);
    assert!(err.contains("--dsn") && err.contains("--pid"), "{err}");

    // A malformed string never echoes what may be a password.
    let o = record(
        &[
            &["--dsn", "host=x password=s3cr3t !tail"][..],
            &SHORT,
            &out_args(&out),
        ]
        .concat(),
        &[],
        home.path(),
    );
    let err = assert_one_line_failure(&o);
    assert!(!err.contains("s3cr3t") && !err.contains("tail"), "{err}");
    assert!(!out.exists());
}

#[test]
fn a_server_in_another_pid_namespace_is_refused_unless_pid_is_given() {
    let pg = UserCluster::builder()
        .initdb(&INITDB)
        .settings(&TCP)
        .hba("local all all trust\n")
        .pid_namespace(true)
        .start();
    let home = tempfile::tempdir().unwrap();
    let out = home.path().join("rec");
    let dsn = format!(
        "host={} port={} user=postgres dbname=postgres",
        pg.sock().display(),
        pg.port
    );
    let o = record(
        &[&["--dsn", &dsn][..], &SHORT, &out_args(&out)].concat(),
        &[],
        home.path(),
    );
    let err = assert_one_line_failure(&o);
    assert!(err.contains("must run on the database host"), "{err}");
    assert!(err.contains("--pid"), "{err}");
    assert!(!out.exists());

    // With the postmaster's pid as this host sees it, it records.
    let pm = pg
        .host_postmaster_pid()
        .unwrap_or_else(|| panic!("no host pid for the namespaced postmaster: {}", pg.log()));
    let pm_s = pm.to_string();
    let o = record(
        &[
            &["--dsn", &dsn, "--pid", &pm_s][..],
            &SHORT,
            &out_args(&out),
        ]
        .concat(),
        &[],
        home.path(),
    );
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{stderr}\n{stdout}");
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(
        manifest["postgres"]["postmaster_pid"].as_u64(),
        Some(u64::from(pm))
    );
    // pgbelow's own session is known by this host's pid (NSpid), a child
    // of the postmaster here: not the container's pid, which would make it
    // a user's backend.
    assert_eq!(
        manifest["facts"]["pgstat"]["pid_namespace"], true,
        "{}",
        manifest["facts"]
    );
    let observer = manifest["postgres"]["observer_backend_pid"]
        .as_u64()
        .expect("the observer's backend pid") as u32;
    let procs = std::fs::read_to_string(out.join("processes.jsonl")).unwrap();
    let row: Value = procs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|r| r["pid"] == observer)
        .unwrap_or_else(|| panic!("host pid {observer} not among the processes:\n{procs}"));
    assert_eq!(row["ppid"], pm, "{row}");
    assert_eq!(row["role"], "observer", "{row}");
}

/// Where a password is given, and whether it is the role's.
#[derive(Clone, Copy, Debug)]
enum Source {
    DsnPairs,
    DsnUri,
    Env,
    HomePgpass,
}

/// `record` with the password `pw` given through `src`, to `host`:`port`;
/// its output. The recording goes to `out`, HOME is `home`.
fn record_with(src: Source, pw: &str, host: &str, port: &str, out: &Path, home: &Path) -> Output {
    let _ = std::fs::remove_file(home.join(".pgpass"));
    let mut env: Vec<(&str, &str)> = Vec::new();
    let dsn = match src {
        Source::DsnPairs => {
            format!("host={host} port={port} user=watcher dbname=postgres password='{pw}'")
        }
        Source::DsnUri => format!("postgresql://watcher:{pw}@{host}:{port}/postgres"),
        Source::Env => {
            env.push(("PGPASSWORD", pw));
            format!("host={host} port={port} user=watcher dbname=postgres")
        }
        Source::HomePgpass => {
            let f = home.join(".pgpass");
            std::fs::write(&f, format!("{host}:{port}:postgres:watcher:{pw}\n")).unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
            format!("host={host} port={port} user=watcher dbname=postgres")
        }
    };
    let mut args = vec!["--dsn", dsn.as_str()];
    args.extend(["--duration", "2", "--collectors", "procfs,pgstat"]);
    args.extend(["--format", "text", "--out", out.to_str().unwrap()]);
    record(&args, &env, home)
}

/// `pgbelow report DIR --format F` for every format.
fn reports(dir: &Path) -> Vec<Output> {
    ["text", "json", "html"]
        .iter()
        .map(|f| {
            let o = Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
                .arg("report")
                .arg(dir)
                .args(["--format", f])
                .output()
                .unwrap();
            assert_eq!(o.status.code(), Some(0), "report --format {f}: {o:?}");
            assert!(o.stdout.len() > 200, "report --format {f} is empty");
            o
        })
        .collect()
}

/// A password given in --dsn (key=value or URI), PGPASSWORD or ~/.pgpass —
/// right, wrong, or to a host that is not there — appears in no file of the
/// recording, no report (text, JSON, HTML), no output of `record`, no error
/// and no line of the server's log. A new password per case, so that a
/// leak names its source.
#[test]
fn passwords_never_leak() {
    let pg = start(
        &[
            ("password_encryption", "scram-sha-256"),
            ("log_connections", "on"),
            ("log_disconnections", "on"),
        ],
        "local all postgres trust\nhost all all 127.0.0.1/32 scram-sha-256\n",
    );
    pg.psql("postgres", "CREATE ROLE watcher LOGIN");
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let port = pg.port.to_string();
    let dead_port = free_port().to_string();
    let sources = [
        Source::DsnPairs,
        Source::DsnUri,
        Source::Env,
        Source::HomePgpass,
    ];
    let mut secrets = Vec::new();
    let mut checked = Vec::new();
    for (i, src) in sources.into_iter().enumerate() {
        let unique = |what: &str| format!("{what}{i}-{}-zQ8v", std::process::id());
        // The role's password: records, and every report is clean.
        let right = unique("Right");
        pg.psql(
            "postgres",
            &format!("ALTER ROLE watcher PASSWORD '{right}'"),
        );
        let out = work.path().join(format!("rec-{i}"));
        let o = record_with(src, &right, "127.0.0.1", &port, &out, home.path());
        assert_eq!(o.status.code(), Some(0), "{src:?}: {}", text(&o).1);
        let reps = reports(&out);
        let mut outputs = vec![&o];
        outputs.extend(reps.iter());
        assert_secret_absent(&right, &outputs, &out);
        secrets.push(right);

        // A wrong password: refused on one line that does not show it.
        let wrong = unique("Wrong");
        let bad = work.path().join(format!("bad-{i}"));
        let o = record_with(src, &wrong, "127.0.0.1", &port, &bad, home.path());
        let err = assert_one_line_failure(&o);
        assert!(
            err.contains("password authentication failed"),
            "{src:?}: {err}"
        );
        assert_secret_absent(&wrong, &[&o], work.path());
        secrets.push(wrong);

        // Nobody listening, and a host name that does not resolve.
        for (j, (host, p)) in [
            ("127.0.0.1", dead_port.as_str()),
            ("no-such-host.invalid", port.as_str()),
        ]
        .into_iter()
        .enumerate()
        {
            let pw = unique(&format!("Unreachable{j}-"));
            let o = record_with(src, &pw, host, p, &bad, home.path());
            let err = assert_one_line_failure(&o);
            assert!(err.contains(host), "{src:?}: {err}");
            assert_secret_absent(&pw, &[&o], work.path());
            secrets.push(pw);
        }
        checked.push(format!("{src:?}"));
    }
    // The server saw every attempt; its log holds none of the passwords.
    let log = pg.log();
    assert!(log.contains("connection authorized: user=watcher"), "{log}");
    for s in &secrets {
        assert!(!log.contains(s.as_str()), "password in the server log: {s}");
    }
    eprintln!("{} passwords checked over {checked:?}", secrets.len());
}
