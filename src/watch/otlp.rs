//! `watch --otlp-endpoint`: each window's on-CPU profile pushed to an
//! OpenTelemetry collector over OTLP/HTTP (protobuf), encoded by
//! [`crate::report::otlp`]. Plain HTTP only: the collector runs on the
//! host (or beside it in the pod) and forwards over TLS itself.
use std::time::Duration;

use anyhow::{Context, Result};

use crate::error::fixable;
use crate::evidence::Evidence;
use crate::report::otlp::{export, HTTP_PATH};

/// A push waits this long at most: the window loop must not stall.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The URL profiles are posted to: `HTTP_PATH` added to a bare address
/// (`http://host:4318`), a URL with a path used as given.
pub fn endpoint(url: &str) -> Result<String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        let why = if url.starts_with("https://") {
            "pgbelow pushes plain HTTP to a collector on the host, which forwards over TLS"
        } else {
            "not an http:// URL"
        };
        fixable(
            format!("--otlp-endpoint {url}: {why}"),
            "pass the local collector's OTLP/HTTP address, e.g. --otlp-endpoint http://127.0.0.1:4318",
        )
    })?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    if host.is_empty() {
        return Err(fixable(
            format!("--otlp-endpoint {url}: no host"),
            "pass e.g. --otlp-endpoint http://127.0.0.1:4318",
        ));
    }
    Ok(if path.trim_end_matches('/').is_empty() {
        format!("http://{host}{HTTP_PATH}")
    } else {
        url.to_string()
    })
}

/// POST the window's profile; a window without one (the profile collector
/// failed) sends nothing and says why.
pub fn push(url: &str, ev: &Evidence) -> Result<()> {
    let body = export(&crate::report::view::profile::model(ev)?);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(TIMEOUT))
        .build()
        .into();
    agent
        .post(url)
        .header("Content-Type", "application/x-protobuf")
        .send(&body[..])
        .with_context(|| format!("POST {} bytes", body.len()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            endpoint("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1development/profiles"
        );
        assert_eq!(
            endpoint("http://127.0.0.1:4318/").unwrap(),
            "http://127.0.0.1:4318/v1development/profiles"
        );
        assert_eq!(
            endpoint("http://c:4318/custom/path").unwrap(),
            "http://c:4318/custom/path"
        );
        let e = format!("{:#}", endpoint("https://c:4318").unwrap_err());
        assert!(e.contains("plain HTTP"), "{e}");
        assert!(endpoint("c:4318").is_err());
        assert!(endpoint("http:///x").is_err());
    }
}
