//! The on-CPU profile of a recording, per role: samples, the functions that
//! are on the stack most (inclusive), the leaf frames that burn the CPU
//! (self), the top whole stacks, how many frames could not be named, and
//! where the flame graphs are. Reads `profile.json` and `profile.folded`.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::collect::profile::{files, Summary};
use crate::recording::Loaded;

/// Rows shown per list.
pub const TOP_N: usize = 10;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProfileSection {
    pub mechanism: String,
    pub hz: u64,
    pub duration_s: f64,
    /// Samples of the cluster's processes.
    pub samples: u64,
    pub lost: u64,
    /// Share of user frames no symbol covered (0..1).
    pub unresolved_share: f64,
    /// Share of samples whose user stack was unwound up to main (0..1).
    pub rooted_share: f64,
    pub kernel_symbols: bool,
    /// Paths relative to the recording.
    pub folded: String,
    pub flamegraph: Option<String>,
    /// One line per problem, with its fix.
    pub notes: Vec<String>,
    /// Most samples first.
    pub roles: Vec<RoleProfile>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoleProfile {
    pub role: String,
    pub pids: usize,
    pub samples: u64,
    /// Of all the cluster's samples.
    pub share: f64,
    pub unresolved_share: f64,
    pub flamegraph: Option<String>,
    /// The outermost frames that nearly every sample shares (e.g. `_start`
    /// … `PostgresMain`), root first; left out of `top_functions`.
    pub common_root: Vec<String>,
    /// Share of the role's samples under the whole common root.
    pub common_root_share: f64,
    /// Functions by samples with the function anywhere on the stack.
    pub top_functions: Vec<FrameRow>,
    /// Leaf frames by samples (where the CPU was).
    pub top_leaves: Vec<FrameRow>,
    /// Whole stacks by samples.
    pub top_stacks: Vec<StackRow>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FrameRow {
    /// Kernel frames end in `_[k]`; unresolved ones read `[file+0xoffset]`.
    pub name: String,
    pub samples: u64,
    /// Of the role's samples.
    pub share: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StackRow {
    pub samples: u64,
    pub share: f64,
    /// Root first (user frames, then kernel frames).
    pub frames: Vec<String>,
}

/// One line of `profile.folded`: role, frames root first, samples.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoldedStack {
    pub role: String,
    pub frames: Vec<String>,
    pub samples: u64,
}

/// Parse folded stacks (`role;frame;…;frame count`); malformed lines are skipped.
pub fn parse_folded(text: &str) -> Vec<FoldedStack> {
    text.lines()
        .filter_map(|l| {
            let (stack, n) = l.trim_end().rsplit_once(' ')?;
            let samples = n.parse().ok()?;
            let mut parts = stack.split(';');
            let role = parts.next()?.to_string();
            Some(FoldedStack {
                role,
                frames: parts.map(str::to_string).collect(),
                samples,
            })
        })
        .collect()
}

/// The section, when the recording has a profile.
pub fn build(rec: &Loaded) -> Option<ProfileSection> {
    let summary: Summary =
        serde_json::from_str(&std::fs::read_to_string(rec.dir.join(files::SUMMARY)).ok()?).ok()?;
    let folded = std::fs::read_to_string(rec.dir.join(&summary.folded)).unwrap_or_default();
    Some(from_parts(&summary, &parse_folded(&folded)))
}

/// The section from a summary and its folded stacks.
pub fn from_parts(summary: &Summary, stacks: &[FoldedStack]) -> ProfileSection {
    let mut by_role: BTreeMap<&str, Vec<&FoldedStack>> = BTreeMap::new();
    for s in stacks {
        by_role.entry(&s.role).or_default().push(s);
    }
    let total: u64 = stacks.iter().map(|s| s.samples).sum();
    let mut roles: Vec<RoleProfile> = by_role
        .into_iter()
        .map(|(role, stacks)| {
            let rs = summary.roles.iter().find(|r| r.role == role);
            role_profile(role, &stacks, total, rs)
        })
        .collect();
    roles.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.role.cmp(&b.role)));
    ProfileSection {
        mechanism: summary.mechanism.clone(),
        hz: summary.hz,
        duration_s: summary.duration_s,
        samples: summary.samples,
        lost: summary.lost,
        unresolved_share: summary.unresolved_share,
        rooted_share: summary.rooted_share,
        kernel_symbols: summary.kernel_symbols,
        folded: summary.folded.clone(),
        flamegraph: summary.flamegraph.clone(),
        notes: summary.notes.clone(),
        roles,
    }
}

