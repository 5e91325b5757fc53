"""The benchmarks' models of real sizes (benchmarks/harness/sized_models.py) and the roofline
beside their figures (benchmarks/harness/roofline.py): the shapes are the real models', the
weights the same wherever they are drawn, the special tokens never win a greedy step, and a
GGUF's step bytes are its layers' and output layer's."""
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from benchmarks.harness import roofline, sized_models
from benchmarks.harness.sized_models import SHAPES, Shape

VOCAB = 49152  # SmolLM2's tokenizer


def parameters(shape: Shape) -> int:
    names = sized_models.tensors(sized_models.config(shape, VOCAB, 1, 2))
    return sum(int(torch.Size(dims).numel()) for _, dims in names)


def test_the_1b_is_the_published_figures_model_and_the_others_their_sizes():
    assert round(parameters(SHAPES["llama-1b"]) / 1e9, 2) == 1.17
    assert round(parameters(SHAPES["llama-3b"]) / 1e9, 1) == 3.1
    assert round(parameters(SHAPES["llama-8b"]) / 1e9, 1) == 7.4  # 8.0B with Llama 3's 128K vocabulary
    qwen = sized_models.tensors(sized_models.config(SHAPES["qwen2.5-1.5b"], VOCAB, 1, 2))
    names = {name for name, _ in qwen}
    assert "model.layers.0.self_attn.q_proj.bias" in names and "lm_head.weight" not in names  # biases; tied
    assert round(parameters(SHAPES["qwen2.5-1.5b"]) / 1e9, 2) == 1.39


def test_gemma_3_1b_has_its_heads_windows_and_norms_of_one_plus_w():
    shape = SHAPES["gemma3-1b"]
    cfg = sized_models.config(shape, VOCAB, 1, 2)
    assert cfg.head_dim == 256 and cfg.sliding_window == 512 and cfg.layer_types.count("full_attention") == 4
    names = dict(sized_models.tensors(cfg))
    assert names["model.layers.0.self_attn.q_proj.weight"] == (4 * 256, 1152)  # 4 heads of 256, one kv head
    assert names["model.layers.0.self_attn.k_proj.weight"] == (256, 1152)
    assert "model.layers.0.self_attn.q_norm.weight" in names and "lm_head.weight" not in names
    assert round(parameters(shape) / 1e9, 2) == 0.75  # 1.0B with Gemma's 262K vocabulary
    norm = sized_models.draw("model.layers.0.input_layernorm.weight", (8,), [], shape.norm)
    assert not norm.any()  # Gemma scales by 1 + w: 1, as transformers initializes it


def test_weights_are_drawn_the_same_each_time_and_special_output_rows_are_zero():
    special = [0, 2, 7]
    first = sized_models.draw("lm_head.weight", (16, 8), special)
    assert first.dtype == torch.float16 and torch.equal(first, sized_models.draw("lm_head.weight", (16, 8), special))
    assert not first[special].any() and first[[1, 3, 4]].abs().min() > 0
    other = sized_models.draw("model.layers.0.mlp.up_proj.weight", (16, 8), special)
    assert not torch.equal(other, first) and other.abs().min() > 0  # a seed per tensor; rows kept
    assert 0.015 < sized_models.draw("model.layers.1.mlp.down_proj.weight", (256, 256), []).float().std() < 0.025
    assert torch.equal(sized_models.draw("model.norm.weight", (8,), special), torch.ones(8, dtype=torch.float16))


def test_a_gguf_steps_bytes_are_its_layers_and_output_layers(tmp_path: Path):
    def write(path: Path, tied: bool) -> dict[str, int]:
        writer = gguf.GGUFWriter(str(path), "llama")
        writer.add_block_count(2)
        writer.add_embedding_length(64)
        writer.add_head_count(4)
        writer.add_head_count_kv(2)
        shapes = {"token_embd.weight": (100, 64), "blk.0.attn_q.weight": (64, 64), "blk.1.ffn_up.weight": (128, 64),
                  "output_norm.weight": (64,)}
        if not tied:
            shapes["output.weight"] = (100, 64)
        for name, shape in shapes.items():
            writer.add_tensor(name, np.ones(shape, dtype=np.float16))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return {name: 2 * int(np.prod(shape)) for name, shape in shapes.items()}

    sizes = write(tmp_path / "untied.gguf", tied=False)
    step = roofline.step_bytes(tmp_path / "untied.gguf")
    assert step.weights == sum(sizes.values()) - sizes["token_embd.weight"]  # one embedding row only
    assert step.kv_per_token == 2 * 2 * 2 * 16 * 2  # keys and values, 2 layers, 2 KV heads of 16, fp16
    tied = write(tmp_path / "tied.gguf", tied=True)
    assert roofline.step_bytes(tmp_path / "tied.gguf").weights == sum(tied.values())  # the embeddings read whole
    assert roofline.bound(1e9, step, 10) == pytest.approx(1e9 / (step.weights + 10 * step.kv_per_token))
    assert roofline.fraction(roofline.bound(1e9, step, 10) / 2, 1e9, step, 10) == pytest.approx(0.5)


