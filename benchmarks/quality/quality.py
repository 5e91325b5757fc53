"""How much serving quantized weights changes the model, here and in llama.cpp, against fp32.

    python -m benchmarks quality [--out DIR] [--systems this-q4_1,llama-cpp-q4_1,...]

The reference is the default model's weights in fp32 (transformers). Each system reads the same
token ids (the chat template rendered once) and is measured three ways:
- next-token agreement: fp32 answers each prompt greedily; the system reads that answer
  (teacher forcing), and we count how often its likeliest next token is fp32's;
- NLL: its mean negative log-likelihood per token of a fixed text (FIXED_TEXT; lower is better);
- identical answers: its own greedy answers (up to --tokens, ending at an end-of-sequence token)
  equal to fp32's, out of len(PROMPTS).

Systems: `this-q4_1` (this service's int4 kernels on the model as `make model` exports it, the
Q4_1 GGUF's weights), `this-q4_0` (the same, loaded from llama-quantize's Q4_0 GGUF),
`llama-cpp-q4_1` and `llama-cpp-q4_0` (llama.cpp on those two GGUF files, through its own
Python bindings, its CPU backend repacking what it repacks, as its server does). With
`--systems this-quant-q8_0,llama-cpp-q8_0,this-quant-q4_0`: the fp32 folder quantized at load
(`quant`), and llama-quantize's Q8_0 of the same weights. llama.cpp's systems need `make llama-cpp`.
"""
import argparse
import json
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Protocol

import torch

from contract import EngineConfig
from engine.model.loader import LoadedModel, load_model
from testing.native_reference import as_the_engine_computes

from ..harness.report import _git, machine_info
from ..harness.systems import gguf_of
from ..peers.llama_cpp import bindings, q4_0_of, requantized

PROMPTS = [
    "What is the capital of France?", "Write a haiku about the sea.", "Explain photosynthesis in one sentence.",
    "List three prime numbers.", "How do I reverse a list in Python?", "What causes the seasons on Earth?",
    "Give me a synonym for 'happy'.", "Translate 'good morning' into Spanish.", "What is 12 times 7?",
    "Name a famous painting by Leonardo da Vinci.", "Why is the sky blue?", "Suggest a name for a pet cat.",
    "What is the boiling point of water in Celsius?", "Describe a rainbow to a child.",
    "What does a CPU do?", "Write one sentence about autumn.", "Who wrote Romeo and Juliet?",
    "What is the largest planet in our solar system?", "Give a tip for staying focused.",
    "What is the difference between weather and climate?", "How many legs does a spider have?",
    "Recommend a book for a long train journey.", "What is a noun?", "How do plants drink water?",
]
FIXED_TEXT = (  # plain English prose, written for this benchmark
    "The old lighthouse stood on the northern cliff for two hundred years. Every night its keeper climbed the one "
    "hundred and twelve steps to light the lamp, and every morning he wrote the weather in a leather book. Ships "
    "passing the rocks trusted the light more than their own charts. When the keeper grew old, his daughter took "
    "over the work. She painted the railings, oiled the gears of the lens, and learned to read the clouds the way "
    "her father had. In the winter storms the sea climbed the cliff and threw spray against the windows of the "
    "lamp room, but the light never went out. Years later, an engineer from the city came to install an electric "
    "lamp that would turn itself on at dusk. The daughter showed him the leather books, shelf after shelf of "
    "them, and he spent the whole afternoon reading about storms that nobody else remembered. The library in the "
    "town keeps those books today. Children visit them on school trips, and some of them still ask why anyone "
    "would climb so many steps every night. The answer is written on the first page of the first book: because "
    "somebody out there is looking for the light."
)
SYSTEMS = ("this-q4_1", "this-q4_0", "llama-cpp-q4_1", "llama-cpp-q4_0")
# the fp32 folder quantized at load (`quant`), and llama-quantize's file of the same type
QUANT_SYSTEMS = ("this-quant-q8_0", "llama-cpp-q8_0", "this-quant-q4_0")


