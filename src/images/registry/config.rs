//! The registry client's settings: a leaf the client, its transport and the blob stream
//! all read, so none of them needs another for it.

use std::path::PathBuf;
use std::time::Duration;

/// Settings of a `RegistryClient`.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// containerd-style hosts directory (`/etc/containerd/certs.d`); `None`: no mirrors.
    pub config_path: Option<PathBuf>,
    /// Granularity of the stall detector's byte counting.
    pub stall_window: Duration,
    /// Fewer bytes than this within `stall_timeout` is a stall. 0 disables detection.
    pub stall_min_bytes: u64,
    /// The period over which `stall_min_bytes` must arrive.
    pub stall_timeout: Duration,
    /// First retry delay.
    pub retry_min: Duration,
    /// Largest retry delay.
    pub retry_max: Duration,
    /// Attempts per request on the last host, including the first (at least 1).
    pub max_attempts: u32,
    /// Bound on connecting plus waiting for headers, and on reading a manifest.
    pub request_timeout: Duration,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            config_path: None,
            stall_window: Duration::from_secs(5),
            // 64 KiB per minute: slower than that, a layer will not finish in useful time.
            stall_min_bytes: 64 << 10,
            stall_timeout: Duration::from_secs(60),
            retry_min: Duration::from_millis(500),
            retry_max: Duration::from_secs(30),
            max_attempts: 5,
            request_timeout: Duration::from_secs(30),
        }
    }
}
