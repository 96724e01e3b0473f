//! Pod sandbox and container lifecycle.

pub mod backend;