class Scorer(Protocol):
    def logits(self, ids: list[int]) -> torch.Tensor:
        """[len(ids), vocab] fp32: the next-token logits after each prefix of ids."""

    def greedy(self, ids: list[int], tokens: int, stop: set[int]) -> list[int]:
        """Greedy continuation, up to `tokens`, ending after a token of `stop`."""


class EngineScorer:
    """A model as the engine loads it (fp32, or int4 with this service's kernels)."""

    def __init__(self, loaded: LoadedModel):
        stack = loaded.plan is not None and loaded.plan.stack is not None
        self.model = as_the_engine_computes(loaded.model, stack)  # the engine's numbers, bit for bit

    @torch.inference_mode()
    def logits(self, ids: list[int]) -> torch.Tensor:
        return self.model(torch.tensor([ids])).logits[0].float()

    @torch.inference_mode()
    def greedy(self, ids: list[int], tokens: int, stop: set[int]) -> list[int]:
        out = self.model.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False,
                                  eos_token_id=sorted(stop), pad_token_id=min(stop))
        return out[0, len(ids):].tolist()


class LlamaCppScorer:
    """llama.cpp's own evaluation of a GGUF (its bindings, every position's logits kept)."""

    def __init__(self, gguf: Path, threads: int):
        llama_cpp = bindings()
        self.llama = llama_cpp.Llama(model_path=str(gguf), n_ctx=4096, n_batch=512, n_threads=threads,
                                     n_threads_batch=threads, logits_all=True, verbose=False)

    def _eval(self, ids: list[int]) -> None:
        self.llama.reset()
        self.llama.eval(ids)

    def logits(self, ids: list[int]) -> torch.Tensor:
        self._eval(ids)
        return torch.from_numpy(self.llama.scores[:len(ids)].copy()).float()

    def greedy(self, ids: list[int], tokens: int, stop: set[int]) -> list[int]:
        self._eval(ids)
        answer: list[int] = []
        while len(answer) < tokens:
            token = int(self.llama.scores[self.llama.n_tokens - 1].argmax())
            answer.append(token)
            if token in stop:
                break
            self.llama.eval([token])
        return answer


@dataclass
class Quality:
    system: str
    next_token: float  # share of fp32's answer tokens this system would have chosen too
    nll: float  # mean NLL per token of FIXED_TEXT
    identical: int  # greedy answers identical to fp32's
    prompts: int
    first_difference: list[int]  # per prompt: the first token where its answer leaves fp32's (its length if none)
    seconds: float


def chat_ids(loaded: LoadedModel, prompt: str) -> list[int]:
    ids = loaded.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def text_nll(scorer: Scorer, ids: list[int]) -> float:
    logits = scorer.logits(ids)
    return float(torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:])))


@dataclass
class Reference:
    prompts: list[list[int]]
    answers: list[list[int]]
    text: list[int]
    stop: set[int]
    nll: float


def reference(loaded: LoadedModel, tokens: int) -> Reference:
    fp32 = EngineScorer(loaded)
    eos = loaded.model.generation_config.eos_token_id
    stop = set(eos if isinstance(eos, list) else [eos])
    prompts = [chat_ids(loaded, p) for p in PROMPTS]
    text = loaded.tokenizer(FIXED_TEXT)["input_ids"]
    return Reference(prompts, [fp32.greedy(ids, tokens, stop) for ids in prompts], text, stop, text_nll(fp32, text))


