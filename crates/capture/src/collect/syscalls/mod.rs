//! Per-process syscall counts, aggregated in the kernel.
//!
//! `counter` owns the mechanisms (eBPF, perf tracepoints); `collector` turns
//! their cumulative counts into per-second deltas in a recording.

pub mod collector;
pub mod counter;
pub mod duty;
pub mod names;

pub use collector::SyscallCollector;
pub use counter::{CountSnapshot, Mechanism, SyscallCounter};
pub use names::{syscall_name, syscall_nr};