fn share(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        (a as f64 / b as f64 * 1000.0).round() / 1000.0
    }
}

fn top(counts: HashMap<&str, u64>, of: u64) -> Vec<FrameRow> {
    let mut v: Vec<(&str, u64)> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    v.into_iter()
        .take(TOP_N)
        .map(|(name, samples)| FrameRow {
            name: name.to_string(),
            samples,
            share: share(samples, of),
        })
        .collect()
}

fn role_profile(
    role: &str,
    stacks: &[&FoldedStack],
    total: u64,
    rs: Option<&crate::collect::profile::RoleSummary>,
) -> RoleProfile {
    let samples: u64 = stacks.iter().map(|s| s.samples).sum();
    let (root, under_root) = common_root(stacks, samples);
    let mut inclusive: HashMap<&str, u64> = HashMap::new();
    let mut leaves: HashMap<&str, u64> = HashMap::new();
    for s in stacks {
        let mut seen = HashSet::new();
        for f in &s.frames {
            if seen.insert(f.as_str()) && !root.contains(f) {
                *inclusive.entry(f).or_default() += s.samples;
            }
        }
        if let Some(leaf) = s.frames.last() {
            *leaves.entry(leaf).or_default() += s.samples;
        }
    }
    let mut whole: Vec<&&FoldedStack> = stacks.iter().collect();
    whole.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.frames.cmp(&b.frames)));
    RoleProfile {
        role: role.to_string(),
        pids: rs.map_or(0, |r| r.pids),
        samples,
        share: share(samples, total),
        unresolved_share: rs.map_or(0.0, |r| share(r.unresolved_user_frames, r.user_frames)),
        flamegraph: rs.and_then(|r| r.flamegraph.clone()),
        common_root_share: share(under_root, samples),
        common_root: root,
        top_functions: top(inclusive, samples),
        top_leaves: top(leaves, samples),
        top_stacks: whole
            .into_iter()
            .take(TOP_N)
            .map(|s| StackRow {
                samples: s.samples,
                share: share(s.samples, samples),
                frames: s.frames.clone(),
            })
            .collect(),
    }
}

/// A frame is part of the common root when at least this share of samples has it there.
const COMMON_ROOT_SHARE: f64 = 0.9;

/// The longest root-first prefix that at least [`COMMON_ROOT_SHARE`] of the
/// samples share, and the share that has all of it.
fn common_root(stacks: &[&FoldedStack], samples: u64) -> (Vec<String>, u64) {
    let mut prefix: Vec<String> = Vec::new();
    let mut under = samples;
    loop {
        let d = prefix.len();
        let mut next: HashMap<&str, u64> = HashMap::new();
        for s in stacks {
            // Only stacks that go deeper than the prefix: a leaf is not a root.
            if s.frames.len() > d + 1 && s.frames[..d] == prefix[..] {
                *next.entry(&s.frames[d]).or_default() += s.samples;
            }
        }
        let Some((f, n)) = next
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(a.0)))
        else {
            break;
        };
        if (n as f64) < samples as f64 * COMMON_ROOT_SHARE {
            break;
        }
        prefix.push(f.to_string());
        under = n;
    }
    (prefix, under)
}

/// Frames shown of a stack in the text report, leaf first.
const STACK_FRAMES_SHOWN: usize = 8;

