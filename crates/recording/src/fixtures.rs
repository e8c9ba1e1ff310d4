//! The recordings under tests/fixtures/recordings (recorded from real
//! runs), for the tests of this crate and of the crates above it (their
//! dev-dependency turns on the `fixtures` feature).
use std::path::{Path, PathBuf};

/// The directory of fixture recording `name`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .join("tests/fixtures/recordings")
        .join(name)
}

/// A copy of fixture `name` under `into` whose manifest says it started at
/// `started_at` (windows of one `watch`, for splicing).
pub fn copy_at(name: &str, into: &Path, started_at: &str) -> PathBuf {
    let d = into.join(name);
    std::fs::create_dir_all(&d).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), d.join(e.file_name())).unwrap();
    }
    let mut m = crate::splice::manifest_of(&d).unwrap();
    m.started_at = started_at.into();
    std::fs::write(
        d.join(crate::files::MANIFEST),
        serde_json::to_vec(&m).unwrap(),
    )
    .unwrap();
    d
}
