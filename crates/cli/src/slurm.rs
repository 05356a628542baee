//! `evb slurm`: a ready sbatch script for a configuration. One Slurm task per node of the
//! configuration; each task runs `evb node --config F`, which takes the node of its rank
//! (SLURM_PROCID: the EVM, then the RUs, then the BUs; rank.rs). Each task writes its own
//! log (`srun --output=DIR/evb-%j-%t.out`, %t the rank) beside the batch log.

use std::path::{Path, PathBuf};

use clap::Args;
use evb_config::{Config, Role};

#[derive(Args)]
pub struct SlurmArgs {
    /// TOML configuration (validated first). The script names it by its absolute path.
    #[arg(long, short)]
    config: PathBuf,
    /// Hosts to spread the tasks over (sbatch --nodes); without it Slurm chooses.
    #[arg(long)]
    nodes: Option<u32>,
    /// Folder for the batch log (evb-JOBID.out) and each node's log (evb-JOBID-RANK.out);
    /// created if missing. Default: the current folder.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Time limit (sbatch --time, e.g. 10:00 or 1-00:00:00).
    #[arg(long)]
    time: Option<String>,
    /// Partition (sbatch --partition).
    #[arg(long)]
    partition: Option<String>,
    /// The evb binary the tasks run (default: this one).
    #[arg(long)]
    evb: Option<PathBuf>,
    /// Write the script to this file (made executable) instead of printing it.
    #[arg(long)]
    script: Option<PathBuf>,
}

/// What the script is made of, every path absolute.
pub struct Plan {
    pub config: PathBuf,
    pub evb: PathBuf,
    pub output: PathBuf,
    pub hosts: Option<u32>,
    pub time: Option<String>,
    pub partition: Option<String>,
}

pub fn run(a: &SlurmArgs) -> Result<(), String> {
    let cfg = Config::from_file(&a.config).map_err(|e| e.to_string())?;
    let cwd = std::env::current_dir().map_err(|e| format!("the current folder: {e}"))?;
    let config =
        std::fs::canonicalize(&a.config).map_err(|e| format!("{}: {e}", a.config.display()))?;
    let evb = match &a.evb {
        Some(p) => absolute(&cwd, p),
        None => std::env::current_exe().map_err(|e| format!("this evb binary's path: {e}"))?,
    };
    let output = absolute(&cwd, a.output.as_deref().unwrap_or(Path::new(".")));
    let plan = Plan {
        config,
        evb,
        output,
        hosts: a.nodes,
        time: a.time.clone(),
        partition: a.partition.clone(),
    };
    let text = script(&cfg, &plan)?;
    // sbatch opens the batch log before the script runs: its folder must exist
    std::fs::create_dir_all(&plan.output)
        .map_err(|e| format!("--output {}: {e}", plan.output.display()))?;
    match &a.script {
        None => print!("{text}"),
        Some(file) => {
            std::fs::write(file, &text).map_err(|e| format!("{}: {e}", file.display()))?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("{}: {e}", file.display()))?;
            eprintln!(
                "evb slurm: wrote {} ({} tasks); submit it with: sbatch {}",
                file.display(),
                cfg.nodes().len(),
                file.display()
            );
        }
    }
    Ok(())
}

fn absolute(cwd: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        cwd.join(p)
    }
}

