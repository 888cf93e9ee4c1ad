"""Many builds and many nodes: the one Slurm client (slurm.py), the build matrix run locally, in images or as Slurm
jobs (matrixrun.py), and the wheel validated on every node of a cluster (validate.py)."""
