"""A Hugging Face folder written as a GGUF file that llama.cpp's server and Ollama load: the
quantized blocks that this service serves the folder from (quantize_on_load.py), the architecture's
metadata, the tokenizer and the chat template, as llama.cpp's `convert_hf_to_gguf.py` writes them.

Why: a user who quantized a folder here may want the same file in llama.cpp or Ollama, without
their converter and `llama-quantize`. The blocks come from the quantization cache, so the file
holds exactly what this service serves, and this service serves the file with the same bits as
the folder.

What is written, and why that way:
- Architectures: Llama's family (llama, mistral) and Qwen2. llama.cpp computes Llama's rotary
  embedding on its own row order, so the q and k rows are permuted as its converter permutes them.
  The blocks are whole rows, so their rows move as they are.
- Tokenizer: byte-level BPE (GPT-2's kind, as Llama 3, Qwen 2.5 and SmolLM2 have). llama.cpp picks
  the pre-tokenizer's rules by a name. The converter finds that name by hashing the tokens of one
  test text, and `PRE_TOKENIZERS` keeps its hashes for the families written here. A tokenizer
  outside them is refused, naming it: a wrong pre-tokenizer would split text differently.
- Llama 3.1's and 3.2's rotary scaling (`llama3`) is written as llama.cpp's converter writes it:
  a `rope_freqs` tensor of one factor per frequency. Other scalings are refused at once, naming
  the config field, instead of written wrong.
"""
import hashlib
import json
import logging
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType, LlamaFileType
from transformers import AutoConfig, AutoTokenizer

from . import quant_cache, quantize_on_load

log = logging.getLogger(__name__)

# model_type -> (llama.cpp's architecture, whether its q and k rows are permuted)
ARCHITECTURES = {"llama": (gguf.MODEL_ARCH.LLAMA, True), "mistral": (gguf.MODEL_ARCH.LLAMA, True),
                 "qwen2": (gguf.MODEL_ARCH.QWEN2, False)}
FILE_TYPES = {"q8_0": LlamaFileType.MOSTLY_Q8_0, "q4_k_m": LlamaFileType.MOSTLY_Q4_K_M, "q4_0": LlamaFileType.MOSTLY_Q4_0,
              "q4_1": LlamaFileType.MOSTLY_Q4_1, "q5_0": LlamaFileType.MOSTLY_Q5_0}  # each quant scheme's
# llama.cpp's converter's test text (convert_hf_to_gguf.py, get_vocab_base_pre), whose tokens' hash names the
# pre-tokenizer; and those hashes, for the families written here
CHECK_TEXT = ('\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) '
              '✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ '
              '------======= нещо на Български \'\'\'\'\'\'```````""""......!!!!!!?????? I\'ve been \'told he\'s there, '
              '\'RE you sure? \'M not sure I\'ll make it, \'D you like some tea? We\'Ve a\'lL')
PRE_TOKENIZERS = {
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",  # HuggingFaceTB/SmolLM-135M
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # meta-llama/Meta-Llama-3-8B
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen/Qwen1.5-7B
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",  # Qwen/Qwen3-Embedding-0.6B
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",  # openai-community/gpt2
}


def write(source: str, out: Path, scheme: str, trust_remote_code: bool = False) -> Path:
    """Write the folder `source` as a GGUF file of `scheme`'s blocks (quant_mix.SCHEMES) at `out`
    (whole or not at all)."""
    folder = Path(source)
    config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    arch, permuted = _architecture(config)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    pre = _pre_tokenizer(tokenizer)
    cache = quant_cache.root()
    with tempfile.TemporaryDirectory() as spare:
        index = quantize_on_load.blocks(source, scheme, trust_remote_code, cache or Path(spare))
        partial = out.with_name(out.name + ".partial")
        writer = gguf.GGUFWriter(str(partial), gguf.MODEL_ARCH_NAMES[arch])
        _metadata(writer, config, folder.name, scheme)
        _vocabulary(writer, folder, tokenizer, pre, config.vocab_size)
        names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
        for name, kind, data in _tensors(index, config, permuted):
            base, _, suffix = name.rpartition(".")
            mapped = names.get_name(base)
            if mapped is None:
                raise ValueError(f"{name}: llama.cpp's {gguf.MODEL_ARCH_NAMES[arch]} has no such tensor")
            writer.add_tensor(f"{mapped}.{suffix}", data, raw_dtype=kind)
        factors = _rope_factors(config)
        if factors is not None:
            writer.add_tensor("rope_freqs.weight", factors, raw_dtype=GGMLQuantizationType.F32)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    partial.replace(out)
    log.info("%s: written as %s (%s, %.2f GB)", folder.name, out, scheme, out.stat().st_size / 1e9)
    return out


