"""python -m benchmarks lora: what serving a LoRA adapter costs, on the default model.

    python -m benchmarks lora [--rank 16] [--out DIR]

The adapter is made here with PEFT on the default model (`make model`): random A and B of
`--rank` on every projection of every layer (q, k, v, o, gate, up, down), as a fine-tune of all
linear layers ships. Three fresh servers of `make serve`'s Flow, one after the other, each
measured at one stream and sixteen (greedy, 64 tokens with ignore_eos, OpenAI streaming
completions):
- the model alone (no adapter configured: its C stack);
- the model with the adapter configured, asked for the base model (what configuring adapters costs
  the base's requests: the layers then run as transformers' modules, with the low-rank products
  beside the C products);
- the same server asked for the adapter (what its low-rank products cost on top).
"""
import argparse
import asyncio
from pathlib import Path
from typing import Optional

import torch

from testing.procs import ROOT, settle

from ..harness.load import closed_loop, make_prompts
from ..harness.metrics import summarize
from ..harness.report import write_results
from ..harness.systems import flow_server, http_session, openai_model_id
from .cpu_record import _http_target
from .sizes import head, ratio

MODEL = ROOT / "models" / "SmolLM2-135M-Instruct"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SERVED = ("base, no adapter configured", "base, beside the adapter", "the adapter")


def adapter(rank: int, out: Path) -> Path:
    """A rank-`rank` adapter of every projection of the default model, random, made once."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    folder = out / f"adapter-r{rank}"
    if not (folder / "adapter_config.json").exists():
        torch.manual_seed(rank)
        model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
        config = LoraConfig(r=rank, lora_alpha=rank, target_modules=TARGETS, init_lora_weights=False)
        get_peft_model(model, config).save_pretrained(folder)
    return folder


async def measure(name: str, env: dict, adapter_name: Optional[str], args: argparse.Namespace) -> dict:
    row: dict = {"served": name}
    with flow_server(MODEL, args.out / "logs", name=f"lora-{len(env)}", env=env) as (_, port):
        async with http_session() as http:
            model_id = await openai_model_id(http, port, MODEL.name)
            if adapter_name:
                model_id = f"{model_id}:{adapter_name}"
            target = await _http_target(http, port, MODEL, model_id)
            for prompt in ("Warm-up: the first call", "Warm-up: and the second"):
                async for _ in target.plain(prompt, 4):
                    pass
            await settle()
            for c, n in ((1, 8), (16, 32)):
                prompts = make_prompts(256, args.seed, draw=f"closed {c}")
                records, duration, cut = await closed_loop(target.plain, prompts, c, n, args.max_tokens, 900)
                row[f"c{c}_tok_s"] = None if cut else summarize(records, duration)["output_tok_s"]
                await settle()
    print(f"  {row}", flush=True)
    return row


def table(result: dict) -> str:
    base = result["rows"][0]
    lines = [f"# What a LoRA adapter costs ({result['cpu']})", "",
             f"{result['date']}, git {result['git']}, `{result['command']}`; the default model, an adapter of rank "
             f"{result['rank']} on every projection. Each cell: tok/s, and its ratio to the model alone.", "",
             "| served | one stream, tok/s | sixteen streams, tok/s |", "|---|---|---|"]
    for row in result["rows"]:
        lines.append(f"| {row['served']} | {row['c1_tok_s']} ({ratio(row['c1_tok_s'], base['c1_tok_s'])}) | "
                     f"{row['c16_tok_s']} ({ratio(row['c16_tok_s'], base['c16_tok_s'])}) |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks lora", description=__doc__.splitlines()[0])
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "lora")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    folder = adapter(args.rank, args.out)
    result = head("lora", argv, rank=args.rank, rows=[])
    configured = {"LLM_LORA": f"r{args.rank}={folder}"}
    for name, env, asked in zip(SERVED, ({}, configured, configured), (None, None, f"r{args.rank}"), strict=True):
        print(name, flush=True)
        result["rows"].append(asyncio.run(measure(name, env, asked, args)))
    write_results(args.out, table(result), result)
    return 0
