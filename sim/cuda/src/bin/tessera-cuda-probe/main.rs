//! `tessera-cuda-probe`: reaches `libcuda.so.1` exactly as the CUDA runtime
//! does — `dlopen("libcuda.so.1", RTLD_NOW)`, `dlsym` of
//! `cuGetProcAddress_v2` (or `cuGetProcAddress`), then every other entry
//! point through it — and exercises the parts a GPU-sharing layer cares
//! about: device enumeration, every allocation API, kernel launches, and
//! the per-call cost of the hot paths.
//!
//! Output is `key=value` lines on stdout; exit 0 on success, 1 with one
//! line on stderr on failure, 2 on a usage error. Works against any
//! `libcuda.so.1` on the loader's path, the simulator's or NVIDIA's.

mod commands;
mod cuda;
mod script;
mod stress;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::cuda::Route;

#[derive(Parser)]
#[command(
    name = "tessera-cuda-probe",
    version,
    about = "Exercise libcuda.so.1 the way the CUDA runtime reaches it"
)]
struct Cli {
    /// How entry points are found: through cuGetProcAddress (as the CUDA
    /// runtime does) or with dlsym on the library handle.
    #[arg(long, value_enum, default_value_t = RouteArg::Proc, global = true)]
    route: RouteArg,
    /// CUDA version asked of cuGetProcAddress (default: the driver's own,
    /// from cuDriverGetVersion, as a runtime of that version would ask).
    #[arg(long, global = true)]
    cuda_version: Option<i32>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum RouteArg {
    Proc,
    Dlsym,
}

#[derive(Subcommand)]
enum Command {
    /// Devices: count, name, UUID, total memory, and cuMemGetInfo.
    Info,
    /// Allocate COUNT blocks of MIB MiB through one API, optionally hold them, free them.
    Alloc(commands::AllocArgs),
    /// Launch kernels in a loop and report launches/s and the device's busy fraction.
    Launch(commands::LaunchArgs),
    /// Nanoseconds per call of the hot entry points (min over rounds).
    Bench(commands::BenchArgs),
    /// Run a sequence of driver calls, printing each one's result (see script.rs).
    Script {
        /// The steps, one per argument (`alloc a 256`, `free a`, …).
        steps: Vec<String>,
    },
    /// Threads making random allocations and frees over every API.
    Stress(stress::StressArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let line = tessera_sim::report::usage_error_line("tessera-cuda-probe", &e.to_string());
            eprintln!("{line}");
            return ExitCode::from(2);
        }
    };
    let route = match cli.route {
        RouteArg::Proc => Route::ProcAddress(cli.cuda_version),
        RouteArg::Dlsym => Route::Dlsym,
    };
    let result = match cli.command {
        Command::Info => commands::info(route),
        Command::Alloc(args) => commands::alloc(route, &args),
        Command::Launch(args) => commands::launch(route, &args),
        Command::Bench(args) => commands::bench(route, &args),
        Command::Script { steps } => script::run(route, &steps),
        Command::Stress(args) => stress::run(route, &args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tessera-cuda-probe: {e}");
            ExitCode::FAILURE
        }
    }
}
