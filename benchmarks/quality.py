"""How much a serving dtype changes the model: greedy answers against fp32's.

    python -m benchmarks.quality [--dtype int4] [--model models/SmolLM2-135M-Instruct]

For each chat prompt, fp32 answers greedily; the other dtype then reads fp32's answer
(teacher forcing) and we count how often its next-token choice agrees, and its mean negative
log-likelihood of fp32's tokens. Its own greedy answers are compared too: identical, or where
they first differ.
"""
import argparse
import statistics
from dataclasses import dataclass

import torch

from contract import EngineConfig
from engine.model.loader import LoadedModel, load_model

PROMPTS = [
    "What is the capital of France?", "Write a haiku about the sea.", "Explain photosynthesis in one sentence.",
    "List three prime numbers.", "How do I reverse a list in Python?", "What causes the seasons on Earth?",
    "Give me a synonym for 'happy'.", "Translate 'good morning' into Spanish.", "What is 12 times 7?",
    "Name a famous painting by Leonardo da Vinci.", "Why is the sky blue?", "Suggest a name for a pet cat.",
    "What is the boiling point of water in Celsius?", "Describe a rainbow to a child.",
    "What does a CPU do?", "Write one sentence about autumn.", "Who wrote Romeo and Juliet?",
    "What is the largest planet in our solar system?", "Give a tip for staying focused.",
    "What is the difference between weather and climate?",
]


@dataclass
class Agreement:
    next_token: float  # share of fp32's answer tokens the dtype would have chosen too
    nll: float  # mean negative log-likelihood of fp32's answer tokens under the dtype
    reference_nll: float  # the same under fp32 itself
    identical: int  # greedy answers identical to fp32's
    first_difference: list[int]  # per prompt: index of the first differing token (len when none)


def chat_ids(loaded: LoadedModel, prompt: str) -> torch.Tensor:
    ids = loaded.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    return torch.tensor([ids])


@torch.inference_mode()
def greedy(loaded: LoadedModel, ids: torch.Tensor, tokens: int) -> list[int]:
    out = loaded.model.generate(ids, max_new_tokens=tokens, do_sample=False, pad_token_id=loaded.tokenizer.eos_token_id)
    return out[0, ids.shape[1]:].tolist()


@torch.inference_mode()
def answer_logits(loaded: LoadedModel, ids: torch.Tensor, answer: list[int]) -> torch.Tensor:
    """Next-token logits at each of the answer's positions, the answer fed in (teacher forcing)."""
    return loaded.model(torch.cat([ids, torch.tensor([answer])], dim=1)).logits[0, ids.shape[1] - 1:-1].float()


@torch.inference_mode()
def compare(reference: LoadedModel, other: LoadedModel, tokens: int = 48) -> Agreement:
    agree, total, nlls, ref_nlls, identical, firsts = 0, 0, [], [], 0, []
    for prompt in PROMPTS:
        ids = chat_ids(reference, prompt)
        answer = greedy(reference, ids, tokens)
        target = torch.tensor(answer)
        logits = answer_logits(other, ids, answer)
        agree += int((logits.argmax(-1) == target).sum())
        total += len(answer)
        nlls.append(float(torch.nn.functional.cross_entropy(logits, target)))
        ref_nlls.append(float(torch.nn.functional.cross_entropy(answer_logits(reference, ids, answer), target)))
        mine = greedy(other, ids, tokens)
        first = next((i for i, (a, b) in enumerate(zip(answer, mine, strict=False)) if a != b),
                     min(len(answer), len(mine)))
        identical += mine == answer
        firsts.append(first)
    return Agreement(round(agree / total, 4), round(statistics.mean(nlls), 4), round(statistics.mean(ref_nlls), 4),
                     identical, firsts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="models/SmolLM2-135M-Instruct")
    parser.add_argument("--dtype", default="int4")
    args = parser.parse_args()
    reference = load_model(EngineConfig(model=args.model, dtype="fp32"))
    other = load_model(EngineConfig(model=args.model, dtype=args.dtype))
    result = compare(reference, other)
    print(f"fp32 against itself: NLL {result.reference_nll}")
    print(f"{other.info.dtype} against fp32 over {len(PROMPTS)} prompts: next-token agreement {result.next_token:.1%}, "
          f"NLL {result.nll}, identical greedy answers {result.identical}/{len(PROMPTS)}, "
          f"first difference at token {sorted(result.first_difference)}")


if __name__ == "__main__":
    main()
