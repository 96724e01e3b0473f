//! The OCI runtime (runc, crun) as remora runs it itself, beside the shims: its command line
//! for containers whose shim is gone ([`cli`]), and what each handler's runtime can do, asked
//! of it once at start-up ([`features`]).

pub mod cli;
pub mod features;
