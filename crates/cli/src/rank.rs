//! A node's id from the rank a launcher gives its process: `srun -n 5 evb node --config
//! run.toml` (Slurm) or `mpirun -n 5 evb node --config run.toml` (Open MPI, MPICH through
//! PMI, PMIx) start the whole run, each process taking the node of its rank. Rank k runs
//! the configuration's k-th node in the order `evb config` lists them: the EVM, then the RUs,
//! then the BUs. Nodes whose address is left out find each other through the EVM
//! (evb_node::discovery, docs/operations/deployment.md).

use std::path::{Path, PathBuf};

use evb_config::Config;
use evb_node::discovery::{default_rendezvous, launcher_rank, LAUNCHERS};

/// Applies `--evm` and `--rendezvous`, and under a launcher with no rendezvous file named,
/// takes the job's default one when the EVM's address is left out.
pub fn place(
    cfg: &mut Config,
    config_file: &Path,
    evm: Option<String>,
    rendezvous: Option<PathBuf>,
) -> Result<(), String> {
    if let Some(a) = evm {
        let sa: std::net::SocketAddr = a
            .parse()
            .map_err(|_| format!("--evm {a:?} is not an IP:port address"))?;
        if sa.port() == 0 {
            return Err(format!("--evm {a}: give the port the EVM listens on"));
        }
        cfg.evm.addr = a;
        // a `[[ru]]`/`[[bu]]` list or [topology] makes the EVM's address from evm.addr
    }
    if let Some(f) = rendezvous {
        cfg.run.rendezvous = f.to_string_lossy().into_owned();
    }
    let evm_addr = cfg.nodes()[0].addr.clone();
    if cfg.run.rendezvous.is_empty() && cfg.is_discovered(&evm_addr) {
        let env = |k: &str| std::env::var(k).ok();
        if let Some(f) = default_rendezvous(config_file, &cfg.run.id, &env) {
            cfg.run.rendezvous = f.to_string_lossy().into_owned();
        }
    }
    cfg.validate().map_err(|e| e.to_string())
}

/// The id of the node this process runs, from the first launcher's rank found by `env`.
pub fn node_id(cfg: &Config, env: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let nodes = cfg.nodes();
    let Some((var, size_var, value)) = launcher_rank(&env) else {
        return Err(format!(
            "no --id, and no launcher's rank in the environment ({}): give --id, or start \
             the nodes with srun or mpirun",
            LAUNCHERS.map(|l| l.0).join(", ")
        ));
    };
    let rank: usize = value
        .trim()
        .parse()
        .map_err(|_| format!("{var} = {value:?} is not a rank"))?;
    let names = || {
        nodes
            .iter()
            .map(|n| n.id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(size_var) = size_var {
        if let Some(size) = env(size_var) {
            if size.trim().parse::<usize>().ok() != Some(nodes.len()) {
                return Err(format!(
                    "the launcher started {size} tasks ({size_var}) but the configuration has \
                     {} nodes ({}): start exactly {}",
                    nodes.len(),
                    names(),
                    nodes.len()
                ));
            }
        }
    }
    nodes.get(rank).map(|n| n.id.clone()).ok_or_else(|| {
        format!(
            "rank {rank} ({var}): the configuration has only {} nodes ({})",
            nodes.len(),
            names()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|v| v.0 == k).map(|v| v.1.to_string())
    }

    #[test]
    fn ranks_map_to_the_evm_then_the_rus_then_the_bus() {
        let cfg = Config::default(); // evm, ru0, ru1, bu0, bu1
        let id = |vars: &[(&str, &str)]| node_id(&cfg, env(vars));
        assert_eq!(id(&[("SLURM_PROCID", "0")]).unwrap(), "evm");
        assert_eq!(id(&[("OMPI_COMM_WORLD_RANK", "2")]).unwrap(), "ru1");
        assert_eq!(id(&[("PMIX_RANK", "4")]).unwrap(), "bu1");
        assert_eq!(id(&[("PMI_RANK", "3"), ("PMI_SIZE", "5")]).unwrap(), "bu0");
        // Slurm's variables win when several launchers' are set
        assert_eq!(
            id(&[("OMPI_COMM_WORLD_RANK", "1"), ("SLURM_PROCID", "3")]).unwrap(),
            "bu0"
        );
        let e = id(&[("SLURM_PROCID", "5")]).unwrap_err();
        assert!(
            e.contains("rank 5 (SLURM_PROCID)") && e.contains("only 5 nodes"),
            "{e}"
        );
        let e = id(&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "4")]).unwrap_err();
        assert!(e.contains("started 4 tasks (OMPI_COMM_WORLD_SIZE)"), "{e}");
        assert!(id(&[("SLURM_PROCID", "x")])
            .unwrap_err()
            .contains("not a rank"));
        assert!(id(&[]).unwrap_err().contains("give --id"));
    }
}
