"""python -m benchmarks lm-eval: lm-evaluation-harness's loglikelihoods through this service's
completions route (`local-completions`) against the harness's own `hf` model on the same weights.

Run it from the repository root with the project's venv; the harness runs in its own (`.venv-eval`,
`make eval-venv`) as a subprocess:

    .venv/bin/python -m benchmarks lm-eval --out benchmarks/results/lm_eval_compare
    .venv/bin/python -m benchmarks lm-eval --hf-only --out /tmp/x   # no service

The service runs as `make serve` runs it (`jina flow --uses flows/llm.yml`, testing.flows.start_flow)
on free ports, with LLM_DTYPE=fp32 so that it computes with the weights as `hf` loads them. Three
small tasks from benchmarks/quality/lm_eval_task/ (local files, no download) are scored by both:

- lmc_choice: multiple choice, choices of one to several tokens;
- lmc_continuation: context + continuation, half of them the model's own greedy continuation,
  so is_greedy is true as often as false; contexts ending in spaces, text beyond ASCII;
- lmc_rolling: loglikelihood_rolling, as perplexity tasks (wikitext) score: the prefix token
  (<|im_start|>), then the text.

What `local-completions` (lm_eval 0.4.13) sends for each request, and this route must serve:
`{"model", "prompt": "<context + continuation as one string>", "temperature": 0, "max_tokens": 1,
"logprobs": 1, "echo": true, "seed": 1234}` (tokenized_requests=False, since the route takes no
token-id prompts; batch_size 1, since it takes one prompt per request). It reads only
`choices[].index` and `choices[].logprobs.token_logprobs` / `.top_logprobs` (dicts, their values):
entries ctxlen .. -2, i.e. the prompt's own tokens after the context, then drops the last entry (the
one generated token). ctxlen comes from the harness's tokenizer (the model folder's), so the
service must tokenize the decoded string into the same tokens: a probe request checks that first.

Every request is matched one to one by (task, doc_id, request index), its (context, continuation)
checked equal on both sides; the run fails (exit 1) when a loglikelihood differs by more than
--tolerance (1e-3) or is_greedy differs. OUT gets summary.json, summary.md, each side's harness
output (hf/, local-completions/) and the Flow's log (flow.log).
"""
import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
TASK_DIR = Path(__file__).resolve().parent / "lm_eval_task"
PROG = "python -m benchmarks lm-eval"
TASKS = ("lmc_choice", "lmc_continuation", "lmc_rolling")
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct"
EVAL_PYTHON = ROOT / ".venv-eval" / "bin" / "python"
SEED = 1234  # local-completions' default seed, sent in every payload

Key = tuple[str, int, int]  # (task, doc_id, request index within the doc)


class Record:
    __slots__ = ("args", "greedy", "ll")

    def __init__(self, ll: float, greedy: Optional[bool], args: tuple[str, str]):
        self.ll, self.greedy, self.args = ll, greedy, args


# ----- the harness -----

def harness_env(threads: int) -> dict[str, str]:
    """Offline (the task files and the model folder are local), and modest on CPU."""
    return dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))


def local_completions_args(base_url: str, model: Path, served_name: str, concurrent: int) -> list[str]:
    model_args = ",".join([
        f"base_url={base_url}", f"model={served_name}", f"tokenizer={model}",
        "tokenizer_backend=huggingface",  # not "auto": that probes GET /tokenizer_info first
        "tokenized_requests=False",  # the route takes prompts as text, not token ids
        f"num_concurrent={concurrent}", "max_retries=1", f"seed={SEED}"])
    return ["--model", "local-completions", "--model_args", model_args, "--batch_size", "1"]


def hf_args(model: Path) -> list[str]:
    return ["--model", "hf", "--model_args", f"pretrained={model},dtype=float32", "--device", "cpu",
            "--batch_size", "1"]


def run_harness(python: Path, model_args: list[str], tasks: list[str], out: Path, threads: int) -> float:
    """Run lm_eval with --log_samples into `out` (emptied first); its wall time in seconds."""
    if out.exists():
        for f in sorted(out.rglob("*"), reverse=True):
            f.unlink() if f.is_file() else f.rmdir()
    out.mkdir(parents=True, exist_ok=True)
    cmd = [str(python), "-m", "lm_eval", *model_args, "--tasks", ",".join(tasks),
           "--include_path", str(TASK_DIR), "--log_samples", "--output_path", str(out)]
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    started = time.perf_counter()
    with open(out / "harness.log", "wb") as log:
        rc = subprocess.run(cmd, cwd=ROOT, env=harness_env(threads), stdout=log, stderr=subprocess.STDOUT).returncode
    elapsed = time.perf_counter() - started
    if rc != 0:
        tail = (out / "harness.log").read_text(errors="replace")[-4000:]
        raise RuntimeError(f"lm_eval exited with {rc} ({out / 'harness.log'}):\n{tail}")
    print(f"{model_args[1]}: {elapsed:.1f} s", file=sys.stderr, flush=True)
    _name_by_model(out)
    return elapsed


