//! What a user meets outside a recording: the command line, completions,
//! the README's commands, doctor, damaged recordings, the exports (pprof,
//! OTLP, Kubernetes manifests), the MCP server, the HTML page in Chromium,
//! and the layering of the source tree.
#[path = "../common/mod.rs"]
mod common;

mod commands;
mod completions;
mod damage;
mod doctor;
mod html_browser;
mod kubernetes;
mod layers;
mod mcp;
mod otlp;
mod pprof;
mod readme;
