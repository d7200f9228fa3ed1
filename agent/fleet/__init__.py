"""Beyond one node: a Slurm job diagnosed across its nodes (fan-out with srun, one merged job report)."""
