//! The on-CPU profile of a recording, per role: samples, the functions that
//! are on the stack most (inclusive), the leaf frames that burn the CPU
//! (self), the top whole stacks, how many frames could not be named, and
//! where the flame graphs are. Reads `profile.json` and `profile.folded`.
use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::Evidence;
use crate::recording::schema::profile::Summary;

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
    text.lines().filter_map(folded_line).collect()
}

/// [`parse_folded`] over a reader, each line buffered up to
/// [`MAX_LINE`](crate::recording::reader::MAX_LINE); lines that are not
/// `stack count` (or longer than that) and read errors are skipped and
/// described in the second value.
pub fn read_folded(input: impl std::io::BufRead) -> (Vec<FoldedStack>, Option<String>) {
    use crate::recording::reader::{each_line, Damage};
    let mut out = Vec::new();
    let mut damage = Damage::default();
    each_line(
        input,
        &mut damage,
        |i, line, damage| match std::str::from_utf8(line).ok().and_then(folded_line) {
            Some(s) => out.push(s),
            None => damage.line(i, "not `role;frame;… count`".into()),
        },
    );
    (out, damage.describe())
}

fn folded_line(l: &str) -> Option<FoldedStack> {
    let (stack, n) = l.trim_end().rsplit_once(' ')?;
    let samples = n.parse().ok()?;
    let mut parts = stack.split(';');
    let role = parts.next()?.to_string();
    Some(FoldedStack {
        role,
        frames: parts.map(str::to_string).collect(),
        samples,
    })
}

/// The section, when the recording has a profile.
pub fn build(rec: &Evidence) -> Option<ProfileSection> {
    let p = rec.profile.as_ref()?;
    Some(from_parts(&p.summary, &p.stacks))
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
    rs: Option<&crate::recording::schema::profile::RoleSummary>,
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
