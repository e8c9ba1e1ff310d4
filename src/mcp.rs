//! `pgbelow mcp`: the Model Context Protocol over stdin/stdout, so that an
//! AI assistant reads what the CLI prints — a recording's checks and
//! findings, one finding with its evidence, the account of the backends'
//! time, a comparison — as the JSON contract's own objects, and records a
//! running server with `record`'s privileges and read-only promise.
//!
//! stdout carries the protocol only: nothing here prints, and `record`'s
//! progress is off. The tools that read a recording never write into it
//! (`report` refreshes a saved report; these do not).
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{schemars, tool, tool_handler, tool_router, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::{json, Value};

use pgbelow::evidence::Evidence;
use pgbelow::{error, interrupt, report};

use crate::cli::{Cli, Command};

/// `record` through this server records at most this long: an assistant
/// waits for the answer (the CLI takes up to a day).
pub const MAX_RECORD_S: u32 = 600;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct RecordingArgs {
    /// A recording directory: made by `pgbelow record`, `pgbelow lab run`,
    /// or kept by `pgbelow watch --keep`.
    pub recording: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct ExplainArgs {
    /// A recording directory.
    pub recording: String,
    /// A check's id as the `findings` tool lists them (the contract's
    /// finding ids), e.g. `checkpoint-writeback-stall`.
    pub id: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct CompareArgs {
    /// The recording before the change (the baseline).
    pub before: String,
    /// The recording after it.
    pub after: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct RecordArgs {
    /// Pid of the postmaster (first line of $PGDATA/postmaster.pid); found
    /// from the connection when absent.
    pub pid: Option<u32>,
    /// libpq connection string for the server's counters (read-only
    /// session); absent: the PG* environment, or the socket the
    /// postmaster.pid names.
    pub dsn: Option<String>,
    /// Seconds to record (1–600; default 30).
    pub duration_s: Option<u32>,
    /// Collectors, comma-separated, or `all` (default: record's).
    pub collectors: Option<String>,
    /// Where to write the recording (default: record's, a new directory
    /// under the current one).
    pub out: Option<String>,
}

/// The server: its tools, routed by name.
#[derive(Debug, Clone)]
pub struct Pgbelow {
    // Read by the code #[tool_handler] generates.
    #[allow(dead_code)]
    tool_router: ToolRouter<Self>,
}

impl Default for Pgbelow {
    fn default() -> Self {
        Pgbelow {
            tool_router: Self::tool_router(),
        }
    }
}

/// A tool's answer: the JSON, or the one-line error the CLI would print
/// (what, why and the fix) as a tool error the assistant reads.
fn answer(r: Result<Value>) -> CallToolResult {
    match r {
        Ok(v) => CallToolResult::structured(v),
        Err(e) => CallToolResult::error(vec![ContentBlock::text(error::one_line(&e))]),
    }
}

/// The report of `dir` as the contract's JSON, built without writing.
fn report_of(dir: &Path) -> Result<Value> {
    let ev = Evidence::load(dir)?;
    Ok(serde_json::to_value(report::build(&ev))?)
}

/// What `findings` answers: the checks as they are, the findings without
/// their evidence (`explain` gives it).
fn findings_of(dir: &Path, rep: &Value) -> Value {
    json!({
        "recording": dir.display().to_string(),
        "postgres": rep["postgres"],
        "workload": rep["workload"],
        "collectors": rep["collectors"],
        "checks": rep["checks"],
        "findings": without_evidence(rep),
    })
}

/// The report's findings without their evidence (`explain` gives it).
fn without_evidence(rep: &Value) -> Vec<Value> {
    rep["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| {
            let mut g = f.clone();
            if let Some(o) = g.as_object_mut() {
                o.remove("evidence");
            }
            g
        })
        .collect()
}

fn explain(dir: &Path, id: &str) -> Result<Value> {
    let rep = report_of(dir)?;
    let checks = rep["checks"].as_array().cloned().unwrap_or_default();
    let Some(check) = checks.iter().find(|c| c["id"] == id) else {
        let ids: Vec<&str> = checks.iter().filter_map(|c| c["id"].as_str()).collect();
        return Err(error::fixable(
            format!("{}: no check named {id:?}", dir.display()),
            format!("pass one of: {}", ids.join(", ")),
        ));
    };
    let finding = rep["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f["id"] == id)
        .cloned();
    Ok(json!({
        "recording": dir.display().to_string(),
        "check": check,
        "finding": finding,
        "postgres": rep["postgres"],
    }))
}

fn account(dir: &Path) -> Result<Value> {
    let rep = report_of(dir)?;
    if rep["account"].is_null() {
        return Err(error::fixable(
            format!(
                "{}: no account of the backends' time: it is built from the procfs collector's samples ({}), which this recording does not have",
                dir.display(),
                pgbelow::recording::schema::procfs::STREAM
            ),
            "record with the procfs collector (one of the defaults; --collectors procfs,…)",
        ));
    }
    Ok(json!({
        "recording": dir.display().to_string(),
        "account": rep["account"],
        "findings": without_evidence(&rep),
    }))
}

fn compare(before: &Path, after: &Path) -> Result<Value> {
    let (ea, eb) = (Evidence::load(before)?, Evidence::load(after)?);
    let (ra, rb) = (report::build(&ea), report::build(&eb));
    let c = pgbelow::compare::compare(
        &before.display().to_string(),
        &ra,
        &after.display().to_string(),
        &rb,
    );
    Ok(serde_json::to_value(c)?)
}

/// `pgbelow record` with these arguments, parsed by the CLI's own parser
/// (its defaults, checks and errors), without progress on stderr.
fn record(a: &RecordArgs) -> Result<Value> {
    let duration = a.duration_s.unwrap_or(30);
    if !(1..=MAX_RECORD_S).contains(&duration) {
        return Err(error::fixable(
            format!("duration_s {duration}: out of range"),
            format!("pass 1 to {MAX_RECORD_S} seconds (longer: run `pgbelow record` itself)"),
        ));
    }
    let mut argv: Vec<String> = vec!["pgbelow".into(), "record".into()];
    let mut flag = |k: &str, v: Option<String>| {
        if let Some(v) = v {
            argv.push(k.into());
            argv.push(v);
        }
    };
    flag("--pid", a.pid.map(|p| p.to_string()));
    flag("--dsn", a.dsn.clone());
    flag("--duration", Some(duration.to_string()));
    flag("--collectors", a.collectors.clone());
    flag("--out", a.out.clone());
    let cli = Cli::try_parse_from(&argv).map_err(|e| {
        let text = e.render().to_string();
        let first = text
            .lines()
            .next()
            .unwrap_or("")
            .trim_start_matches("error: ");
        error::fixable(
            format!("record: {first}"),
            "see the tool's arguments (pid, dsn, duration_s, collectors, out)",
        )
    })?;
    let Command::Record(args) = cli.command else {
        unreachable!("parsed as `pgbelow record`")
    };
    let res = pgbelow::app::record(&args.options(false)?)?;
    let rep = serde_json::to_value(&res.report)?;
    Ok(findings_of(&res.dir, &rep))
}

/// The tools take blocking work (files, a recording of seconds): off the
/// runtime's thread, so that the session answers pings meanwhile.
async fn blocking(f: impl FnOnce() -> Result<Value> + Send + 'static) -> CallToolResult {
    answer(
        tokio::task::spawn_blocking(f)
            .await
            .unwrap_or_else(|e| Err(anyhow::anyhow!("the tool failed: {e}"))),
    )
}

#[tool_router]
impl Pgbelow {
    #[tool(
        description = "A recording's checks (status clear, raised, not_measurable or not_applicable, with the key figure and its bound, or what was missing) and its findings (severity, title, summary, impact: the share of the backends' busy time the finding explains, remedy), as `pgbelow report --format json` gives them, without the findings' evidence (see `explain`)."
    )]
    async fn findings(&self, Parameters(a): Parameters<RecordingArgs>) -> CallToolResult {
        blocking(move || {
            let dir = PathBuf::from(a.recording);
            let rep = report_of(&dir)?;
            Ok(findings_of(&dir, &rep))
        })
        .await
    }

    #[tool(
        description = "One check of a recording with its finding when raised: the measured evidence (figures, the processes, kernel stacks, wait events and statements it comes from), the impact and the remedy, with the server's version and settings; for a check not raised, why (its figure against the bound, what was not measured, or why it does not apply)."
    )]
    async fn explain(&self, Parameters(a): Parameters<ExplainArgs>) -> CallToolResult {
        blocking(move || explain(Path::new(&a.recording), &a.id)).await
    }

    #[tool(
        description = "Where the backends' time went in a recording: per role (backends, walwriter, checkpointer, startup, I/O workers) the recorded wall time split into on CPU, run queue, D by kernel-stack class, S by wait event and idle, each slice with the collector that measured it; and which findings explain which slices."
    )]
    async fn account(&self, Parameters(a): Parameters<RecordingArgs>) -> CallToolResult {
        blocking(move || account(Path::new(&a.recording))).await
    }

    #[tool(
        description = "Compare two recordings (before and after a setting, a patch, a version): each check's figure before and after, findings raised, cleared or changed, throughput and latency, and warnings when the two are not like for like (`pgbelow compare --format json`)."
    )]
    async fn compare(&self, Parameters(a): Parameters<CompareArgs>) -> CallToolResult {
        blocking(move || compare(Path::new(&a.before), Path::new(&a.after))).await
    }

    #[tool(
        description = "Record a running PostgreSQL server for duration_s seconds (at most 600) and diagnose it, as `pgbelow record` does: read-only (no writes, no settings changed), needing root or record's capabilities on the database host. Returns the recording's directory, its checks and its findings; pass the directory to `explain`, `account` or `compare`."
    )]
    async fn record(&self, Parameters(a): Parameters<RecordArgs>) -> CallToolResult {
        blocking(move || record(&a)).await
    }
}

#[tool_handler]
impl ServerHandler for Pgbelow {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("pgbelow", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "pgbelow finds why PostgreSQL is slow when the cause lies below the database \
                 (syscalls, clocks, page cache and writeback, kernel locks, cgroups, devices). \
                 Start with `findings` on a recording directory (or `record` a running server), \
                 then `explain` a raised finding, `account` for where the backends' time went, \
                 and `compare` a recording before and after a change.",
            )
    }
}

/// Serve until the client closes stdin, or a stop signal (Ctrl-C, SIGTERM,
/// SIGHUP) comes; a `record` under way then ends early with a valid
/// recording, as `pgbelow record` does.
pub fn serve() -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let service = Pgbelow::default()
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| anyhow::anyhow!("mcp: the session did not start: {e}"))?;
        let stop = service.cancellation_token();
        tokio::spawn(async move {
            while !interrupt::requested() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            stop.cancel();
        });
        service
            .waiting()
            .await
            .map_err(|e| anyhow::anyhow!("mcp: the session failed: {e}"))?;
        Ok(())
    })
}
