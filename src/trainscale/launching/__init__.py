"""Starting a grid point's processes here or in a SLURM job, and the examples."""
