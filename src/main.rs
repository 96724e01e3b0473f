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
            let result = runtime.block_on(remora::server::run(config, log));
            // Blocking work still running (a DNS lookup of a registry host, say) must not hold
            // up the exit: the server already shut down cleanly.
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
            result?;
            Ok(())
        }
    }
}
