"""Small models built locally in seconds: no machine here can reach a model hub.

Two tokenizer styles, so the engine meets both kinds of detokenization trouble:
byte-level BPE (GPT-2: multi-byte characters split into byte tokens) and
SentencePiece/Metaspace with byte fallback (Llama: '▁' spaces, <0xNN> tokens).
Weights are random; `size='gpt2-small'` has GPT-2 small's shape for real compute.
"""
import argparse
import json
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

_WORDS = ("the quick brown fox jumps over a lazy dog while streams of tokens flow through "
          "batched decode steps and every client reads its own answer one piece at a time "
          "naïve café résumé über straße 東京 日本語 テキスト 中文 字符 language model service").split()


def corpus(n_lines: int = 2000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = rng.choices(_WORDS, k=rng.randint(4, 16))
        lines.append(" ".join(words) + rng.choice([".", "!", "?", ",", ""]))
    return lines


def _train(pre_tokenizer, vocab_size: int, specials: list[str], **kw) -> tuple[dict, list]:
    tok = Tokenizer(models.BPE(unk_token=kw.pop("unk", None)))
    tok.pre_tokenizer = pre_tokenizer
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=vocab_size,
                                                          special_tokens=specials, **kw))
    state = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    return state["vocab"], merges


def _pad_vocab(vocab: dict[str, int], target: int, space: str) -> dict[str, int]:
    """Unreachable filler words, so a model can have a real-size vocabulary and output layer."""
    rng = random.Random(1)
    while len(vocab) < target:
        word = space + "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 8)))
        vocab.setdefault(word, len(vocab))
    return vocab


# a chat template that leaves a think block open, as reasoning models' do (Qwen3, DeepSeek-R1)
THINKING_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                     "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}")


def bpe_tokenizer(pad_to: int = 0) -> PreTrainedTokenizerFast:
    vocab, merges = _train(pre_tokenizers.ByteLevel(add_prefix_space=False), 2000, ["<|endoftext|>"],
                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab=_pad_vocab(dict(vocab), pad_to, "Ġ"), merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                   eos_token="<|endoftext|>", unk_token="<|endoftext|>",
                                   clean_up_tokenization_spaces=False)


