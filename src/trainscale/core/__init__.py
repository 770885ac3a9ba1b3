"""Records, timing definitions, SLURM's environment, supervision, data-set readers:
what every layer above uses. Imports nothing of trainscale."""