def _name_by_model(out: Path) -> None:
    """The harness names its results folder after the model's path as given (a local path turns
    into `__work__...__SmolLM2-135M-Instruct`): the folder is named after the model instead."""
    for folder in [p for p in out.iterdir() if p.is_dir() and "__" in p.name]:
        folder.rename(out / folder.name.rsplit("__", 1)[-1])


def read_samples(out: Path, tasks: list[str]) -> tuple[dict[Key, Record], dict[str, dict]]:
    """Every request's (loglikelihood, is_greedy) from the harness's samples files, and each task's metrics."""
    records: dict[Key, Record] = {}
    for task in tasks:
        files = sorted(out.rglob(f"samples_{task}_*.jsonl"))
        if not files:
            raise RuntimeError(f"no samples for {task} under {out}")
        for line in files[-1].read_text().splitlines():
            sample = json.loads(line)
            args = list(sample["arguments"].values())
            for i, resp in enumerate(sample["resps"]):
                value = resp[0]  # [ll, is_greedy] (loglikelihood) or ll (rolling), as strings
                value = [value] if isinstance(value, (str, int, float)) else value
                greedy = None if len(value) < 2 else str(value[1]) == "True"
                pair = (args[i]["arg_0"], args[i]["arg_1"]) if "arg_1" in args[i] else ("", args[i]["arg_0"])
                records[(task, sample["doc_id"], i)] = Record(float(value[0]), greedy, pair)
    results = sorted(out.rglob("results_*.json"))
    metrics = json.loads(results[-1].read_text())["results"] if results else {}
    return records, metrics


def harness_versions(python: Path) -> dict[str, str]:
    code = ("import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
            "('lm_eval', 'torch', 'transformers', 'tokenizers')}))")
    try:
        return json.loads(subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                                         check=True).stdout)
    except (subprocess.CalledProcessError, json.JSONDecodeError) as exc:
        return {"error": str(exc)}


# ----- the service -----

def post_json(url: str, body: dict, timeout: float = 120.0) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")
        try:
            return exc.code, json.loads(text)
        except json.JSONDecodeError:
            return exc.code, text
    except OSError as exc:
        return 0, f"no answer from {url}: {exc}"


def harness_payload(served_name: str, prompt: str) -> dict:
    """What local-completions sends for one loglikelihood request (openai_completions.py, _create_payload)."""
    return {"model": served_name, "prompt": prompt, "temperature": 0, "max_tokens": 1, "logprobs": 1,
            "seed": SEED, "echo": True}


