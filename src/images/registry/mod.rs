//! An OCI distribution client: which hosts to try ([`hosts`]), how to authenticate
//! ([`auth`]), the operations ([`client`]), one request across mirrors with retries
//! (`transport`), the verifying, stall-detecting blob body ([`blob_stream`]) and the error
//! every message of which names the reference and host ([`error`]).
//!
//! Imports run one way: `client` → `transport` → `auth`/`hosts`, each → `error` → `chain`;
//! the settings (`config`) are a leaf all of them read.

pub mod auth;
pub mod blob_stream;
mod chain;
pub mod client;
mod config;
pub mod error;
pub mod hosts;
mod transport;

pub use client::RegistryClient;
pub use config::RegistryConfig;
pub use error::RegistryError;

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;
