//! `evb bench`: the benchmark suite (p2p, lat, nxn, build) against references measured in
//! the same run.

use clap::Args;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Which benchmark: p2p, lat, nxn, build, or all.
    #[arg(default_value = "all")]
    pub which: String,
    /// A short smoke run.
    #[arg(long)]
    pub quick: bool,
}

/// Runs the selected benchmarks.
pub fn run(args: &BenchArgs) -> Result<(), String> {
    Err(format!("evb bench {}: not implemented yet", args.which))
}
