//! ExecSync: run a command in a running container and return its output and exit code.
//!
//! The process spec is the container's own (user, env, cwd, capabilities) with the command as
//! its args and no terminal, as containerd's CRI does. Output is collected from FIFOs, capped
//! at [`MAX_OUTPUT`] per stream with a marker; on timeout the process is killed and deleted
//! before the error is returned, so nothing keeps running.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use super::backend::ExecStdio;
use super::{ContainerError, Pods};
use crate::io::{FifoSet, FifoSpec};

/// Most bytes kept per stream; more is dropped and marked.
pub const MAX_OUTPUT: usize = 16 * 1024 * 1024;
/// Appended to a stream that exceeded [`MAX_OUTPUT`].
pub const TRUNCATED_MARKER: &str = "\n[remora: output truncated at 16 MiB]\n";

/// ExecSync's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// Standard output.
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: Vec<u8>,
    /// Exit code.
    pub exit_code: i32,
}

async fn read_capped(mut r: tokio::net::unix::pipe::Receiver) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut truncated = false;
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                // Keep draining past the cap, so the process never blocks on a full pipe.
                let room = MAX_OUTPUT.saturating_sub(out.len());
                out.extend_from_slice(&buf[..n.min(room)]);
                truncated |= n > room;
            }
        }
    }
    if truncated {
        out.extend_from_slice(TRUNCATED_MARKER.as_bytes());
    }
    out
}

pub(crate) fn exec_id() -> String {
    let mut b = [0u8; 8];
    if getrandom_fill(&mut b).is_err() {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        return format!("exec-{n:x}");
    }
    format!("exec-{}", hex::encode(b))
}

fn getrandom_fill(b: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(b)
}

impl Pods {
    /// ExecSync. `timeout` zero means none.
    pub async fn exec_sync(
        self: &Arc<Self>,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<ExecOutput, ContainerError> {
        let container = self.running_container(id)?;
        if cmd.is_empty() {
            return Err(ContainerError::EmptyCommand);
        }
        let cid = container.id().to_string();
        let process = self.exec_process(&cid, cmd, None).await?;

        let me = self.clone();
        tokio::spawn(async move { me.exec_inner(&cid, process, timeout).await })
            .await
            .map_err(ContainerError::Aborted)?
    }

    /// The OCI process of an exec in container `cid`: the container's own (user, env, cwd,
    /// capabilities, rlimits...) with `cmd` as its arguments, as containerd's CRI does; as
    /// JSON for `Tasks.Exec`. `terminal`: a TTY, of this size if known.
    pub(crate) async fn exec_process(
        &self,
        cid: &str,
        cmd: Vec<String>,
        terminal: Option<Option<crate::io::TermSize>>,
    ) -> Result<Vec<u8>, ContainerError> {
        let record = self
            .containers
            .get(cid)
            .await?
            .ok_or_else(|| ContainerError::NotRunning(cid.to_string()))?;
        /// The one part of the container's OCI spec an exec needs; the rest is not parsed.
        #[derive(serde::Deserialize)]
        struct SpecProcess {
            process: Option<oci_spec::runtime::Process>,
        }
        let spec: SpecProcess =
            serde_json::from_slice(&record.spec).map_err(ContainerError::Encode)?;
        let mut process = spec.process.unwrap_or_default();
        process.set_args(Some(cmd));
        process.set_terminal(Some(terminal.is_some()));
        let size = terminal.flatten().and_then(|size| {
            oci_spec::runtime::BoxBuilder::default()
                .width(u32::from(size.width))
                .height(u32::from(size.height))
                .build()
                .ok()
        });
        process.set_console_size(size);
        serde_json::to_vec(&process).map_err(ContainerError::Encode)
    }

    async fn exec_inner(
        &self,
        cid: &str,
        process: Vec<u8>,
        timeout: Duration,
    ) -> Result<ExecOutput, ContainerError> {
        let exec = exec_id();
        let dir = self.io_dir(cid).join("exec");
        let host_err = |action: &'static str, source: crate::io::FifoError| ContainerError::Fifo {
            action,
            path: dir.clone(),
            source,
        };
        let fifos = FifoSet::create(
            &dir,
            &exec,
            FifoSpec {
                stdin: false,
                tty: false,
            },
        )
        .map_err(|e| host_err("create exec FIFOs in", e))?;
        let result = async {
            let out = fifos
                .open_stdout()
                .map_err(|e| host_err("open exec FIFO in", e))?;
            let err = fifos
                .open_stderr()
                .map_err(|e| host_err("open exec FIFO in", e))?;
            let out = tokio::spawn(read_capped(out));
            let err = tokio::spawn(read_capped(err));
            let stdio = fifos.task_stdio();
            let tasks = self.tasks.clone();
            tasks
                .exec(
                    cid,
                    &exec,
                    process,
                    ExecStdio {
                        stdin: String::new(),
                        stdout: stdio.stdout,
                        stderr: stdio.stderr,
                        terminal: false,
                    },
                )
                .await?;
            let waited = async {
                tasks.start_exec(cid, &exec).await?;
                tasks.wait_exec(cid, &exec).await
            };
            let exit = if timeout.is_zero() {
                waited.await?
            } else {
                match tokio::time::timeout(timeout, waited).await {
                    Ok(r) => r?,
                    Err(_) => {
                        let _ = tasks.kill_exec(cid, &exec, libc::SIGKILL as u32).await;
                        let _ = tokio::time::timeout(
                            Duration::from_secs(5),
                            tasks.wait_exec(cid, &exec),
                        )
                        .await;
                        let _ = tasks.delete_exec(cid, &exec).await;
                        out.abort();
                        err.abort();
                        return Err(ContainerError::ExecTimeout(timeout));
                    }
                }
            };
            let _ = tasks.delete_exec(cid, &exec).await;
            let stdout = out.await.unwrap_or_default();
            let stderr = err.await.unwrap_or_default();
            Ok(ExecOutput {
                stdout,
                stderr,
                exit_code: exit.status as i32,
            })
        }
        .await;
        let _ = fifos.remove();
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn output_is_capped_with_a_marker_and_drained() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let reader = crate::io::fifo::open_read_end(&path).unwrap();
        let p2 = path.clone();
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().write(true).open(p2).unwrap();
            let chunk = vec![b'x'; 1024 * 1024];
            for _ in 0..17 {
                f.write_all(&chunk).unwrap();
            }
        });
        let out = read_capped(reader).await;
        writer.join().unwrap();
        assert_eq!(out.len(), MAX_OUTPUT + TRUNCATED_MARKER.len());
        assert!(out.ends_with(TRUNCATED_MARKER.as_bytes()));
    }
}
