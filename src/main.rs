mod cli;
mod mcp;

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;
use clap::{CommandFactory, Parser};

use cli::{mechanism, Cli, Command, Format, LabCommand, ReportFormat, SeverityArg, SyncArg};
use pgbelow::analyse::Severity;
use pgbelow::evidence::Evidence;
use pgbelow::lab::{LabOptions, PgChoice, Replication};
use pgbelow::provision::SyncMode;
use pgbelow::report::{self, Report};
use pgbelow::scenarios;
use pgbelow::{collect, doctor, error, interrupt, ledger};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    if let Err(e) = interrupt::install() {
        eprintln!("pgbelow: error: cannot install signal handlers: {e}");
        return ExitCode::from(2);
    }
    // What killed pgbelow processes left is undone first (`lab cleanup`
    // does it itself, and says what it did on stdout).
    if !matches!(cli.command, Command::Lab(LabCommand::Cleanup)) {
        let r = ledger::reclaim_dead();
        for l in &r.done {
            eprintln!("pgbelow: cleaned up after a killed pgbelow: {l}");
        }
        for p in &r.problems {
            eprintln!("pgbelow: warning: cleaning up after a killed pgbelow: {p}");
        }
    }
    let code = run(cli);
    // Anything this process still holds (a tracefs mount it made, or what a
    // failed teardown left) is undone on the way out.
    for p in ledger::release_own().problems {
        eprintln!("pgbelow: warning: {p}");
    }
    match code {
        Ok(code) => code,
        Err(e) => {
            eprintln!("pgbelow: error: {}", error::one_line(&e));
            ExitCode::from(2)
        }
    }
}

/// Help and version as clap prints them; a usage error as every other
/// error: one `pgbelow: error:` line with its fix (clap's tip, else where
/// the options are described), exit code 2.
fn usage_error(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
        || (e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand)
    {
        let _ = e.print();
        return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
    }
    eprintln!("{}", usage_line(&e.render().to_string(), &command_path()));
    ExitCode::from(2)
}

/// `pgbelow lab run`: the subcommands named on the command line.
fn command_path() -> String {
    let mut cmd = Cli::command();
    let mut path = vec!["pgbelow".to_string()];
    for a in std::env::args().skip(1) {
        match cmd.find_subcommand(&a) {
            Some(sub) => {
                path.push(sub.get_name().to_string());
                cmd = sub.clone();
            }
            None => break,
        }
    }
    path.join(" ")
}

/// clap's rendered error (`error: …`, tips, `Usage: …`) as one line;
/// `command` is where its options are described.
fn usage_line(rendered: &str, command: &str) -> String {
    let mut what = Vec::new();
    let mut tips = Vec::new();
    for l in rendered.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(m) = l.strip_prefix("error:") {
            what.push(m.trim().to_string());
        } else if let Some(t) = l.strip_prefix("tip:") {
            tips.push(t.trim().to_string());
        } else if l.starts_with("Usage:") {
        } else if !l.starts_with("For more information") && tips.is_empty() {
            what.push(l.to_string());
        }
    }
    let fix = if tips.is_empty() {
        format!("see `{command} --help`")
    } else {
        tips.join("; ")
    };
    format!("pgbelow: error: {} (fix: {fix})", one_line(&what.join(" ")))
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn severity(s: SeverityArg) -> Severity {
    match s {
        SeverityArg::Info => Severity::Info,
        SeverityArg::Warning => Severity::Warning,
        SeverityArg::Critical => Severity::Critical,
    }
}

/// `ev` is what the report was built from (the HTML page draws its series
/// and flame graphs).
fn render(r: &Report, format: Format, ev: &Evidence) -> Result<String> {
    Ok(match format {
        Format::Text => report::text::render(r),
        Format::Json => serde_json::to_string_pretty(r)? + "\n",
        Format::Html => report::html::render(r, &report::view::View::build(r, ev)),
    })
}

