//! What the CLI prints: `out!` and `out_raw!`, which end the command quietly when its reader
//! has gone away.

/// `println!` that ends the process quietly when stdout is a closed pipe (`maintd status |
/// head -1`), where `println!` would panic.
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout().lock(), $($t)*) {
            $crate::cli::out::stdout_failed(e)
        }
    }};
}

/// `print!`, the same way.
macro_rules! out_raw {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = write!(std::io::stdout().lock(), $($t)*) {
            $crate::cli::out::stdout_failed(e)
        }
    }};
}

/// A reader that went away (a closed pipe) ends the command quietly and successfully, as
/// `head` expects; any other failure to write is an error.
pub fn stdout_failed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("maintd: cannot write to stdout: {e}");
    std::process::exit(1);
}
