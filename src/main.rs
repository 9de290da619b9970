//! The `maintd` binary: parse arguments, set up tracing, run the command.

use clap::Parser;
use maintd::cli::{Cli, LogFormat, run};
use tracing_subscriber::EnvFilter;

/// mimalloc rather than glibc's allocator: the poll allocates and frees small buffers for every
/// node on every cycle from several threads, where glibc's arenas spent a fifth of the CPU and
/// let the resident set creep up for a hundred cycles.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour only for a person at a terminal: files, journald and `podman logs` get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Json => fmt.json().init(),
        LogFormat::Text => fmt.init(),
    }
    let code = match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            let code = e.exit_code();
            // Each cause once: several errors already name their source in their own text.
            let err = anyhow::Error::from(e);
            eprintln!("maintd: {}", maintd::http::error_chain(err.as_ref()));
            code
        }
    };
    std::process::exit(code);
}