/// Exit 1 when `--fail-on` is given and a finding is at least that severe.
/// A recording's saved report.json/report.txt that is damaged or out of
/// date is rewritten from the recording, with a note; never silently kept.
fn refresh_saved(dir: &std::path::Path, rep: &report::Report) {
    let why = match report::saved(dir, rep) {
        report::Saved::Current | report::Saved::Absent => return,
        report::Saved::Damaged(e) => format!("was damaged ({e})"),
        report::Saved::Stale => "was out of date (written by an earlier analysis)".into(),
    };
    let file = dir.join(report::JSON_FILE);
    match report::write_files(dir, rep) {
        Ok(()) => eprintln!(
            "pgbelow: note: {} {why}; rewritten from the recording",
            file.display()
        ),
        Err(e) => eprintln!(
            "pgbelow: note: {} {why} and could not be rewritten ({e:#}); the report below is \
             built from the recording",
            file.display()
        ),
    }
}

fn exit_for(r: &Report, fail_on: Option<SeverityArg>) -> ExitCode {
    match (fail_on, doctor::worst(r)) {
        (Some(min), Some(w)) if w >= severity(min) => ExitCode::from(1),
        _ => ExitCode::SUCCESS,
    }
}

/// `--output FILE` (written whole or not at all, never in colour), else [`print_rendered`].
fn write_or_print(path: Option<&std::path::Path>, body: String, format: Format) -> Result<()> {
    match path {
        Some(path) => write_output(path, body.as_bytes()),
        None => print_rendered(body, format),
    }
}

/// A rendering on stdout: a text with its severities in colour (see [`colour`]).
fn print_rendered(body: String, format: Format) -> Result<()> {
    match format {
        Format::Text => print(&colour(body)),
        _ => print(&body),
    }
}

/// Severities in colour only on a terminal, and never with NO_COLOR set
/// (no-color.org: present and not empty).
fn colour(text: String) -> String {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    if !no_color && std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        report::text::colour_severities(&text)
    } else {
        text
    }
}

fn print(s: &str) -> Result<()> {
    print_bytes(s.as_bytes())
}