def test_the_read_bandwidth_is_a_memory_rate():
    rate = roofline.read_bandwidth(size=64 << 20, threads=1, passes=2)
    assert 1e8 < rate < 1e13  # between 0.1 GB/s and 10 TB/s: bytes over seconds, not either alone


def test_the_sizes_table_gives_each_ratio_and_roofline_fraction():
    """`python -m benchmarks sizes`'s table: this / llama.cpp with their ratio in every cell, and
    one stream's share of the roofline for both, end to end and its decode alone; a size whose file
    is not made is a note."""
    from benchmarks.records import sizes
    row = {"c1_tok_s": 30.0, "c1_decode_tok_s": 36.0, "c16_tok_s": 90.0, "cold_prompt_tok_s": 300.0, "peak_rss_gb": 1.2}
    peer = {"c1_tok_s": 25.0, "c1_decode_tok_s": 32.0, "c16_tok_s": 60.0, "cold_prompt_tok_s": 200.0, "peak_rss_gb": 1.0}
    result = {"date": "2026-12-06", "git": "abc", "cpu": "a CPU, AVX2", "command": "python -m benchmarks sizes",
              "bandwidth_gb_s": 27.8, "notes": ["3b: llama-3b-Q4_K_M.gguf not made; skipped"],
              "sizes": {"1b": {"file": "llama-1b-Q4_K_M.gguf", "roofline_tok_s": 40.0, "this": row, "llama-cpp": peer}}}
    text = sizes.table(result)
    line = next(x for x in text.splitlines() if x.startswith("| 1b |"))
    assert "30.0 / 25.0 (1.20x) | 75% / 62% of 40.0" in line and "90.0 / 60.0 (1.50x)" in line
    assert "36.0 / 32.0 (1.12x) | 90% / 80% of 40.0" in line
    assert "300.0 / 200.0 (1.50x)" in line and "1.2 / 1.0 (1.20x)" in line and "not made; skipped" in text


def test_the_benchmarks_flow_listens_on_the_ports_it_is_given(tmp_path, monkeypatch):
    """flows/llm.yml names fixed ports, as `jina flow --uses flows/llm.yml` typed by hand needs:
    the benchmarks' Flow runs a copy with its free ports, as `make serve` applies LLM_GRPC_PORT and
    LLM_HTTP_PORT (a Flow started on the file itself listened on 12345 while the harness waited on
    another port)."""
    import yaml

    from benchmarks.harness import systems
    started: list[list[str]] = []

    class Started:
        def __init__(self, cmd: list[str], log: Path, env: dict) -> None:
            started.append(cmd)

        def wait_port(self, port: int, timeout: float) -> None:
            pass

        def wait_http(self, url: str) -> None:
            pass

        def stop(self) -> None:
            pass

    monkeypatch.setattr(systems, "ServerProcess", Started)
    monkeypatch.setattr(systems, "_wait_jina_ready", lambda port, server: None)
    with systems.flow_server(tmp_path / "model", tmp_path) as (grpc_port, http_port):
        flow = yaml.safe_load(Path(started[0][-1]).read_text())
    assert flow["gateway"]["port"] == [grpc_port, http_port] and started[0][-3:-1] == ["flow", "--uses"]


