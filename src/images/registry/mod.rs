//! An OCI distribution client: which hosts to try ([`hosts`]), how to authenticate
//! ([`auth`]), the operations ([`client`]), one request across mirrors with retries
//! (`transport`), the verifying, stall-detecting blob body ([`blob_stream`]) and the error
//! every message of which names the reference and host ([`error`]).

pub mod auth;
pub mod blob_stream;
pub mod client;
pub mod error;
pub mod hosts;
mod transport;

pub use auth::Credentials;
pub use blob_stream::BlobStream;
pub use client::{RegistryClient, RegistryConfig, Resolved};
pub use error::RegistryError;

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;
