//! The `remora` daemon and its command line.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use remora::config::{Config, DEFAULT_TOML};

/// remora: a Kubernetes CRI v1 runtime beside containerd.
#[derive(Parser)]
#[command(name = "remora", version, about)]
struct Cli {
    /// Config file (TOML). Default: /etc/remora/config.toml if it exists, else built-in defaults.
    #[arg(long, short = 'c', global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Config file helpers.
    Config {
        #[command(subcommand)]
        action: ConfigAction,
    },
    /// AppArmor helpers.
    Apparmor {
        #[command(subcommand)]
        action: AppArmorAction,
    },
    /// Show the image pulls in flight: phase, layers, bytes, rate (from the running remora's
    /// status socket, beside its CRI socket).
    Pulls {
        /// Print remora's JSON answer as it is.
        #[arg(long)]
        json: bool,
        /// Show the table again every SECONDS until interrupted.
        #[arg(long, value_name = "SECONDS")]
        watch: Option<u64>,
        /// The status socket; default: the one beside the config's CRI socket.
        #[arg(long)]
        socket: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum AppArmorAction {
    /// Print remora's default container profile (`remora-default`, for RuntimeDefault), as
    /// the Debian package ships it in /etc/apparmor.d (with the apparmor package's includes).
    Profile,
}

#[derive(Subcommand)]
enum ConfigAction {
    /// Print the full default config, every key documented.
    Default,
    /// Validate the config file and print the effective config as TOML.
    Check,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("remora: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Config {
            action: ConfigAction::Default,
        }) => {
            print!("{DEFAULT_TOML}");
            Ok(())
        }
        Some(Command::Apparmor {
            action: AppArmorAction::Profile,
        }) => {
            use remora::lifecycle::apparmor::{render_profile, Includes, DEFAULT_APPARMOR_PROFILE};
            print!(
                "{}",
                render_profile(DEFAULT_APPARMOR_PROFILE, Includes::ALL)
            );
            Ok(())
        }
        Some(Command::Pulls {
            json,
            watch,
            socket,
        }) => {
            let socket = match socket {
                Some(s) => s,
                None => {
                    remora::status::socket_path(&Config::load(cli.config.as_deref())?.server.socket)
                }
            };
            loop {
                let view = remora::status::fetch_pulls(&socket)?;
                if json {
                    println!(
                        "{}",
                        serde_json::to_string(&view).context("printing the answer")?
                    );
                } else {
                    if watch.is_some() {
                        // Clear the terminal and go home, as watch(1) does.
                        print!("\x1b[2J\x1b[H");
                    }
                    print!("{}", remora::status::render(&view));
                }
                match watch {
                    Some(secs) => std::thread::sleep(std::time::Duration::from_secs(secs.max(1))),
                    None => return Ok(()),
                }
            }
        }
        Some(Command::Config {
            action: ConfigAction::Check,
        }) => {
            let config = Config::load(cli.config.as_deref())?;
            print!(
                "{}",
                toml::to_string(&config).context("printing the config")?
            );
            Ok(())
        }
        None => {
            let config = Config::load(cli.config.as_deref())?;
            let (log, _flush_on_exit) = remora::logging::init(&config.log);
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the tokio runtime")?;
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            runtime.spawn(trim_heap_periodically());
            let result = runtime.block_on(remora::server::run(config, log));
            // Blocking work still running (a DNS lookup of a registry host, say) must not hold
            // up the exit: the server already shut down cleanly.
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
            result?;
            Ok(())
        }
    }
}

/// How often freed heap memory is handed back to the kernel.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// glibc keeps memory freed by a burst of calls (pods started and removed by the hundred) in
/// its arenas, one per thread that allocated, and returns only what lies at the top of the
/// main heap: remora's RSS stayed at its peak after the load. `malloc_trim(0)` releases the
/// free pages of every arena (madvise), a few microseconds when there is nothing to give
/// back. Measured in scripts/bench-memory.sh, against jemalloc and mimalloc too: on a working
/// day's load (900 pods, two 512 MiB pulls) glibc with this trim idled lowest and peaked lowest
/// (docs/benchmarks.md, "Daemon memory").
#[cfg(all(target_os = "linux", target_env = "gnu"))]
async fn trim_heap_periodically() {
    let mut tick = tokio::time::interval(TRIM_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // SAFETY: malloc_trim only walks and madvises glibc's own free lists, under its own
        // locks; it takes no pointer from us.
        let _ = tokio::task::spawn_blocking(|| unsafe { libc::malloc_trim(0) }).await;
    }
}
