//! Report sections: one module per kind of evidence, each reading its own
//! files from a recording (`build`) and rendering itself as text (`render`).

pub mod account;
pub mod clock;
pub mod explain;
pub mod fsync;
pub mod lab;
pub mod log_history;
pub mod offcpu;
pub mod pgstat;
pub mod procfs;
pub mod profile;
pub mod queries;
pub mod system;

/// A stack (root first) as text, leaf first: `leaf ← caller ← …`, at most
/// `n` frames, `…` when cut.
pub fn leaf_first(frames: &[String], n: usize) -> String {
    let mut shown: Vec<&str> = frames.iter().rev().take(n).map(String::as_str).collect();
    if frames.len() > n {
        shown.push("…");
    }
    shown.join(" ← ")
}
