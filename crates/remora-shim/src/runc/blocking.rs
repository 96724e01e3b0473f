//! The OCI runtime run to its end without tokio or the reaper, for the shim's one-shot actions
//! (`delete` after a dead shim, `-info`).

use std::ffi::OsString;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use super::RuncError;

/// Runs `binary args…` to its end within `limit`, stdout and stderr captured, for the shim's
/// one-shot actions (`delete` after a dead shim, `-info`): they run no tokio runtime and no
/// reaper, and wait for their own child. The runtime leads a process group of its own; past
/// `limit` the group is SIGKILLed while the runtime is not yet reaped (its pid, the group id,
/// is still its own), then reaped. The pipes are read on threads, so a full pipe cannot stall
/// the runtime; what a leftover descendant keeps open is given up at the deadline.
/// `verb` names the subcommand in errors (`runc delete`).
pub fn run_blocking(
    binary: &Path,
    args: &[OsString],
    verb: &str,
    id: &str,
    limit: Duration,
) -> Result<std::process::Output, RuncError> {
    use std::process::Stdio as S;
    let command = || {
        let name = binary.file_name().unwrap_or(binary.as_os_str());
        format!("{} {verb}", name.to_string_lossy())
    };
    let mut child = super::runtime_command(binary)
        .args(args)
        .stdin(S::null())
        .stdout(S::piped())
        .stderr(S::piped())
        .spawn()
        .map_err(|source| RuncError::Spawn {
            binary: binary.to_owned(),
            source,
        })?;
    let deadline = Instant::now() + limit;
    let (tx, rx) = std::sync::mpsc::channel();
    let readers: [Option<Box<dyn Read + Send>>; 2] = [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    ];
    for (index, reader) in readers.into_iter().enumerate() {
        if let Some(mut reader) = reader {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                // A read error leaves what was read: the exit status tells the outcome.
                let _ = reader.read_to_end(&mut bytes);
                let _ = tx.send((index, bytes));
            });
        }
    }
    drop(tx);
    let pid = child.id();
    let status = loop {
        let polled = child.try_wait().map_err(|source| RuncError::Spawn {
            binary: binary.to_owned(),
            source,
        })?;
        if let Some(status) = polled {
            break status;
        }
        if Instant::now() >= deadline {
            // Not reaped yet (try_wait said so): the group id is still the runtime's.
            if let Ok(pgid) = i32::try_from(pid) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pgid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            // SIGKILLed: the wait ends unless it sits in the kernel.
            let _ = child.wait();
            return Err(RuncError::Timeout {
                command: command(),
                id: id.to_owned(),
                after: limit,
                pid,
            });
        }
        // A one-shot action's child: polling keeps it free of signal handlers and runtimes.
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut streams = [Vec::new(), Vec::new()];
    while let Ok((index, bytes)) =
        rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
    {
        streams[index] = bytes;
    }
    let [stdout, stderr] = streams;
    Ok(std::process::Output {
        status,
        stdout,
        stderr,
    })
}