def llama_tokenizer(pad_to: int = 0) -> PreTrainedTokenizerFast:
    """Metaspace + byte fallback, with Llama's decoder chain; emoji are not in the corpus."""
    specials = ["<unk>", "<s>", "</s>"]
    learned, merges = _train(pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first"),
                             1800, specials, unk="<unk>")
    vocab = {t: i for i, t in enumerate(specials + [f"<0x{i:02X}>" for i in range(256)])}
    for token, _ in sorted(learned.items(), key=lambda kv: kv[1]):
        vocab.setdefault(token, len(vocab))
    tok = Tokenizer(models.BPE(vocab=_pad_vocab(vocab, pad_to, "▁"), merges=merges,
                               unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(specials)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", clean_up_tokenization_spaces=False)


# size: (layers, width, heads, context). 'slow' is GPT-2 small's shape with the tiny
# vocabulary: tens of ms per token on 2 CPU cores, so tests can cancel a generation
# that is surely still running.
# today's small architectures, tiny: each one's own features (QKV bias, q/k norms, Gemma's norms,
# GeGLU and scaled embeddings, Gemma 2's softcapping, sliding-window layers, Phi-3's fused projections,
# tied outputs)
ARCHITECTURES = {
    "qwen2": {},
    "qwen3": {"head_dim": 16},
    "mistral": {"sliding_window": 8},
    "phi3": {},
    "gemma3_text": {"head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 16},
    # caps low enough to bend these random weights' scores and logits (Gemma 2's own are 50 and 30)
    "gemma2": {"head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 16, "attn_logit_softcapping": 4.0,
               "final_logit_softcapping": 8.0},
}

# 'medium' is a llama a stream of which lasts a second or two: long enough to kill its replica midway.
SIZES = {"tiny": (2, 64, 4, 512), "medium": (4, 256, 4, 1024), "slow": (12, 768, 12, 1024),
         "gpt2-small": (12, 768, 12, 1024)}


def build(path: str | Path, style: str = "gpt2", size: str = "tiny", seed: int = 0, four_bit: bool = False,
          integer_weights: bool = False, thinking: bool = False) -> Path:
    """Write a tokenizer and a randomly initialised model to `path`; return it. `four_bit`: its
    Linear layers' weights snapped to 4-bit groups (a Q4_1 GGUF's shape), so that the engine runs
    them as int4 with the C kernels, where every number is batch- and history-invariant.
    `integer_weights`: drawn from integers (`_integer_init`), so that every CPU builds the very
    same model, as a golden file needs (PyTorch's normal draws round by its vector width).
    `thinking`: a reasoning model's shape: `<think>` and `</think>` tokens, and a chat template
    that opens a think block (THINKING_TEMPLATE)."""
    path = Path(path)
    torch.manual_seed(seed)
    if size not in SIZES:
        raise ValueError(f"size: expected one of {sorted(SIZES)}, got {size!r}")
    big = size == "gpt2-small"
    pad_to = 50257 if big else 0  # GPT-2 small's vocabulary, so the output layer costs what it does
    tokenizer = bpe_tokenizer(pad_to) if style == "gpt2" else llama_tokenizer(pad_to)
    if thinking:
        tokenizer.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
        tokenizer.chat_template = THINKING_TEMPLATE
    n_vocab = len(tokenizer)
    layers, width, heads, context = SIZES[size]
    if style == "gpt2":
        config = GPT2Config(vocab_size=n_vocab, n_positions=context, n_embd=width, n_layer=layers,
                            n_head=heads, bos_token_id=tokenizer.bos_token_id,
                            eos_token_id=tokenizer.eos_token_id, initializer_range=0.02 if big else 0.2)
        model = GPT2LMHeadModel(config)
    elif style == "llama":
        config = LlamaConfig(vocab_size=n_vocab, hidden_size=width, intermediate_size=4 * width,
                             num_hidden_layers=layers, num_attention_heads=heads,
                             num_key_value_heads=heads if big else heads // 2,
                             max_position_embeddings=context,
                             bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                             initializer_range=0.2 if not big else 0.02, tie_word_embeddings=False)
        model = LlamaForCausalLM(config)
    elif style in ARCHITECTURES:
        # the vocabulary padded to whole groups of 16 outputs, as real models' are, so that the int8
        # output layer runs in the C kernel (PyTorch's rounds the logits to bf16)
        config = AutoConfig.for_model(style, vocab_size=-(-n_vocab // 16) * 16, hidden_size=width, intermediate_size=4 * width,
                                      num_hidden_layers=layers, num_attention_heads=heads,
                                      num_key_value_heads=heads // 2, max_position_embeddings=context,
                                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                      pad_token_id=tokenizer.eos_token_id, initializer_range=0.2,
                                      **ARCHITECTURES[style])
        model = AutoModelForCausalLM.from_config(config)
    else:
        raise ValueError(f"style: expected 'gpt2', 'llama' or one of {sorted(ARCHITECTURES)}, got {style!r}")
    model.generation_config.pad_token_id = tokenizer.eos_token_id
    if integer_weights:
        _integer_init(model, seed)
    if four_bit:
        _snap_to_four_bits(model)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def smol_shaped(path: str | Path, tokenizer_source: str, seed: int = 0) -> Path:
    """A small random Llama over another model's tokenizer (the default model's: SmolLM2's, a
    byte-level BPE that llama.cpp knows), as bf16 safetensors, as Hugging Face publishes models; its
    embeddings tied to the output layer, as SmolLM2's."""
    import shutil
    path = Path(path)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (Path(tokenizer_source) / name).exists():
            shutil.copy(Path(tokenizer_source) / name, path / name)
    return path


def _integer_init(model: torch.nn.Module, seed: int) -> None:
    """Every weight k / 2^17 for an integer k drawn uniformly from [-2^15, 2^15) (within +-0.25),
    norms' weights 1 and biases 0: the same values on every CPU."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            if name.endswith("bias"):
                parameter.zero_()
            elif "norm" in name or "ln_" in name:
                parameter.fill_(1.0)
            else:
                draws = torch.randint(-2 ** 15, 2 ** 15, parameter.shape, generator=generator)
                parameter.copy_(draws.to(parameter.dtype) / 2 ** 17)


def _snap_to_four_bits(model: torch.nn.Module) -> None:
    from engine.model.int4 import _quantize, dequantize
    head = model.get_output_embeddings()
    with torch.no_grad():
        for module in model.modules():
            if type(module) is torch.nn.Linear and module is not head:
                steps, scale, low, _ = _quantize(module.weight.detach())
                module.weight.data = dequantize(steps, scale, low)


def main() -> None:
    parser = argparse.ArgumentParser(description="Build a small random-weight model locally.")
    parser.add_argument("path")
    parser.add_argument("--style", choices=["gpt2", "llama", *ARCHITECTURES], default="gpt2")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    args = parser.parse_args()
    print(build(args.path, args.style, args.size))


if __name__ == "__main__":
    main()
