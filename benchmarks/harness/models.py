"""The benchmark's models: random-weight ones built into a cache folder on first use, and the
service's trained default model (`make model` exports it)."""
import shutil
from pathlib import Path

import torch

from testing.toy_models import build, llama_tokenizer

from .. import HERE

MODELS = {
    "tiny": "tiny GPT-2 (2 layers, 64 wide, 2000 vocab): serving overhead dominates",
    "gpt2-small": "GPT-2 124M shape (12 layers, 768 wide, 50257 vocab), random weights",
    "llama-1b": "1.1B Llama (TinyLlama shape: 22 layers, 2048 wide, GQA 32/4 heads), bf16, for a GPU",
    "smollm2": "SmolLM2-135M-Instruct, the trained default model (30 layers, 576 wide, 49152 vocab)",
}
DEFAULT_CACHE = HERE / ".models"
TRAINED = {"smollm2": HERE.parent / "models" / "SmolLM2-135M-Instruct"}


def ensure_model(name: str, cache: Path = DEFAULT_CACHE) -> Path:
    """Path of a ready model folder; built (atomically, via a temporary folder) when missing."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    if name in TRAINED:
        if not (TRAINED[name] / "config.json").exists():
            raise FileNotFoundError(f"{TRAINED[name]} is missing: run `make model` first")
        return TRAINED[name]
    path = cache / name
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return path
    tmp = cache / f".{name}.building"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if name == "llama-1b":
        _build_llama_1b(tmp)
    else:
        build(tmp, "gpt2", name)
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path


def _build_llama_1b(path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM
    tokenizer = llama_tokenizer(pad_to=32000)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=2048, intermediate_size=5632,
                         num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                         max_position_embeddings=2048, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False,
                         dtype="bfloat16")
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.generation_config.pad_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