/// The sbatch script for `cfg`: one task per node, rank k running `cfg.nodes()[k]`.
pub fn script(cfg: &Config, plan: &Plan) -> Result<String, String> {
    let nodes = cfg.nodes();
    let tasks = nodes.len();
    if let Some(h) = plan.hosts {
        if h == 0 || h as usize > tasks {
            return Err(format!(
                "--nodes {h}: give from 1 to {tasks} hosts (the configuration has {tasks} nodes, \
                 one task each)"
            ));
        }
    }
    for (what, v) in [("--time", &plan.time), ("--partition", &plan.partition)] {
        if let Some(v) = v {
            if v.is_empty()
                || v.chars()
                    .any(|c| c.is_whitespace() || c == '"' || c == '\'')
            {
                return Err(format!("{what} {v:?}: not a Slurm value"));
            }
        }
    }
    for (what, p) in [("--output", &plan.output), ("--config", &plan.config)] {
        if p.to_str()
            .is_none_or(|s| s.contains('"') || s.contains('\n'))
        {
            return Err(format!("{what} {}: a path sbatch cannot take", p.display()));
        }
    }
    let out = plan.output.display().to_string();
    let mut s = String::new();
    let mut line = |l: &str| {
        s.push_str(l);
        s.push('\n');
    };
    line("#!/bin/bash");
    line(&format!(
        "# evb run {:?} of {}: {tasks} nodes, one Slurm task each (written by `evb slurm`)",
        cfg.run.id,
        plan.config.display()
    ));
    line(&format!("#SBATCH --job-name={}", job_name(&cfg.run.id)));
    line(&format!("#SBATCH --ntasks={tasks}"));
    if let Some(h) = plan.hosts {
        line(&format!("#SBATCH --nodes={h}"));
    }
    if let Some(t) = &plan.time {
        line(&format!("#SBATCH --time={t}"));
    }
    if let Some(p) = &plan.partition {
        line(&format!("#SBATCH --partition={p}"));
    }
    line("#SBATCH --distribution=block");
    line(&format!(
        "#SBATCH --output={}",
        sbatch_quote(&format!("{out}/evb-%j.out"))
    ));
    line("#");
    line("# Rank k runs the configuration's k-th node (`evb node` reads SLURM_PROCID):");
    let width = nodes.iter().map(|n| n.id.len()).max().unwrap_or(0);
    for (k, n) in nodes.iter().enumerate() {
        let role = match n.role {
            Role::Evm => "EVM",
            Role::Ru => "RU",
            Role::Bu => "BU",
        };
        let addr = if cfg.is_discovered(&n.addr) {
            "(address found at start)"
        } else {
            n.addr.as_str()
        };
        line(&format!(
            "#   rank {k:>3}  {:<width$}  {role:<3}  {addr}",
            n.id
        ));
    }
    line("# --distribution=block hands ranks to hosts in contiguous blocks: the first host");
    line("# gets ranks 0, 1, ... as far as its share of the tasks goes, the next host the");
    line("# following ranks, and so on. A node with an address in the configuration listens");
    line("# there (its rank must land on that host); the others listen on their host's");
    line("# address (transport.interface) and register with the EVM, whose address they read");
    line("# from a rendezvous file beside the configuration (docs/operations/deployment.md).");
    line("# --kill-on-bad-exit: a node that fails ends the step, and the job says so.");
    line("# Node logs: evb-JOBID-RANK.out beside this job's log, each ending in the node's");
    line("# summary line (`evb node ID: verdict=OK ...`); each node's report as JSON in");
    line("# evb-JOBID-RANK.json (evb node --json, {rank} replaced by the node's rank).");
    line("set -e");
    line("status=0");
    line(&format!(
        "srun --ntasks={tasks} --distribution=block --kill-on-bad-exit=1 --output={} {} node \
         --config {} --json {}\"$SLURM_JOB_ID\"{} || status=$?",
        sh_quote(&format!("{out}/evb-%j-%t.out")),
        sh_quote(&plan.evb.display().to_string()),
        sh_quote(&plan.config.display().to_string()),
        sh_quote(&format!("{out}/evb-")),
        sh_quote("-{rank}.json"),
    ));
    line(&format!(
        "echo \"evb: srun exited with $status; node logs: {0}/evb-$SLURM_JOB_ID-RANK.out, \
         reports: {0}/evb-$SLURM_JOB_ID-RANK.json\"",
        out.replace(['"', '$', '`', '\\'], "_")
    ));
    line("exit $status");
    Ok(s)
}

/// A job name from the run id: letters, digits, '-', '_' and '.' kept, the rest '_'.
fn job_name(id: &str) -> String {
    let n: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    if n.is_empty() {
        "run".into()
    } else {
        n
    }
}

