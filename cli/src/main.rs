//! The `cuslice` command.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cuslice",
    version,
    about = "Share one NVIDIA GPU safely between containers"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a program with libcuslice.so preloaded.
    Run {
        /// Path of libcuslice.so (default: $CUSLICE_LIB, then next to this
        /// executable, then ../lib/cuslice/, then /usr/lib/cuslice/).
        #[arg(long)]
        lib: Option<PathBuf>,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        cmd: Vec<OsString>,
    },
    /// Print the path of the libcuslice.so that `run` would preload.
    Lib,
}

fn candidates() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(p) = std::env::var_os("CUSLICE_LIB") {
        v.push(PathBuf::from(p));
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        v.push(dir.join("libcuslice.so"));
        v.push(dir.join("../lib/cuslice/libcuslice.so"));
    }
    v.push(PathBuf::from("/usr/lib/cuslice/libcuslice.so"));
    v
}

fn find_lib(explicit: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("--lib {}: no such file", p.display()))
        };
    }
    let c = candidates();
    c.iter()
        .find(|p| p.is_file())
        .map(|p| p.canonicalize().unwrap_or_else(|_| p.clone()))
        .ok_or_else(|| {
            let tried: Vec<String> = c.iter().map(|p| p.display().to_string()).collect();
            format!(
                "cannot find libcuslice.so (tried {}); pass --lib or set CUSLICE_LIB",
                tried.join(", ")
            )
        })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Lib => find_lib(None).map(|p| {
            println!("{}", p.display());
        }),
        Cmd::Run { lib, cmd } => find_lib(lib).and_then(|lib| {
            let mut preload = OsString::from(lib.as_os_str());
            if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
                preload.push(":");
                preload.push(old);
            }
            let (prog, args) = cmd.split_first().ok_or("no program given")?;
            // exec: the program replaces us, so its exit status and signals
            // are the caller's to see, unchanged.
            let err = Command::new(prog)
                .args(args)
                .env("LD_PRELOAD", preload)
                .exec();
            Err(format!("cannot run {}: {err}", prog.to_string_lossy()))
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cuslice: {e}");
            ExitCode::from(127)
        }
    }
}
