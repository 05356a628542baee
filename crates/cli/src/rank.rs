//! A node's id from the rank a launcher gives its process: `srun -n 5 evb node --config
//! run.toml` (Slurm) or `mpirun -n 5 evb node --config run.toml` (Open MPI, MPICH through
//! PMI, PMIx) start the whole run, each process taking the node of its rank. Rank k runs
//! the configuration's k-th node in the order `evb config` lists them: the EVM, then the RUs,
//! then the BUs. The addresses still come from the configuration (docs/operations.md).

use evb_config::Config;

/// Where launchers put the rank, and the number of tasks when they say it.
const LAUNCHERS: [(&str, Option<&str>); 4] = [
    ("SLURM_PROCID", Some("SLURM_NTASKS")),
    ("OMPI_COMM_WORLD_RANK", Some("OMPI_COMM_WORLD_SIZE")),
    ("PMIX_RANK", None),
    ("PMI_RANK", Some("PMI_SIZE")),
];

/// The id of the node this process runs, from the first launcher's rank found by `env`.
pub fn node_id(cfg: &Config, env: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let nodes = cfg.nodes();
    let Some((var, size_var, value)) = LAUNCHERS
        .iter()
        .find_map(|&(var, size)| env(var).map(|v| (var, size, v)))
    else {
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