/// A word for the shell: as is when plainly safe, else in single quotes.
fn sh_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-%=:+,@".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// A value on an #SBATCH line: in double quotes when it holds spaces.
fn sbatch_quote(s: &str) -> String {
    if s.contains(char::is_whitespace) {
        format!("\"{s}\"")
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        Plan {
            config: "/runs/my run.toml".into(),
            evb: "/opt/evb/bin/evb".into(),
            output: "/runs/logs".into(),
            hosts: None,
            time: None,
            partition: None,
        }
    }

    #[test]
    fn one_task_per_node_and_the_rank_table() {
        let mut cfg = Config::default(); // evm, ru0, ru1, bu0, bu1
        cfg.topology.rus = 3;
        let nodes = cfg.nodes();
        assert_eq!(nodes.len(), 6);
        let s = script(&cfg, &plan()).unwrap();
        assert!(s.starts_with("#!/bin/bash\n"), "{s}");
        assert!(s.contains("\n#SBATCH --ntasks=6\n"), "{s}");
        assert!(s.contains("\n#SBATCH --distribution=block\n"), "{s}");
        assert!(
            s.contains("\n#SBATCH --output=/runs/logs/evb-%j.out\n"),
            "{s}"
        );
        assert!(!s.contains("--nodes"), "{s}");
        assert!(!s.contains("--time") && !s.contains("--partition"), "{s}");
        // rank k = the configuration's k-th node, in order
        let table: Vec<(usize, String, String)> = s
            .lines()
            .filter_map(|l| l.strip_prefix("#   rank "))
            .map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                (w[0].parse().unwrap(), w[1].to_string(), w[2].to_string())
            })
            .collect();
        let expected: Vec<(usize, String, String)> = nodes
            .iter()
            .enumerate()
            .map(|(k, n)| {
                let role = match n.role {
                    Role::Evm => "EVM",
                    Role::Ru => "RU",
                    Role::Bu => "BU",
                };
                (k, n.id.clone(), role.to_string())
            })
            .collect();
        assert_eq!(table, expected);
        assert_eq!(table[0].1, "evm");
        assert_eq!(table[1].1, "ru0");
        assert_eq!(table[3].1, "ru2");
        assert_eq!(table[4].1, "bu0");
        // the step: every task a node with its own log, the config by absolute path, quoted
        assert!(
            s.contains(
                "\nsrun --ntasks=6 --distribution=block --kill-on-bad-exit=1 \
                 --output=/runs/logs/evb-%j-%t.out /opt/evb/bin/evb node \
                 --config '/runs/my run.toml' --json /runs/logs/evb-\"$SLURM_JOB_ID\"'-{rank}.json' \
                 || status=$?\n"
            ),
            "{s}"
        );
        assert!(
            s.contains("\nset -e\n") && s.trim_end().ends_with("exit $status"),
            "{s}"
        );
    }

    #[test]
    fn hosts_time_and_partition_are_passed_on_and_checked() {
        let cfg = Config::default();
        let mut p = plan();
        p.hosts = Some(2);
        p.time = Some("10:00".into());
        p.partition = Some("daq".into());
        let s = script(&cfg, &p).unwrap();
        assert!(
            s.contains("\n#SBATCH --ntasks=5\n#SBATCH --nodes=2\n"),
            "{s}"
        );
        assert!(s.contains("\n#SBATCH --time=10:00\n"), "{s}");
        assert!(s.contains("\n#SBATCH --partition=daq\n"), "{s}");
        p.hosts = Some(6);
        let e = script(&cfg, &p).unwrap_err();
        assert!(e.contains("--nodes 6") && e.contains("5 nodes"), "{e}");
        p.hosts = Some(0);
        assert!(script(&cfg, &p).is_err());
        p.hosts = None;
        p.time = Some("1 day".into());
        assert!(script(&cfg, &p).unwrap_err().contains("--time"));
    }

    #[test]
    fn shell_words_are_quoted() {
        assert_eq!(sh_quote("/a/b-c_d.toml"), "/a/b-c_d.toml");
        assert_eq!(sh_quote("/a b"), "'/a b'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(sh_quote("$HOME"), "'$HOME'");
        assert_eq!(job_name("run 1/x"), "run_1_x");
    }
}
