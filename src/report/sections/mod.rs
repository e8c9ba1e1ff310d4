//! Report sections: one module per kind of evidence, each reading its own
//! files from a recording (`build`) and rendering itself as text (`render`).

pub mod clock;
pub mod explain;
pub mod lab;
pub mod offcpu;
pub mod pgstat;
pub mod procfs;
pub mod profile;
pub mod queries;
pub mod system;
