//! The `maintd` binary: parse arguments, set up tracing, run the command.

use clap::Parser;
use maintd::cli::{Cli, LogFormat, run};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
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