def measure(name: str, scorer: Scorer, ref: Reference, tokens: int) -> Quality:
    started = time.perf_counter()
    agree = total = identical = 0
    firsts = []
    for ids, answer in zip(ref.prompts, ref.answers, strict=True):
        chosen = scorer.logits(ids + answer)[len(ids) - 1:-1].argmax(-1)
        agree += int((chosen == torch.tensor(answer)).sum())
        total += len(answer)
        mine = scorer.greedy(ids, tokens, ref.stop)
        identical += mine == answer
        firsts.append(next((i for i, (a, b) in enumerate(zip(answer, mine, strict=False)) if a != b),
                           min(len(answer), len(mine))))
    return Quality(name, round(agree / total, 4), round(text_nll(scorer, ref.text), 4), identical, len(ref.prompts),
                   firsts, round(time.perf_counter() - started, 1))


def scorers(model: Path, threads: int) -> dict[str, Callable[[], Scorer]]:
    q4_1 = gguf_of(model)
    return {"this-q4_1": lambda: EngineScorer(load_model(EngineConfig(model=str(model)))),
            "this-q4_0": lambda: EngineScorer(load_model(EngineConfig(model=str(q4_0_of(q4_1))))),
            "llama-cpp-q4_1": lambda: LlamaCppScorer(q4_1, threads),
            "llama-cpp-q4_0": lambda: LlamaCppScorer(q4_0_of(q4_1), threads),
            "this-quant-q8_0": lambda: EngineScorer(load_model(EngineConfig(model=str(model), quant="q8_0"))),
            "this-quant-q4_0": lambda: EngineScorer(load_model(EngineConfig(model=str(model), quant="q4_0"))),
            "llama-cpp-q8_0": lambda: LlamaCppScorer(requantized(q4_1, "Q8_0"), threads)}


def markdown(result: dict) -> str:
    lines = ["# Accuracy beside speed: quantized weights against fp32", "",
             f"{result['date']}, git {result['git']}, `{result['command']}`", "",
             f"Model {result['model']}; fp32 (transformers) is the reference. Next-token agreement: on fp32's "
             f"greedy answers to {len(PROMPTS)} chat prompts (up to {result['tokens']} tokens each), teacher-forced. "
             f"NLL: mean per token of a fixed {len(result['text_tokens'])}-token text (fp32's own: "
             f"{result['reference_nll']}). Identical: greedy answers equal to fp32's.", "",
             "| system | next-token agreement | NLL (fixed text) | identical answers | first difference (median) |",
             "|---|---|---|---|---|"]
    for q in result["systems"]:
        lines.append(f"| {q['system']} | {q['next_token']:.1%} | {q['nll']} | {q['identical']}/{q['prompts']} | "
                     f"{statistics.median(q['first_difference'])} |")
    if result["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks quality", description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=Path("models/SmolLM2-135M-Instruct"))
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"of {','.join(SYSTEMS + QUANT_SYSTEMS)}")
    parser.add_argument("--tokens", type=int, default=48, help="greedy answer length, at most")
    parser.add_argument("--out", type=Path, default=None, help="write results.json and results.md here")
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    loaded = load_model(EngineConfig(model=str(args.model), dtype="fp32", kv_cache_dtype="fp32"))
    ref = reference(loaded, args.tokens)
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git": _git(), "command": "python -m benchmarks quality "
              + shlex.join(argv if argv is not None else sys.argv[1:]), "machine": machine_info(), "model": args.model.name,
        "tokens": args.tokens, "text_tokens": ref.text, "reference_nll": round(ref.nll, 4), "systems": [], "notes": []}
    makers = scorers(args.model, threads)
    for name in args.systems.split(","):
        try:
            quality = measure(name, makers[name](), ref, args.tokens)
        except Exception as exc:  # noqa: BLE001 - a system that cannot run is a note
            result["notes"].append(f"{name} failed: {str(exc)[:300]}")
            print(f"{name} FAILED: {exc}", flush=True)
            continue
        result["systems"].append(asdict(quality))
        print(f"{name}: next-token agreement {quality.next_token:.1%}, NLL {quality.nll} (fp32 {ref.nll:.4f}), "
              f"identical {quality.identical}/{quality.prompts}", flush=True)
    text = markdown(result)
    print("\n" + text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
        (args.out / "results.md").write_text(text)

