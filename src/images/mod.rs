//! Image pulls: the concurrency building blocks that keep many kubelet requests for the same
//! image (or the same layer) down to one registry round trip.
//!
//! [`coalesce`] shares one in-flight unit of work (an image pull, a blob download) among all
//! callers that ask for the same key; [`resolver`] turns references into digests through a
//! bounded, rate-limited, de-duplicating worker pool with a short cache and per-reference
//! backoff.

pub mod coalesce;
pub mod resolver;
