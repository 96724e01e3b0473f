//! An OCI distribution client: which hosts to try ([`hosts`]), how to authenticate
//! ([`auth`]), and the requests with retries and stall detection ([`client`]).

pub mod auth;
pub mod client;
pub mod hosts;

pub use auth::Credentials;
pub use client::{BlobStream, RegistryClient, RegistryConfig, RegistryError, Resolved};

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;
