"""The engine alone and its C kernels: micro-benchmarks (engine_bench.py), the kernels against PyTorch's
ops (against_torch.py), two commits side by side (commit_ab.py, kernel_ab.py), one core's multiply rate."""
