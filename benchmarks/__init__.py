"""The benchmarks, behind one command: `python -m benchmarks [SUBCOMMAND] [ARGS]` (benchmarks/README.md).

harness/ is what every server benchmark shares, records/ the drivers of the published records,
kernels/ the engine alone and its C kernels, quality/ accuracy against fp32 and lm-evaluation-harness,
gpu/ a lent GPU machine's check, peers/ the other servers compared against."""
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"  # every benchmark's default output, git-ignored
