"""A lent GPU machine's check (gpu_check.sh, with setup.sh, wheels.sh and patch312.sh for its Python 3.12)
and decode steps from CUDA graphs against eager ones (cuda_graphs.py)."""