fn print_bytes(b: &[u8]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    // A closed pipe (pgbelow … | head) is not an error worth a message.
    match out.write_all(b).and_then(|_| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

/// `--output FILE`, written atomically.
fn write_output(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    pgbelow::recording::writer::write_bytes_atomic(path, bytes).map_err(|e| {
        error::fixable(
            format!("cannot write {}: {e:#}", path.display()),
            "pass --output with a writable path",
        )
    })
}

/// Where the recording is, as an absolute path: after a text report on
/// stdout, else on stderr (stdout holds only the JSON or HTML).
fn say_where(dir: &std::path::Path, format: Format) -> Result<()> {
    let abs = std::fs::canonicalize(dir)
        .or_else(|_| std::path::absolute(dir))
        .unwrap_or_else(|_| dir.to_path_buf());
    if format == Format::Text {
        print(&format!("\nRecording: {}\n", abs.display()))
    } else {
        eprintln!("pgbelow: recording: {}", abs.display());
        Ok(())
    }
}

/// `report --format pprof|otlp`: protobuf, so to a file or a pipe, never
/// a terminal.
fn binary(
    bytes: &[u8],
    format: &str,
    file: &str,
    output: Option<&std::path::Path>,
) -> Result<ExitCode> {
    match output {
        Some(path) => write_output(path, bytes)?,
        None if std::io::IsTerminal::is_terminal(&std::io::stdout()) => {
            return Err(error::fixable(
                format!("--format {format} writes protobuf, not for a terminal"),
                format!("pass --output {file} (or redirect stdout to a file)"),
            ))
        }
        None => print_bytes(bytes)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `pgbelow lab matrix`: the runs, then the table on stdout and
/// `matrix.json` beside the recordings.
fn lab_matrix(a: cli::LabMatrixArgs, show: bool) -> Result<ExitCode> {
    let name = a.scenario.clone();
    let scenario = scenarios::find(&name)
        .ok_or_else(|| anyhow::anyhow!("scenario {name} has no lab workload"))?;
    let spec = scenario.spec();
    let mut base = LabOptions::new(scenario, PgChoice::System);
    base.set = a.set;
    base.duration_s = a.duration;
    base.clients = a.clients.unwrap_or(spec.clients);
    // As `lab run`: the scenario's standbys (syncrep-commit: FIRST 2).
    base.replication.standbys = spec.standbys as usize;
    base.replication.sync = spec.sync;
    base.scale = a.scale;
    if let Some(n) = a.idle_connections {
        base.params.set("idle-connections", n);
    }
    if a.empty_tables {
        base.params.set("empty-tables", true);
    }
    base.collectors = collect::parse_list(a.collectors.as_deref())?;
    base.show_progress = show;
    let out = a.out.unwrap_or_else(|| {
        let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S");
        std::path::PathBuf::from("pgbelow-runs").join(format!("matrix-{name}-{stamp}"))
    });
    let opts = pgbelow::matrix::MatrixOptions {
        base,
        majors: a.pg,
        repeat: a.repeat,
        out: out.clone(),
    };
    let m = pgbelow::matrix::run(&opts, &|s: &str| {
        if show {
            eprintln!("pgbelow: {s}");
        }
    })?;
    let json = serde_json::to_string_pretty(&m)? + "\n";
    std::fs::create_dir_all(&out)?;
    pgbelow::recording::writer::write_text_atomic(&out.join("matrix.json"), &json)?;
    let html = pgbelow::matrix::render_html(&m);
    pgbelow::recording::writer::write_text_atomic(&out.join("matrix.html"), &html)?;
    print(&match a.format {
        cli::MatrixFormat::Text => pgbelow::matrix::render_text(&m),
        cli::MatrixFormat::Json => json,
        cli::MatrixFormat::Html => html,
    })?;
    eprintln!("pgbelow: matrix and recordings in {}", out.display());
    Ok(ExitCode::SUCCESS)
}

/// `lab bench`: each case's runs as `lab run ARGS --out DIR`.
fn lab_bench(a: cli::LabBenchArgs, show: bool) -> Result<ExitCode> {
    let cases = pgbelow::bench::select(a.cases.as_deref()).map_err(anyhow::Error::msg)?;
    if a.list {
        let mut s = String::new();
        for c in &cases {
            let [cause, baseline] = c.runs_on(a.pg);
            let [k1, k2] = c.kinds();
            s += &format!(
                "{}: expects {}\n  {k1}:{}pgbelow lab run {}\n  {k2}:{}pgbelow lab run {}\n",
                c.name,
                if c.healthy() {
                    "nothing".to_string()
                } else {
                    c.expect.join(", ")
                },
                " ".repeat(9 - k1.len()),
                cause.join(" "),
                " ".repeat(9 - k2.len()),
                baseline.join(" ")
            );
        }
        print(&s)?;
        return Ok(ExitCode::SUCCESS);
    }
    let out = a.out.unwrap_or_else(|| {
        let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S");
        std::path::PathBuf::from("pgbelow-runs").join(format!("bench-{stamp}"))
    });
    let lab = |args: &[&str], dir: &std::path::Path| {
        let run =
            cli::LabRunOnly::try_parse_from(std::iter::once("lab-run").chain(args.iter().copied()))
                .map_err(|e| anyhow::anyhow!("a bench case's arguments: {e}"))?;
        let mut opts = lab_options(run.run, show)?;
        opts.out = Some(dir.to_path_buf());
        pgbelow::app::lab(&opts)
    };
    let b = pgbelow::bench::run(&cases, a.repeat, a.pg, &out, &lab, &|s: &str| {
        if show {
            eprintln!("pgbelow: {s}");
        }
    })?;
    let json = serde_json::to_string_pretty(&b)? + "\n";
    std::fs::create_dir_all(&out)?;
    pgbelow::recording::writer::write_text_atomic(&out.join("bench.json"), &json)?;
    let md = pgbelow::bench::render_markdown(&b);
    pgbelow::recording::writer::write_text_atomic(&out.join("bench.md"), &md)?;
    print(&match a.format {
        cli::BenchFormat::Text | cli::BenchFormat::Markdown => md,
        cli::BenchFormat::Json => json,
    })?;
    eprintln!("pgbelow: bench and recordings in {}", out.display());
    Ok(ExitCode::SUCCESS)
}

/// `lab run`'s options: the scenario's defaults (from its spec) where the
/// command line is silent; a flag of another scenario refused.
fn lab_options(a: cli::LabRunArgs, show: bool) -> Result<LabOptions> {
    let scenario = a.composed()?;
    let spec = scenario.spec();
    let duration = a.duration.unwrap_or(spec.duration_s);
    if let Some(at) = a.checkpoint_at.filter(|at| *at >= duration) {
        return Err(pgbelow::error::fixable(
            format!("--checkpoint-at {at} is not inside the {duration} s workload"),
            format!("pass --checkpoint-at below {duration}, or a longer --duration"),
        ));
    }
    if let Some((flag, owners)) = a.misplaced_flag() {
        return Err(pgbelow::error::fixable(
            format!(
                "{flag} does nothing for --scenario {}{}",
                spec.name,
                scenario
                    .also()
                    .iter()
                    .map(|a| format!(" --also {}", a.spec().name))
                    .collect::<String>()
            ),
            format!("drop {flag}, or run it with {owners}"),
        ));
    }
    let standbys = a.standbys.unwrap_or(spec.standbys);
    if standbys == 0 && (a.sync.is_some() || !a.standby_set.is_empty()) {
        return Err(error::fixable(
            "--sync and --standby-set need standbys",
            "add --standbys N (1–8), or drop --sync/--standby-set",
        ));
    }
    Ok(LabOptions {
        scenario,
        pg: match (a.pg, a.pg_bin) {
            (Some(m), _) => PgChoice::Major(m),
            (None, Some(d)) => PgChoice::Dir(d),
            (None, None) => PgChoice::System,
        },
        set: a.set,
        duration_s: duration,
        clients: a.clients.unwrap_or(spec.clients),
        scale: a.scale,
        collectors: collect::parse_list(a.collection.collectors.as_deref())?,
        syscall_mechanism: mechanism(a.collection.syscall_mechanism),
        sampling: a.collection.sampling.sampling(),
        out: a.collection.out,
        show_progress: show,
        replication: Replication {
            standbys: standbys as usize,
            sync: match a.sync {
                Some(SyncArg::Quorum) => SyncMode::Quorum,
                Some(SyncArg::Async) => SyncMode::Async,
                Some(SyncArg::First) => SyncMode::First,
                None => spec.sync,
            },
            standby_set: a.standby_set,
        },
        checkpoint_at: a.checkpoint_at,
        params: a.scenario_flags.0,
    })
}

fn run(cli: Cli) -> Result<ExitCode> {
    let show = std::io::IsTerminal::is_terminal(&std::io::stderr())
        || std::env::var_os("PGBELOW_PROGRESS").is_some();
    match cli.command {
        Command::Lab(LabCommand::List) => {
            let mut s = String::new();
            for sc in scenarios::ALL {
                let spec = sc.spec();
                s += &format!("{:<14} {}\n", spec.name, spec.description);
            }
            print(&s)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Lab(LabCommand::Matrix(a)) => lab_matrix(a, show),
        Command::Lab(LabCommand::Bench(a)) => lab_bench(a, show),
        Command::Lab(LabCommand::Cleanup) => {
            let r = ledger::reclaim_dead();
            let mut s = String::new();
            for l in &r.done {
                s += &format!("{l}\n");
            }
            if r.done.is_empty() && r.problems.is_empty() {
                s += "nothing to clean up\n";
            }
            print(&s)?;
            for p in &r.problems {
                eprintln!("pgbelow: warning: {p}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Lab(LabCommand::Run(a)) => {
            let format = a.output.format;
            let fail_on = a.output.fail_on;
            let opts = lab_options(a, show)?;
            let res = pgbelow::app::lab(&opts)?;
            print_rendered(render(&res.report, format, &res.evidence)?, format)?;
            say_where(&res.dir, format)?;
            Ok(exit_for(&res.report, fail_on))
        }
        Command::Record(a) => {
            let opts = a.options(show)?;
            let res = pgbelow::app::record(&opts)?;
            print_rendered(
                render(&res.report, a.output.format, &res.evidence)?,
                a.output.format,
            )?;
            say_where(&res.dir, a.output.format)?;
            Ok(exit_for(&res.report, a.output.fail_on))
        }
        Command::Report(a) => {
            let loaded = Evidence::load(&a.dir)?;
            let format = match a.format {
                ReportFormat::Text => Format::Text,
                ReportFormat::Json => Format::Json,
                ReportFormat::Html => Format::Html,
                ReportFormat::Pprof => {
                    let bytes = report::pprof::export(&report::view::profile::model(&loaded)?)?;
                    return binary(&bytes, "pprof", "FILE.pb.gz", a.output.as_deref());
                }
                ReportFormat::Otlp => {
                    let bytes = report::otlp::export(&report::view::profile::model(&loaded)?);
                    return binary(&bytes, "otlp", "FILE.otlp.pb", a.output.as_deref());
                }
            };
            let rep = report::build(&loaded);
            refresh_saved(&a.dir, &rep);
            write_or_print(a.output.as_deref(), render(&rep, format, &loaded)?, format)?;
            Ok(exit_for(&rep, a.fail_on))
        }
        Command::Compare(a) => {
            let (ea, eb) = (Evidence::load(&a.dir_a)?, Evidence::load(&a.dir_b)?);
            let (ra, rb) = (report::build(&ea), report::build(&eb));
            let c = pgbelow::compare::compare(
                &a.dir_a.display().to_string(),
                &ra,
                &a.dir_b.display().to_string(),
                &rb,
            );
            let body = match a.format {
                Format::Text => pgbelow::compare::render(&c),
                Format::Json => serde_json::to_string_pretty(&c)? + "\n",
                Format::Html => pgbelow::compare::html::render(
                    &c,
                    (&ra, &report::view::View::build(&ra, &ea)),
                    (&rb, &report::view::View::build(&rb, &eb)),
                ),
            };
            // The warnings go to stderr too: a JSON or HTML on stdout hides them.
            if a.format != Format::Text {
                for w in &c.warnings {
                    eprintln!("pgbelow: warning: {w}: not a like-for-like comparison");
                }
            }
            write_or_print(a.output.as_deref(), body, a.format)?;
            Ok(exit_for(&rb, a.fail_on))
        }
        Command::Watch(a) => {
            let mut collectors = match a.collectors.as_deref() {
                Some(list) => collect::parse_list(Some(list))?,
                None => pgbelow::watch::DEFAULT_COLLECTORS
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
            };
            let otlp_endpoint = match a.otlp_endpoint.as_deref() {
                Some(u) => Some(pgbelow::watch::otlp::endpoint(u)?),
                None => None,
            };
            if otlp_endpoint.is_some() && !collectors.iter().any(|c| c == "profile") {
                eprintln!("pgbelow: watch: --otlp-endpoint: adding the profile collector");
                collectors.push("profile".into());
            }
            pgbelow::watch::run(&pgbelow::watch::WatchOptions {
                all: a.all,
                pid: a.pid,
                dsn: a.conn.conninfo().map_err(|e| {
                    pgbelow::error::fixable(e, "see --help for -h, -p, -U, -d and --dsn")
                })?,
                listen: a.listen,
                window_s: a.window,
                keep: a.keep,
                keep_max_mb: a.keep_max_mb,
                collectors,
                syscall_mechanism: mechanism(a.syscall_mechanism),
                sampling: a.sampling.sampling(),
                otlp_endpoint,
                history_s: a.history,
                history_max_mb: a.history_max_mb,
                escalate_s: a.escalate_for,
                budget_pct: a.budget,
                since_s: a.since,
                triggers: a.triggers.0,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Completions(a) => {
            let mut buf = Vec::new();
            clap_complete::generate(a.shell, &mut Cli::command(), "pgbelow", &mut buf);
            print(&String::from_utf8_lossy(&buf))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Man(a) => {
            match a.output {
                Some(dir) => {
                    let dir_err = |e: &dyn std::fmt::Display| {
                        error::fixable(
                            format!("cannot write man pages into {}: {e}", dir.display()),
                            "pass --output with a writable directory",
                        )
                    };
                    std::fs::create_dir_all(&dir).map_err(|e| dir_err(&e))?;
                    clap_mangen::generate_to(Cli::command(), &dir).map_err(|e| dir_err(&e))?;
                }
                None => {
                    let mut buf = Vec::new();
                    clap_mangen::Man::new(Cli::command()).render(&mut buf)?;
                    print(&String::from_utf8_lossy(&buf))?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Mcp => {
            mcp::serve()?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Doctor(a) => {
            let res = doctor::run(&doctor::DoctorOptions {
                out: a.out,
                pg: a.pg.map_or(PgChoice::System, PgChoice::Major),
                duration_s: a.duration,
                syscall_mechanism: mechanism(a.syscall_mechanism),
                show_progress: show,
            })?;
            print_rendered(res.text, Format::Text)?;
            Ok(match (a.fail_on, doctor::worst_of(&res.findings)) {
                (Some(min), Some(w)) if w >= severity(min) => ExitCode::from(1),
                _ => ExitCode::SUCCESS,
            })
        }
    }
}