def _architecture(config: Any) -> tuple[gguf.MODEL_ARCH, bool]:
    if config.model_type not in ARCHITECTURES:
        raise ValueError(f"model_type {config.model_type!r}: GGUF files are written for {', '.join(ARCHITECTURES)}; "
                         f"convert others with llama.cpp's convert_hf_to_gguf.py")
    rope = _rope(config)
    if (rope.get("rope_type") or rope.get("type")) not in (None, "default", "llama3"):
        raise ValueError(f"rope_parameters {rope!r}: this rotary scaling is not written here yet; convert with "
                         f"llama.cpp's convert_hf_to_gguf.py")
    return ARCHITECTURES[config.model_type]


def _rope(config: Any) -> dict[str, Any]:
    """The rotary embedding's parameters: transformers' `rope_parameters` (older configs: `rope_theta`
    and `rope_scaling`)."""
    rope = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    if "rope_theta" not in rope and getattr(config, "rope_theta", None) is not None:
        rope["rope_theta"] = config.rope_theta
    return rope


def _rope_factors(config: Any) -> np.ndarray | None:
    """Llama 3's rotary scaling as llama.cpp holds it: one factor per frequency (the converter's
    `generate_extra_tensors`, computed as it computes them); None for no scaling."""
    rope = _rope(config)
    if (rope.get("rope_type") or rope.get("type")) != "llama3":
        return None
    base = rope.get("rope_theta", 10000.0)
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    frequencies = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    context = rope.get("original_max_position_embeddings", 8192)
    factors = []
    for frequency in frequencies:
        wavelength = 2 * math.pi / frequency
        if wavelength < context / high:
            factors.append(1)
        elif wavelength > context / low:
            factors.append(factor)
        else:
            smooth = (context / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(factors, dtype=torch.float32).numpy()


def _pre_tokenizer(tokenizer: Any) -> str:
    digest = hashlib.sha256(str(tokenizer.encode(CHECK_TEXT)).encode()).hexdigest()
    if digest not in PRE_TOKENIZERS:
        raise ValueError(f"tokenizer {type(tokenizer).__name__}: its pre-tokenizer is none of llama.cpp's that are "
                         f"written here ({', '.join(sorted(set(PRE_TOKENIZERS.values())))}); convert with "
                         f"llama.cpp's convert_hf_to_gguf.py")
    return PRE_TOKENIZERS[digest]


def _metadata(writer: gguf.GGUFWriter, config: Any, name: str, scheme: str) -> None:
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    writer.add_name(name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(getattr(config, "num_key_value_heads", None) or heads)
    if head_dim != config.hidden_size // heads:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(_rope(config).get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(FILE_TYPES[scheme])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _vocabulary(writer: gguf.GGUFWriter, folder: Path, tokenizer: Any, pre: str, size: int) -> None:
    """The tokens, their types, merges, special tokens and chat template, as the converter's
    `_set_vocab_gpt2` writes them."""
    by_id = {i: token for token, i in tokenizer.get_vocab().items()}
    added = tokenizer.get_added_vocab()
    decoders = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(size):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        if token in added:
            if not decoders[i].normalized:  # llama.cpp takes added tokens as normalized already
                token = tokenizer.decode(tokenizer.encode(token, add_special_tokens=False))
            special = decoders[i].special or (token.startswith("<|") and token.endswith("|>"))
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(token)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = gguf.SpecialVocab(folder, load_merges=True, n_vocab=size)
    template = folder / "chat_template.jinja"  # transformers' own file for it, which SpecialVocab does not read
    if special.chat_template is None and template.exists():
        special.chat_template = template.read_text()
    # whether a BOS token starts every text: as the tokenizer itself does it
    special.add_special_token["bos"] = tokenizer.bos_token_id is not None and \
        tokenizer("a")["input_ids"][:1] == [tokenizer.bos_token_id]
    special.add_to_gguf(writer, quiet=True)


def _tensors(index: dict[str, Any], config: Any, permuted: bool) -> Iterator[tuple[str, GGMLQuantizationType, np.ndarray]]:
    """The entry's tensors as GGUF holds them: q and k rows in llama.cpp's order where it permutes them."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    for stored in quant_cache.read(index):
        data = np.asarray(stored.data)
        if permuted and stored.name.endswith(("q_proj.weight", "k_proj.weight")):
            data = _permute(data, heads if stored.name.endswith("q_proj.weight") else kv_heads)
        kind = GGMLQuantizationType.F32 if stored.kind == "F32" else GGMLQuantizationType[stored.kind]
        yield stored.name, kind, data


def _permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's rotary pairs from halves to neighbours."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m engine.quantize",
                                description="Write a Hugging Face folder as a GGUF file of quantized blocks.")
    p.add_argument("model", help="a folder with config.json, safetensors weights and tokenizer")
    p.add_argument("out", type=Path, help="the .gguf file to write")
    p.add_argument("--type", default="q8_0", choices=list(FILE_TYPES))
    p.add_argument("--trust-remote-code", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    write(args.model, args.out, args.type, args.trust_remote_code)
    print(json.dumps({"written": str(args.out), "type": args.type, "bytes": args.out.stat().st_size}))
    return 0
