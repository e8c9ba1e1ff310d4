//! A firewall rule pgbelow added (syncrep-network-latency's NFQUEUE rule).
use std::process::Command;

/// Remove an iptables rule pgbelow added (nothing to do when it is gone).
pub fn remove_rule(tool: &str, chain: &str, rule: &[String]) -> Result<Vec<String>, String> {
    let run = |op: &str| {
        Command::new(tool)
            .args(["-w", "-t", "filter", op, chain])
            .args(rule)
            .output()
    };
    match run("-C") {
        Ok(o) if !o.status.success() => return Ok(Vec::new()),
        Err(e) => return Err(format!("running {tool} -C {chain}: {e}")),
        Ok(_) => {}
    }
    match run("-D") {
        Ok(o) if o.status.success() => Ok(vec![format!(
            "removed the iptables rule {chain} {}",
            rule.join(" ")
        )]),
        Ok(o) => Err(format!(
            "{tool} -D {chain} {}: {}",
            rule.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("running {tool} -D {chain}: {e}")),
    }
}
