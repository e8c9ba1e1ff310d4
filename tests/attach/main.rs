//! `pgbelow record` attached to clusters started with initdb/pg_ctl, as a
//! user's server is: each case found (and its control silent), queries
//! attributed, the refusals. Set-up runs outside the measuring lock; each
//! recording holds it.
#[path = "../common/mod.rs"]
mod common;

mod cases;
mod cpu;
mod queries;
mod refusals;
