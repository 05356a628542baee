//! `evb sim`: the switch simulator's sweep over N, as a table, JSON and an SVG plot.

use std::path::PathBuf;

use clap::Args;
use evb_sim::{hol_limit, simulate, Outcome, Policy, TABLE_VII};

#[derive(Args)]
pub struct SimArgs {
    /// Switch sizes N (N RUs × N BUs), comma-separated.
    #[arg(long, default_value = "1,2,4,8,16,32,64,128,256,512")]
    n: String,
    /// Slots simulated per point (default: about 2·10⁷ cell decisions per point, at least 2000 slots).
    #[arg(long)]
    slots: Option<u64>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where the plot goes.
    #[arg(long, default_value = "target/sim/efficiency.svg")]
    svg: PathBuf,
    /// Also write every point as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn run(a: &SimArgs) -> Result<(), String> {
    let sizes: Vec<usize> =
        a.n.split(',')
            .map(|s| {
                s.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=4096).contains(n))
                    .ok_or_else(|| format!("--n: {s:?} is not a size from 1 to 4096"))
            })
            .collect::<Result<_, _>>()?;
    let t0 = std::time::Instant::now();
    let mut points: Vec<Outcome> = Vec::new();
    println!(
        "{:>5} {:>10} {:>12} {:>8}",
        "N", "table VII", "random-fifo", "barrel"
    );
    for &n in &sizes {
        let slots = a
            .slots
            .unwrap_or_else(|| (20_000_000 / n as u64).max(2_000));
        let row: Vec<Outcome> = Policy::ALL
            .into_iter()
            .map(|p| simulate(p, n, n, slots, a.seed))
            .collect();
        let published = TABLE_VII
            .iter()
            .find(|(k, _)| *k == n)
            .map_or("-".to_string(), |(_, v)| format!("{:.2} %", v * 100.0));
        println!(
            "{n:>5} {published:>10} {:>10.2} % {:>6.2} %",
            row[0].efficiency * 100.0,
            row[1].efficiency * 100.0
        );
        points.extend(row);
    }
    println!("  inf {:>8.2} %   (2 - sqrt 2)", hol_limit() * 100.0);
    if let Some(dir) = a.svg.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    evb_sim::plot::efficiency_svg(&points, &a.svg)?;
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&points).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    }
    println!(
        "wrote {} ({:.1} s)",
        a.svg.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
