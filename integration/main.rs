//! Integration tests: the real `remora` binary against a real containerd.
//!
//! Each test runs its own containerd (CRI plugin disabled) in a scratch dir, so tests can stop
//! and restart it in parallel without touching each other or the shared test bed.

mod cri;
mod harness;
mod sweep;
mod testbed;

mod apply;
mod apply_corpus;
mod bad_input;
mod churn;
mod containers;
mod crictl;
mod daemon;
mod faults;
mod hostile_registry;
mod images;
mod metrics;
mod modes;
mod nri;
mod nri_plugin;
mod pods;
mod recovery;
mod resize;
mod runtime_info;
mod stats;
mod streaming;
mod userns;
