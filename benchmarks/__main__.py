"""python -m benchmarks [SUBCOMMAND] [ARGS]: every benchmark behind one command.

Without a subcommand, or with options first, it runs `serving` (so `python -m benchmarks --quick`
is `python -m benchmarks serving --quick`). `python -m benchmarks SUBCOMMAND --help` gives a
subcommand's options. Only the module of the subcommand that runs is imported.
"""
import importlib
import runpy
import sys
from pathlib import Path
from typing import NamedTuple, Optional


class Subcommand(NamedTuple):
    module: str  # under benchmarks/; its main(argv) runs
    what: str
    mode: Optional[str] = None  # a serving mode: serving's option that selects it


SERVING = "records.serving"
SUBCOMMANDS = {
    "serving": Subcommand(SERVING, "every system, same models, same run (the default; `make bench`)"),
    "cpu-record": Subcommand(SERVING, "the default model against llama.cpp at its best, on this CPU", "--cpu-record"),
    "gguf-record": Subcommand(SERVING, "one GGUF file in this service and in llama.cpp", "--gguf-record"),
    "speculation-sweep": Subcommand(SERVING, "speculation on against off, side by side, 1 to 64 streams",
                                    "--speculation-sweep"),
    "speculative": Subcommand(SERVING, "one stream against llama.cpp, speculation on copying answers",
                              "--speculative"),
    "prefix": Subcommand(SERVING, "what the prefix cache saves: a conversation, a shared prompt", "--prefix"),
    "replicas": Subcommand(SERVING, "two replicas behind the router, round robin, one replica", "--replicas"),
    "structured": Subcommand(SERVING, "what JSON-schema constraints cost; a schema corpus compiled", "--structured"),
    "sizes": Subcommand("records.sizes", "this service and llama.cpp at every model size: speed, roofline, memory"),
    "folder": Subcommand("records.folder", "a Hugging Face folder, quantized at load, against its GGUF"),
    "lora": Subcommand("records.lora", "what a LoRA adapter costs on the default model, one stream and sixteen"),
    "replica-memory": Subcommand("records.replica_memory", "the memory of one replica and of two, weights shared or not"),
    "start": Subcommand("records.start", "from the start command to the first answered completion, against llama.cpp"),
    "reload": Subcommand("records.reload", "the first token after a keep-alive unload, on `make serve`'s Flow"),
    "engine": Subcommand("kernels.engine_bench", "the engine's micro-benchmarks (`make bench-engine`)"),
    "kernels": Subcommand("kernels.against_torch", "the C kernels against the PyTorch ops they replace"),
    "kernel-ab": Subcommand("kernels.kernel_ab", "two commits' C kernels in one process, bit for bit and timed"),
    "commit-ab": Subcommand("kernels.commit_ab", "two commits' engines alone, in alternating rounds"),
    "multiply-rate": Subcommand("kernels.multiply_rate", "one core's integer products a second, AVX2's and AVX-512's forms"),
    "products": Subcommand("kernels.products_rate", "a GGUF's quantized products alone, against the multiply bound and the bandwidth"),
    "steps": Subcommand("kernels.step_split", "the engine's passes under sixteen streams and a cold prompt, against the multiply bound"),
    "paths": Subcommand("kernels.paths_agree", "every kernel path's greedy tokens and top-5 logprobs at real sizes, bit for bit"),
    "roofline": Subcommand("harness.roofline", "the memory's read bandwidth, and a GGUF model's one-stream bound"),
    "sized-models": Subcommand("harness.sized_models", "random-weight models of 1B to 8B shapes, as folders and GGUF"),
    "quality": Subcommand("quality.quality", "quantized weights against fp32, beside llama.cpp's"),
    "lm-eval": Subcommand("quality.lm_eval_compare", "lm-evaluation-harness through the service against transformers"),
    "cuda-graphs": Subcommand("gpu.cuda_graphs", "on a CUDA GPU: decode steps from CUDA graphs against eager ones"),
}
REPRODUCE = "reproduce"  # runs a published record's reproduce.py: `reproduce docs/benchmarks/<record> [ARGS]`


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = [__doc__.strip(), "", "subcommands:"]
    lines += [f"  {name:<{width}}  {sub.what}" for name, sub in SUBCOMMANDS.items()]
    lines.append(f"  {REPRODUCE:<{width}}  a published record's reproduce.py: {REPRODUCE} docs/benchmarks/RECORD [ARGS]")
    return "\n".join(lines)


def reproduce(argv: list[str]) -> int:
    """Runs RECORD/reproduce.py as a script, with the repository's packages importable."""
    if not argv or argv[0].startswith("-"):
        print(f"usage: python -m benchmarks {REPRODUCE} docs/benchmarks/RECORD [ARGS]", file=sys.stderr)
        return 2
    script = Path(argv[0]) / "reproduce.py"
    if not script.is_file():
        print(f"{script}: no such file (records with one: docs/benchmarks/README.md)", file=sys.stderr)
        return 2
    sys.argv = [str(script), *argv[1:]]
    runpy.run_path(str(script), run_name="__main__")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"], ["help"]):
        print(usage())
        return 0
    if argv[:1] == [REPRODUCE]:
        return reproduce(argv[1:])
    name, rest = ("serving", argv) if not argv or argv[0].startswith("-") else (argv[0], argv[1:])
    if name not in SUBCOMMANDS:
        print(f"python -m benchmarks: unknown subcommand {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    sub = SUBCOMMANDS[name]
    module = importlib.import_module(f"{__package__}.{sub.module}")
    return int(module.main([sub.mode, *rest] if sub.mode else rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