def test_the_sizes_rooflines_use_the_runs_highest_bandwidth_reading():
    """The bandwidth is read before the run and after each server; every size's roofline takes the
    highest reading (one low reading at the start put a decode at 120% of its roofline), and the
    table says how many readings there were and the lowest."""
    from benchmarks.records import sizes
    step = roofline.StepBytes(weights=10**9, kv_per_token=0)
    result: dict = {"date": "2026-12-07", "git": "abc", "cpu": "a CPU, AVX-512", "command": "c", "notes": [],
                    "sizes": {"1b": {"file": "f.gguf", "this": {"c1_tok_s": 40.0}, "llama-cpp": {"c1_tok_s": 30.0}}}}
    sizes.with_rooflines(result, {"1b": step}, [44e9, 51e9, 47e9])
    assert result["bandwidth_gb_s"] == 51.0 and result["sizes"]["1b"]["roofline_tok_s"] == 51.0
    assert "the highest of 3 readings" in sizes.table(result) and "the lowest 44.0" in sizes.table(result)


def test_a_folder_is_made_again_with_its_gguf_files_when_its_shape_changes(tmp_path: Path, monkeypatch):
    tiny = Shape("llama", 64, 1, 128, 4, 2, True, 10000.0, "a tiny shape")
    monkeypatch.setitem(SHAPES, "tiny", tiny)
    made = sized_models.folder("tiny", tmp_path)
    index = made / "model.safetensors.index.json"
    first = index.stat().st_mtime_ns
    assert sized_models.folder("tiny", tmp_path) == made and index.stat().st_mtime_ns == first  # kept
    stale = tmp_path / "tiny-Q4_0.gguf"
    stale.write_bytes(b"a file of the old shape")
    monkeypatch.setitem(SHAPES, "tiny", Shape("llama", 64, 2, 128, 4, 2, True, 10000.0, "one layer more"))
    sized_models.folder("tiny", tmp_path)
    assert not stale.exists()  # went with its folder
    assert "model.layers.1.mlp.up_proj.weight" in json.loads(index.read_text())["weight_map"]


def test_a_lean_gguf_keeps_only_its_file_and_its_shape_until_the_shape_changes(tmp_path: Path, monkeypatch):
    monkeypatch.setitem(SHAPES, "tiny", Shape("llama", 64, 1, 128, 4, 2, True, 10000.0, "a tiny shape"))
    made: list[str] = []

    def convert(command: list[str], **_: object) -> None:  # the converter: its --outfile written
        made.append("F16")
        Path(command[command.index("--outfile") + 1]).write_bytes(b"F16")

    def quantize(source: Path, target: Path, kind: str) -> Path:
        assert source.read_bytes() == b"F16" and not (tmp_path / "tiny").exists()  # the folder went first
        made.append(kind)
        target.write_bytes(kind.encode())
        return target

    monkeypatch.setattr(sized_models.subprocess, "run", convert)
    monkeypatch.setattr(sized_models.llama_cpp, "quantize", quantize)
    monkeypatch.setattr(sized_models.llama_cpp, "source", lambda: tmp_path)
    target = sized_models.gguf("tiny", "Q4_0", tmp_path, lean=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-Q4_0.gguf", "tiny.shape.json"]
    assert sized_models.gguf("tiny", "Q4_0", tmp_path) == target and made == ["F16", "Q4_0"]  # kept, not made again
    assert not (tmp_path / "tiny").exists()
    monkeypatch.setitem(SHAPES, "tiny", Shape("llama", 64, 2, 128, 4, 2, True, 10000.0, "one layer more"))
    sized_models.gguf("tiny", "Q4_0", tmp_path, lean=True)
    assert made == ["F16", "Q4_0", "F16", "Q4_0"]  # the old shape's file went, and was made again


def test_a_sizes_figure_is_the_median_of_its_rounds_and_none_where_a_round_has_none():
    from benchmarks.records.sizes import median_row
    rows = [{"system": "this", "c1_tok_s": 40.0, "c16_tok_s": 100.0, "warm_decode_tok_s": [1.0]},
            {"system": "this", "c1_tok_s": 50.0, "c16_tok_s": None, "warm_decode_tok_s": [2.0]},
            {"system": "this", "c1_tok_s": 70.0, "c16_tok_s": 110.0, "warm_decode_tok_s": [3.0]}]
    assert median_row(rows) == {"system": "this", "c1_tok_s": 50.0, "c16_tok_s": None, "warm_decode_tok_s": [1.0]}


def test_warm_up_decodes_until_three_rates_in_a_row_agree():
    assert not roofline.steady([50.0, 80.0])
    assert not roofline.steady([61.0, 75.0, 80.0])
    assert roofline.steady([61.0, 78.8, 79.1, 80.1])