/// The text rendering.
pub fn render(s: &ProfileSection, out: &mut String) {
    let _ = writeln!(
        out,
        "On-CPU profile: {} samples of the cluster's processes in {:.1} s at {} Hz, {} lost; {:.0}% of user frames unresolved, {:.0}% of stacks unwound to main",
        s.samples,
        s.duration_s,
        s.hz,
        s.lost,
        s.unresolved_share * 100.0,
        s.rooted_share * 100.0
    );
    let _ = writeln!(out, "  how: {}", s.mechanism);
    if let Some(f) = &s.flamegraph {
        let _ = writeln!(out, "  flame graph: {f}  (folded stacks: {})", s.folded);
    }
    for n in &s.notes {
        let _ = writeln!(out, "  ! {n}");
    }
    for r in &s.roles {
        let _ = writeln!(
            out,
            "\n  {}: {} samples ({:.0}%), {} process{}, {:.0}% of user frames unresolved{}",
            r.role,
            r.samples,
            r.share * 100.0,
            r.pids,
            if r.pids == 1 { "" } else { "es" },
            r.unresolved_share * 100.0,
            r.flamegraph
                .as_ref()
                .map_or(String::new(), |f| format!("; flame graph {f}"))
        );
        let rows = |title: &str, rows: &[FrameRow], out: &mut String| {
            let _ = writeln!(out, "    {title}");
            for row in rows {
                let _ = writeln!(
                    out,
                    "      {:>5.1}%  {:>7}  {}",
                    row.share * 100.0,
                    row.samples,
                    row.name
                );
            }
        };
        if !r.common_root.is_empty() {
            let _ = writeln!(
                out,
                "    common root ({:.0}% of samples): {}",
                r.common_root_share * 100.0,
                r.common_root.join(" → ")
            );
        }
        rows(
            "on the stack (inclusive, below the common root):",
            &r.top_functions,
            out,
        );
        rows("on the CPU (leaf frames):", &r.top_leaves, out);
        let _ = writeln!(out, "    top stacks (leaf ← callers):");
        for st in &r.top_stacks {
            let mut shown: Vec<&str> = st
                .frames
                .iter()
                .rev()
                .take(STACK_FRAMES_SHOWN)
                .map(String::as_str)
                .collect();
            if st.frames.len() > STACK_FRAMES_SHOWN {
                shown.push("…");
            }
            let _ = writeln!(
                out,
                "      {:>5.1}%  {:>7}  {}",
                st.share * 100.0,
                st.samples,
                shown.join(" ← ")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::profile::RoleSummary;

    const FOLDED: &str = "\
backend;main;PostmasterMain;PostgresMain;exec_bind_message;hash_search 3
backend;main;PostmasterMain;PostgresMain;exec_execute_message;ExecScan 5
backend;main;PostmasterMain;PostgresMain;__libc_recv;entry_SYSCALL_64_[k];tcp_recvmsg_[k] 2
walwriter;main;WalWriterMain;[postgres+0x1a2b] 1
bad line
";

    #[test]
    fn folded_parses_and_ranks() {
        let stacks = parse_folded(FOLDED);
        assert_eq!(stacks.len(), 4);
        let summary = Summary {
            samples: 11,
            hz: 99,
            folded: "profile.folded".into(),
            roles: vec![RoleSummary {
                role: "backend".into(),
                pids: 1,
                samples: 10,
                user_frames: 45,
                unresolved_user_frames: 0,
                flamegraph: Some("flamegraph-backend.svg".into()),
            }],
            ..Default::default()
        };
        let s = from_parts(&summary, &stacks);
        assert_eq!(s.roles[0].role, "backend");
        assert_eq!(s.roles[0].samples, 10);
        assert_eq!(
            s.roles[0].common_root,
            vec!["main", "PostmasterMain", "PostgresMain"]
        );
        assert_eq!(s.roles[0].common_root_share, 1.0);
        // Ties rank by name.
        let top: Vec<(&str, f64)> = s.roles[0]
            .top_functions
            .iter()
            .map(|r| (r.name.as_str(), r.share))
            .collect();
        assert_eq!(top[..2], [("ExecScan", 0.5), ("exec_execute_message", 0.5)]);
        assert_eq!(s.roles[0].top_leaves[0].name, "ExecScan");
        assert_eq!(s.roles[0].top_stacks[0].samples, 5);
        assert_eq!(s.roles[1].role, "walwriter");
        let mut text = String::new();
        render(&s, &mut text);
        assert!(
            text.contains("ExecScan ← exec_execute_message ← PostgresMain"),
            "{text}"
        );
        assert!(
            text.contains("flame graph flamegraph-backend.svg"),
            "{text}"
        );
        assert!(
            text.contains("common root (100% of samples): main → PostmasterMain → PostgresMain"),
            "{text}"
        );
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<ProfileSection>(&json).unwrap(), s);
    }
}