def probe(base_url: str, model: Path, served_name: str) -> list[str]:
    """One request as the harness sends it: what in the answer the harness would misread (empty: none)."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    prompt = "Question: What is the capital of France?\nAnswer: Paris"
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    status, body = post_json(base_url, harness_payload(served_name, prompt))
    if status != 200:
        return [f"HTTP {status}: {json.dumps(body)[:600]}"]
    problems = []
    try:
        choices = body["choices"]
        lp = choices[0]["logprobs"]
        tokens, top = lp["token_logprobs"], lp["top_logprobs"]
    except (KeyError, IndexError, TypeError) as exc:
        return [f"no choices[0].logprobs.token_logprobs/top_logprobs ({exc!r}): {json.dumps(body)[:600]}"]
    if len(choices) != 1 or choices[0].get("index") != 0:
        problems.append(f"expected one choice with index 0, got {[c.get('index') for c in choices]}")
    if len(tokens) != len(ids) + 1 or len(top) != len(tokens):
        problems.append(f"{len(tokens)} token_logprobs and {len(top)} top_logprobs for a {len(ids)}-token prompt "
                        f"(the harness expects prompt tokens + 1 generated)")
    if lp.get("tokens") and len(lp["tokens"]) == len(ids) + 1:  # their spelling may differ: only a note
        want = [tokenizer.decode([i]) for i in ids]
        if lp["tokens"][:len(ids)] != want:
            print(f"note: echoed tokens {lp['tokens'][:len(ids)]} vs the harness tokenizer's {want}", file=sys.stderr)
    for i, (value, alts) in enumerate(zip(tokens[1:], top[1:], strict=False), start=1):
        if not isinstance(value, (int, float)) or not isinstance(alts, dict) or not alts:
            problems.append(f"entry {i}: token_logprob {value!r}, top_logprobs {alts!r}")
            break
        if value > max(alts.values()) + 1e-6:
            problems.append(f"entry {i}: the token's logprob {value} is above its best alternative {alts}")
            break
    return problems


def served_id(http_port: int) -> Optional[str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v1/models", timeout=10) as r:
            return json.loads(r.read())["data"][0]["id"]
    except (OSError, KeyError, IndexError, json.JSONDecodeError):
        return None


# ----- the comparison -----

def compare(served: dict[Key, Record], own: dict[Key, Record], tolerance: float) -> dict:
    only = sorted(set(served) ^ set(own))
    keys = sorted(set(served) & set(own))
    args_differ = [k for k in keys if served[k].args != own[k].args]
    diffs = {k: abs(served[k].ll - own[k].ll) for k in keys}
    greedy_mismatch = [k for k in keys if served[k].greedy != own[k].greedy]
    bad = [k for k in keys if not diffs[k] <= tolerance]  # NaN counts as over

    def row(k: Key) -> dict:
        return {"task": k[0], "doc_id": k[1], "request": k[2], "context": served[k].args[0][-60:],
                "continuation": served[k].args[1][:60], "local-completions": served[k].ll, "hf": own[k].ll,
                "abs_diff": diffs[k], "is_greedy": {"local-completions": served[k].greedy, "hf": own[k].greedy}}

    per_task = {}
    for task in sorted({k[0] for k in keys}):
        ks = [k for k in keys if k[0] == task]
        greedy = [k for k in ks if own[k].greedy is not None]
        per_task[task] = {"requests": len(ks), "max_abs_diff": max(diffs[k] for k in ks),
                          "mean_abs_diff": sum(diffs[k] for k in ks) / len(ks),
                          "is_greedy_true_hf": sum(1 for k in greedy if own[k].greedy),
                          "is_greedy_checked": len(greedy),
                          "is_greedy_mismatches": sum(1 for k in ks if k in set(greedy_mismatch)),
                          "over_tolerance": sum(1 for k in ks if k in set(bad))}
    worst = max(keys, key=lambda k: -1 if math.isnan(diffs[k]) else diffs[k]) if keys else None
    return {"requests": len(keys), "tolerance": tolerance,
            "max_abs_diff": diffs[worst] if worst else None,
            "mean_abs_diff": sum(diffs.values()) / len(diffs) if diffs else None,
            "is_greedy_mismatches": len(greedy_mismatch), "over_tolerance": len(bad),
            "unmatched": [list(k) for k in only], "arguments_differ": [row(k) for k in args_differ],
            "worst": row(worst) if worst else None, "per_task": per_task,
            "failures": [row(k) for k in sorted(set(bad) | set(greedy_mismatch))][:50],
            "passed": bool(keys) and not only and not args_differ and not bad and not greedy_mismatch}


def markdown(summary: dict) -> str:
    lines = ["# lm-evaluation-harness: local-completions (this service) vs hf", "",
             f"{summary['date']}, commit {summary['commit']}, `{summary['command']}`", "",
             f"Model `{summary['model']}`, service LLM_DTYPE=fp32; harness {summary['harness']}.", ""]
    cmp = summary.get("comparison")
    if cmp is None:
        lines += ["hf side only (no service run).", "", "| task | requests | is_greedy true |", "| --- | --- | --- |"]
        for task, t in summary["hf_only"].items():
            lines.append(f"| {task} | {t['requests']} | {t['is_greedy_true']} |")
        return "\n".join(lines) + "\n"
    verdict = "PASS" if cmp["passed"] else "FAIL"
    lines += [f"**{verdict}**: {cmp['requests']} requests, max |diff| {cmp['max_abs_diff']:.3g}, "
              f"mean {cmp['mean_abs_diff']:.3g} (tolerance {cmp['tolerance']:g}), "
              f"is_greedy mismatches {cmp['is_greedy_mismatches']}, over tolerance {cmp['over_tolerance']}, "
              f"unmatched {len(cmp['unmatched'])}, arguments differing {len(cmp['arguments_differ'])}.", "",
              "| task | requests | max abs diff | mean abs diff | is_greedy true (hf) / checked | greedy mismatches |",
              "| --- | --- | --- | --- | --- | --- |"]
    for task, t in cmp["per_task"].items():
        lines.append(f"| {task} | {t['requests']} | {t['max_abs_diff']:.3g} | {t['mean_abs_diff']:.3g} | "
                     f"{t['is_greedy_true_hf']} / {t['is_greedy_checked']} | {t['is_greedy_mismatches']} |")
    w = cmp["worst"]
    lines += ["", f"Largest difference: {w['task']} doc {w['doc_id']} request {w['request']} "
              f"(continuation {w['continuation']!r}): {w['local-completions']:.6f} vs {w['hf']:.6f}.", "",
              "Metrics (local-completions / hf):", ""]
    for task, metrics in summary["metrics"]["hf"].items():
        served = summary["metrics"]["local-completions"].get(task, {})
        shown = [f"{name.split(',')[0]} {served.get(name, float('nan')):.4g} / {value:.4g}"
                 for name, value in metrics.items() if isinstance(value, (int, float)) and "stderr" not in name and name != "sample_len"]
        lines.append(f"- {task}: " + ", ".join(shown))
    lines += ["", f"Wall time: local-completions {summary['seconds'].get('local-completions', 0):.1f} s, "
              f"hf {summary['seconds'].get('hf', 0):.1f} s."]
    if cmp["failures"]:
        lines += ["", "Failures (first 50):", "", "| task | doc | req | continuation | local-completions | hf | greedy |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for f in cmp["failures"]:
            g = f["is_greedy"]
            lines.append(f"| {f['task']} | {f['doc_id']} | {f['request']} | {f['continuation']!r} | "
                         f"{f['local-completions']:.6f} | {f['hf']:.6f} | {g['local-completions']} / {g['hf']} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the Flow is stopped on SIGTERM too
    python = args.harness_python
    if not python.exists():
        print(f"lm-evaluation-harness is not installed at {python}: run `make eval-venv` first", file=sys.stderr)
        return 2
    model = args.model.resolve()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tasks = args.tasks.split(",")
    summary: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                 cwd=ROOT).stdout.strip(),
        "command": f"{PROG} " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": str(model.relative_to(ROOT) if model.is_relative_to(ROOT) else model),
        "tasks": tasks, "harness": harness_versions(python), "seconds": {}}

    served: dict[Key, Record] = {}
    served_metrics: dict[str, dict] = {}
    if not args.hf_only:
        server = None
        try:
            if args.base_url:
                base_url, name = args.base_url, args.served_name or model.name
            else:
                from testing.flows import start_flow
                env = {"LLM_DTYPE": "fp32", **dict(kv.split("=", 1) for kv in args.service_env)}
                print(f"starting the Flow ({env}) ...", file=sys.stderr, flush=True)
                server, _, http_port = start_flow(str(model), out, env=env)
                base_url = f"http://127.0.0.1:{http_port}/v1/completions"
                name = args.served_name or served_id(http_port) or model.name
            summary["service"] = {"base_url": base_url, "served_name": name,
                                  "payload": harness_payload(name, "<context + continuation>")}
            problems = probe(base_url, model, name)
            summary["service"]["probe_problems"] = problems
            if problems:
                print("the route does not answer the harness's request as it reads it:\n  " + "\n  ".join(problems),
                      file=sys.stderr)
                (out / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False))
                return 3
            summary["seconds"]["local-completions"] = run_harness(
                python, local_completions_args(base_url, model, name, args.concurrent), tasks,
                out / "local-completions", args.threads)
        finally:
            if server is not None:
                server.stop()
        served, served_metrics = read_samples(out / "local-completions", tasks)

    summary["seconds"]["hf"] = run_harness(python, hf_args(model), tasks, out / "hf", args.threads)
    own, own_metrics = read_samples(out / "hf", tasks)
    summary["metrics"] = {"local-completions": served_metrics, "hf": own_metrics}

    if args.hf_only:
        summary["hf_only"] = {task: {"requests": sum(1 for k in own if k[0] == task),
                                     "is_greedy_true": sum(1 for k, r in own.items() if k[0] == task and r.greedy)}
                              for task in tasks}
        passed = all(t["requests"] > 0 for t in summary["hf_only"].values())
    else:
        summary["comparison"] = compare(served, own, args.tolerance)
        passed = summary["comparison"]["passed"]
    (out / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False))
    (out / "summary.md").write_text(markdown(summary))
    print(markdown(summary))
    print(f"written: {out / 'summary.json'}, {out / 'summary.md'}", file=sys.stderr)
    return 0 if passed else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "lm_eval_compare")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="largest |loglikelihood difference| allowed")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="an HF-format model folder")
    parser.add_argument("--tasks", default=",".join(TASKS), help="tasks from benchmarks/quality/lm_eval_task/")
    parser.add_argument("--hf-only", action="store_true", help="run the harness's hf model only (no service)")
    parser.add_argument("--base-url", help="an already running service's /v1/completions URL (started with "
                                           "LLM_DTYPE=fp32) instead of starting one")
    parser.add_argument("--served-name", help="the model name to send (default: what /v1/models reports)")
    parser.add_argument("--service-env", action="append", default=[], metavar="K=V",
                        help="more environment for the started service (repeatable)")
    parser.add_argument("--concurrent", type=int, default=1,
                        help="local-completions' num_concurrent: >1 sends requests in parallel (batched rows)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the harness's hf model")
    parser.add_argument("--harness-python", type=Path, default=EVAL_PYTHON)
    return parser
