"""`python -m engine.quantize`: a Hugging Face folder written as a GGUF file of the blocks this
service serves it from, with llama.cpp's metadata, tokenizer and chat template."""
import json
import os
import shutil
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFReader

from contract import EngineConfig
from engine.model import gguf_file, gguf_native
from engine.model.loader import load_model
from engine.model.to_gguf import write
from testing.procs import ServerProcess, free_port
from testing.toy_models import build

pytestmark = pytest.mark.skipif(not gguf_native.servable(), reason="the C kernels are not built here")

ROOT = Path(__file__).resolve().parents[2]
LLAMA_SERVER = ROOT / "benchmarks" / ".llama.cpp" / "llama-server"  # `make llama-cpp` builds it


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LLM_QUANT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_file_holds_llamas_names_metadata_and_tokenizer(bf16_smol, cache, tmp_path):
    out = write(bf16_smol, tmp_path / "m.gguf", "q8_0")
    reader = GGUFReader(out)
    fields = {name: field.contents() for name, field in reader.fields.items()
              if name.startswith(("general.architecture", "llama.", "tokenizer.ggml.pre", "tokenizer.ggml.model",
                                  "tokenizer.chat_template", "general.file_type"))}
    assert fields["general.architecture"] == "llama" and fields["tokenizer.ggml.model"] == "gpt2"
    assert fields["tokenizer.ggml.pre"] == "smollm" and fields["general.file_type"] == 7  # MOSTLY_Q8_0
    assert fields["llama.block_count"] == 2 and fields["llama.attention.head_count_kv"] == 2
    assert fields["llama.rope.freq_base"] == 100000.0
    assert "im_start" in fields["tokenizer.chat_template"]
    tensors = {t.name: t.tensor_type.name for t in reader.tensors}
    assert tensors["token_embd.weight"] == "Q8_0" and "output.weight" not in tensors  # tied
    assert tensors["blk.1.attn_q.weight"] == "Q8_0" and tensors["blk.1.attn_norm.weight"] == "F32"
    assert len(tensors) == 1 + 2 * 9 + 1


def test_this_service_serves_the_file_with_the_bits_it_serves_the_folder_with(bf16_smol, cache, tmp_path):
    """The q and k rows go into llama.cpp's order in the file and come back out of it on load."""
    out = write(bf16_smol, tmp_path / "m.gguf", "q8_0")
    folder, file = load_model(EngineConfig(model=bf16_smol)), load_model(EngineConfig(model=str(out)))
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314, 2]])
    with torch.no_grad():
        assert torch.equal(folder.model(ids).logits, file.model(ids).logits)
    header = gguf_file.read(out)
    assert {t.name for t in header.tensors if t.tensor_type.name == "Q8_0"} >= {"blk.0.attn_q.weight", "blk.0.attn_k.weight"}


def test_llama_3s_rotary_scaling_goes_into_the_file_and_comes_out_of_it(bf16_smol, cache, tmp_path):
    """Llama 3.1's and 3.2's `llama3` rotary scaling: the file holds its factors as llama.cpp's
    converter writes them (`rope_freqs`), and this service serving the file turns queries and keys
    by the scaled angles, as transformers does for the folder (within float rounding: the two
    compute the frequencies in other orders)."""
    scaled = tmp_path / "scaled"
    shutil.copytree(bf16_smol, scaled, ignore=shutil.ignore_patterns(".built"))
    config = json.loads((scaled / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 100000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    (scaled / "config.json").write_text(json.dumps(config))
    out = write(str(scaled), tmp_path / "scaled.gguf", "q8_0")
    factors = next(t for t in gguf_file.read(out).tensors if t.name == "rope_freqs.weight")
    assert factors.tensor_type.name == "F32" and 1.0 < float(np.asarray(factors.data).max()) <= 8.0
    folder, file = load_model(EngineConfig(model=str(scaled))), load_model(EngineConfig(model=str(out)))
    unscaled = load_model(EngineConfig(model=bf16_smol))  # the same weights, turned by unscaled angles
    positions = torch.arange(200)[None]
    ids = torch.randint(3, 1000, (1, 200), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs, plain = (m.model(ids, position_ids=positions).logits for m in (file, folder, unscaled))
    assert torch.allclose(ours, theirs, atol=1e-3), (ours - theirs).abs().max()
    assert not torch.allclose(ours, plain, atol=1e-3)


def test_what_llama_cpp_would_read_wrong_is_refused_naming_it(real_model, llama_model, gpt2_model, cache, tmp_path):
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        write(gpt2_model, tmp_path / "a.gguf", "q8_0")
    with pytest.raises(ValueError, match="its pre-tokenizer is none of llama.cpp's"):
        write(llama_model, tmp_path / "b.gguf", "q8_0")  # a toy tokenizer of its own
    scaled = tmp_path / "scaled"
    shutil.copytree(build(tmp_path / "toy", "llama"), scaled)
    config = json.loads((scaled / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}
    (scaled / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="this rotary scaling is not written here yet"):
        write(str(scaled), tmp_path / "c.gguf", "q8_0")
    assert not list(tmp_path.glob("*.gguf*"))


@pytest.mark.skipif(not LLAMA_SERVER.exists(), reason="llama.cpp's server is not built (make llama-cpp)")
def test_llama_cpps_server_loads_the_file_and_answers(bf16_smol, cache, tmp_path):
    out = write(bf16_smol, tmp_path / "m.gguf", "q8_0")
    port = free_port()
    server = ServerProcess([str(LLAMA_SERVER), "-m", str(out), "--port", str(port), "-t", "2", "-c", "256"],
                           tmp_path / "llama-server.log", {**os.environ, "LD_LIBRARY_PATH": str(LLAMA_SERVER.parent)})
    try:
        server.wait_http(f"http://127.0.0.1:{port}/health", timeout=60, success_only=True)
        body = json.dumps({"prompt": "the quick brown fox", "max_tokens": 8, "temperature": 0}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.load(response)
        assert answer["usage"]["completion_tokens"] == 8 and answer["choices"][0]["text"]
    finally:
        server.stop()
