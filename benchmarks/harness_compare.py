"""python -m benchmarks.harness_compare: lm-evaluation-harness through this service's completions
route against the harness's own `hf` model, on the same weights.

The service runs with LLM_DTYPE=fp32 (the default model's weights as the harness's `hf` model
loads them); the harness scores a small multiple-choice task from benchmarks/harness/qa.jsonl
(no download) twice: `local-completions` (echo with logprobs, max_tokens 1, as the harness sends
them) and `hf`. Every request's loglikelihood is matched by document and choice; the run fails
when one differs by more than --tolerance (1e-3) or when is_greedy differs.

The harness lives in its own environment, `make eval-venv` (.venv-eval), with its own pins.
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from testing.flows import start_flow

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / ".venv-eval" / "bin" / "python"
TASK = ROOT / "benchmarks" / "harness"


def run_harness(model_args: list[str], task_dir: Path, out: Path) -> list[dict]:
    """The harness's samples: one record per document, its requests' (loglikelihood, is_greedy)."""
    cmd = [str(HARNESS), "-m", "lm_eval", *model_args, "--tasks", "qa_local", "--include_path", str(task_dir),
           "--log_samples", "--output_path", str(out), "--batch_size", "1"]
    started = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT)
    print(f"{model_args[1]}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    samples = sorted(out.rglob("samples_qa_local_*.jsonl"))
    if not samples:
        raise RuntimeError(f"no samples under {out}")
    return [json.loads(line) for line in samples[-1].read_text().splitlines()]


def scores(samples: list[dict]) -> dict[tuple[int, int], tuple[float, bool]]:
    """(doc_id, choice) -> (loglikelihood, is_greedy)."""
    out = {}
    for sample in samples:
        for choice, resp in enumerate(sample["resps"]):
            logprob, greedy = resp[0]
            out[(sample["doc_id"], choice)] = (float(logprob), str(greedy) == "True")
    return out


def main(args: argparse.Namespace) -> int:
    if not HARNESS.exists():
        print("lm-evaluation-harness is not installed: run `make eval-venv` first", file=sys.stderr)
        return 2
    model = str(ROOT / "models" / "SmolLM2-135M-Instruct")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        task_dir = Path(tmp)
        (task_dir / "qa_local.yaml").write_text(
            (TASK / "qa_local.yaml").read_text().replace("QA_JSONL", str(TASK / "qa.jsonl")))
        server, _, http_port = start_flow(model, task_dir, env={"LLM_DTYPE": "fp32"})
        try:
            served = run_harness(
                ["--model", "local-completions", "--model_args",
                 f"base_url=http://127.0.0.1:{http_port}/v1/completions,model=m,tokenizer={model},"
                 "tokenized_requests=False,num_concurrent=1,max_retries=1"], task_dir, args.out / "local-completions")
        finally:
            server.stop()
        own = run_harness(["--model", "hf", "--model_args", f"pretrained={model},dtype=float32",
                           "--device", "cpu"], task_dir, args.out / "hf")
    a, b = scores(served), scores(own)
    if a.keys() != b.keys():
        raise RuntimeError(f"the runs scored different requests: {sorted(a.keys() ^ b.keys())[:5]}")
    diffs = {k: abs(a[k][0] - b[k][0]) for k in a}
    greedy_mismatch = [k for k in a if a[k][1] != b[k][1]]
    worst = max(diffs, key=lambda k: diffs[k])
    summary = {"requests": len(diffs), "max_abs_diff": diffs[worst], "worst": {"doc_id": worst[0], "choice": worst[1],
               "local-completions": a[worst][0], "hf": b[worst][0]},
               "mean_abs_diff": sum(diffs.values()) / len(diffs), "is_greedy_mismatches": len(greedy_mismatch),
               "tolerance": args.tolerance,
               "accuracy": {name: sum(1 for s in samples if s["acc"]) / len(samples)
                            for name, samples in (("local-completions", served), ("hf", own))},
               "date": time.strftime("%Y-%m-%d"),
               "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                        cwd=ROOT).stdout.strip(),
               "command": "python -m benchmarks.harness_compare " + " ".join(sys.argv[1:])}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0 if diffs[worst] <= args.tolerance and not greedy_mismatch else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "harness")
    parser.add_argument("--tolerance", type=float, default=1e-3)
    sys.exit(main(parser.parse_args()))
