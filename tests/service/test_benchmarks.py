"""The benchmark harness's logic with fake transports: counts and formulas, no timing, and no servers
but a busy-loop process for `settle`."""
import asyncio
import json
import sys

from benchmarks.harness.load import closed_loop, make_prompts, poisson
from benchmarks.harness.metrics import RequestRecord, Total, summarize
from benchmarks.harness.report import markdown, plot, ratios
from testing.procs import ServerProcess, settle


def test_prompts_are_deterministic_and_of_mixed_length():
    a, b = make_prompts(20, seed=3), make_prompts(20, seed=3)
    assert a == b and a != make_prompts(20, seed=4)
    levels = [make_prompts(20, seed=3, draw=d) for d in ("closed 1", "closed 16", "warm-up")]
    assert levels[0] == make_prompts(20, seed=3, draw="closed 1")
    assert not set(levels[0]) & set(levels[1]) and not set(levels[1]) & set(levels[2])  # no prompt seen twice
    assert len({len(p.split()) for p in a}) > 5


def _record(start, arrivals, counts, end):
    r = RequestRecord(prompt_chars=1, start=start)
    for t, n in zip(arrivals, counts, strict=True):
        r.arrivals.append(t)
        r.tokens += n
    r.end = end
    return r


def test_coalesced_document_counts_one_gap_and_all_its_tokens():
    # 4 tokens in 3 documents: the second carries 2 tokens
    r = _record(0.0, [0.1, 0.3, 0.4], [1, 2, 1], 0.4)
    assert r.ttft == 0.1 and r.itls == [0.19999999999999998, 0.10000000000000003]
    assert abs(r.tpot - (0.4 - 0.1) / 3) < 1e-12
    row = summarize([r], duration=0.5)
    assert row["tokens_per_document"] == 1.33 and row["output_tok_s"] == 8.0 and row["completed"] == 1


def test_total_corrects_the_count_without_an_arrival():
    r = RequestRecord(prompt_chars=1)
    r.on_document(1)
    r.on_document(Total(5))
    assert r.tokens == 5 and len(r.arrivals) == 1


def _fake(in_flight, peak, tokens=3):
    async def send(prompt, max_tokens):
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        try:
            for _ in range(tokens):
                await asyncio.sleep(0)
                yield 1
        finally:
            in_flight[0] -= 1
    return send


async def test_closed_loop_keeps_c_in_flight_and_sends_n():
    in_flight, peak = [0], [0]
    records, duration, cut = await closed_loop(_fake(in_flight, peak), ["p"], 4, 10, 3, time_limit=60)
    assert len(records) == 10 and all(r.ok and r.tokens == 3 for r in records)
    assert peak[0] == 4 and not cut and duration > 0


async def test_failed_request_is_recorded_not_raised():
    async def broken(prompt, max_tokens):
        yield 1
        raise RuntimeError("boom")
    records, _, _ = await closed_loop(broken, ["p"], 2, 4, 3, time_limit=60)
    row = summarize(records, 1.0)
    assert row["errors"] == 4 and "boom" in row["first_error"] and row["completed"] == 0


async def test_poisson_sends_n():
    in_flight, peak = [0], [0]
    records, _, cut = await poisson(_fake(in_flight, peak), ["p"], rate=1000.0, n=12, max_tokens=3,
                                    time_limit=60)
    assert len(records) == 12 and not cut


def test_report_outputs(tmp_path):
    base = dict(transport="grpc", model="tiny", load="C=1", requests=1, completed=1, rate=None,
                ttft_p99_ms=10.0, ttft_p50_ms=5.0)
    rows = [dict(base, system="this", concurrency=1, output_tok_s=50.0),
            dict(base, system="raw-engine", transport="in-process", concurrency=1, output_tok_s=100.0),
            dict(base, system="this", concurrency=16, output_tok_s=400.0),
            dict(base, system="seed-jina", concurrency=16, output_tok_s=40.0, ttft_p99_ms=1000.0)]
    lines = ratios(rows)
    assert any("this/grpc / raw-engine" in l and "0.50x" in l for l in lines)
    assert any("this/grpc / seed-jina" in l and "10.00x" in l for l in lines)
    machine = {"cpu_count": 2, "device": "cpu", "torch": "x", "git": None, "time": "t",
               "loadavg_at_start": [0, 0, 0]}
    assert "| this | grpc | tiny |" in markdown(rows, machine, [], {})
    plot(rows, tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 0
    json.dumps(rows)


async def test_settle_waits_for_a_busy_server_to_go_quiet(tmp_path):
    """A started server still busy (a Flow printing and importing) must not run into the first
    level: settle() returns only once its processes are quiet, and soon for an idle one (a window
    or two of 0.5 s: a loaded machine can lend a stray 25 ms to the first)."""
    busy = ServerProcess([sys.executable, "-c", "import time\nend = time.time() + 3.0\nwhile time.time() < end: pass\n"
                          "time.sleep(60)"], tmp_path / "busy.log")
    try:
        waited = await settle()
        assert 2.5 <= waited < 10.0, waited
        assert await settle() < 1.5  # now quiet
    finally:
        busy.stop()


def test_the_kernel_benchmark_compares_each_c_kernel_with_pytorchs(tmp_path):
    from benchmarks.kernels import against_torch as kernels
    from engine.kernels import native
    if not native.int4_ready():
        import pytest
        pytest.skip("the C kernels do not run here")
    kernels.main(["--out", str(tmp_path), "--repeats", "1"])
    rows = [line for line in (tmp_path / "results.md").read_text().splitlines() if line.startswith("| int4")]
    assert len(rows) == len(kernels.SHAPES) * len(kernels.ROWS)
    for row in rows:  # the C kernel's error against float64 is far below PyTorch's
        c_error, torch_error = (float(cell) for cell in row.strip("| ").split(" | ")[-2:])
        assert c_error * 100 < torch_error


def test_the_cpu_records_goals_and_the_speculation_sweeps_ratios():
    from benchmarks.records import cpu_record, speculation_sweep
    base = dict(workload="plain", requests=4, completed=4, ttft_p50_ms=5.0, tpot_p50_ms=1.0, itl_p50_ms=1.0)
    rows = [dict(base, system="this", concurrency=1, output_tok_s=120.0),
            dict(base, system="llama-cpp-q4_0", concurrency=1, output_tok_s=100.0),
            dict(base, system="this", concurrency=16, output_tok_s=300.0),
            dict(base, system="llama-cpp-q4_0", concurrency=16, output_tok_s=100.0, completed=3),
            dict(base, system="this", workload="cold prefill", concurrency=1, output_tok_s=1.0, ttft_p50_ms=100.0),
            dict(base, system="llama-cpp-q4_0", workload="cold prefill", concurrency=1, output_tok_s=1.0,
                 ttft_p50_ms=200.0)]
    goals = cpu_record.goals({"rows": rows})
    assert "120 / 100 tok/s = 1.20x (goal >= 1.2: met)" in goals[0]
    assert goals[3].endswith("n/a")  # a level with a failed request has no figure
    assert "200 / 100 ms = 2.00x (goal >= 1.5: met)" in goals[4]
    assert cpu_record._cpu().startswith("int4 kernel: int4_matmul")  # the header's kernel line
    sweep = [dict(base, model="m", arm=arm, sampling="greedy", concurrency=1, output_tok_s=tok_s, round=r)
             for arm, r, tok_s in (("off", 0, 90.0), ("on", 0, 97.0), ("on", 1, 93.0), ("off", 1, 110.0))]
    sweep += [dict(base, model="m", arm=arm, sampling="sampled", concurrency=1, output_tok_s=50.0, round=0)
              for arm in ("off", "on")]  # a cell one round short: no figure
    result = {"settings": {"models": ["m"], "concurrency": [1], "max_tokens": 8, "rounds": 2}, "rows": sweep,
              "notes": [],
              "date": "d", "git": "g", "command": "c",
              "machine": {"cpu_count": 2, "device": "cpu", "torch": "x", "loadavg_at_start": [0, 0, 0]}}
    assert ("m", "greedy", 1, 100.0, 95.0) in speculation_sweep.ratios(result)  # each arm's mean of its rounds
    assert ("m", "sampled", 1, None, None) in speculation_sweep.ratios(result)
    assert "| m | greedy | 1 | 100.0 | 95.0 | 0.95x |" in speculation_sweep.markdown(result)


def test_the_gguf_records_goals_set_the_flow_beside_the_engine_alone():
    from benchmarks.records import gguf_record
    base = dict(workload="plain", requests=4, completed=4, ttft_p50_ms=5.0, tpot_p50_ms=1.0, itl_p50_ms=1.0)
    rows = [dict(base, system=system, concurrency=16, output_tok_s=tok_s)
            for system, tok_s in (("this", 200.0), ("this-engine", 250.0), ("llama-cpp", 100.0))]
    lines = gguf_record.goals({"rows": rows, "settings": {"concurrency": [16]},
                               "ready": {"this": [{"round": 0, "ready_s": 20.0}]},
                               "agreement": {"this": 16, "llama-cpp": 10}})
    assert "200 / 100 tok/s = 2.00x (goal >= 2: met)" in lines[0]
    assert lines[1] == "C=16, the engine alone: 250.0 tok/s, 2.50x llama.cpp; the Flow made 0.80x the engine alone's"
    assert "this 16 of 16, llama.cpp 10 (at least as often: met)" in lines[2]
    assert lines[3].endswith("20.0 s (met)")


def test_the_gguf_record_judges_its_rounds_by_the_median_ratio():
    """Three alternating rounds: the goal on the median of the rounds' ratios, each round shown,
    the start judged by the slowest; the order reverses every other round."""
    from benchmarks.records import gguf_record
    assert gguf_record.rounds_order(["a", "b", "c"], 3) == [
        ("a", 0), ("b", 0), ("c", 0), ("c", 1), ("b", 1), ("a", 1), ("a", 2), ("b", 2), ("c", 2)]
    base = dict(workload="plain", requests=4, completed=4, ttft_p50_ms=5.0, tpot_p50_ms=1.0, itl_p50_ms=1.0,
                concurrency=16)
    figures = {"this": (250.0, 260.0, 240.0), "llama-cpp": (100.0, 160.0, 125.0)}
    rows = [dict(base, system=system, output_tok_s=tok, round=r) for system, tok_s in figures.items()
            for r, tok in enumerate(tok_s)]
    result = {"rows": rows, "settings": {"concurrency": [16], "rounds": 3, "model": "m", "max_tokens": 4,
                                         "requests": 4},
              "ready": {"this": [{"round": r, "ready_s": s, "first_request_s": s} for r, s in enumerate((21, 29, 31))]},
              "agreement": {}, "date": "d", "git": "g", "command": "c", "notes": [],
              "machine": {"cpu_count": 2, "torch": "x", "loadavg_at_start": [0, 0, 0]}}
    lines = gguf_record.goals(result)
    assert lines[0] == ("C=16 plain, this / llama.cpp: the median of 3 rounds' ratios is 1.92x (250 / 100 = 2.50x, "
                        "260 / 160 = 1.62x, 240 / 125 = 1.92x) (goal >= 2: NOT met)")
    assert lines[-1].endswith("31 s (NOT met)")
    text = gguf_record.markdown(result)
    assert "| this, round 2 | plain | 16 | 260.0 |" in text and "| this | 3 | 31 | 31 |" in text
    rows[-1]["completed"] = 3  # llama.cpp's third round cut short: no median of two
    assert gguf_record.goals(result)[0].endswith("n/a (a round failed or was cut short)")


def test_each_mode_takes_its_own_systems_by_name(capsys):
    import pytest

    from benchmarks.records.serving import parse_args
    assert parse_args(["--cpu-record", "--systems", "this-engine,llama-cpp-q4_0"]).systems == [
        "this-engine", "llama-cpp-q4_0"]
    assert "this-engine" in parse_args(["--cpu-record"]).systems  # the record's default: all of its own
    assert parse_args(["--systems", "raw-engine"]).systems == ["raw-engine"]
    for argv in (["--systems", "this-engine"], ["--prefix", "--systems", "raw-engine"]):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert "unknown" in capsys.readouterr().err


def test_one_command_runs_every_benchmark(capsys, monkeypatch):
    """`python -m benchmarks SUBCOMMAND`: each subcommand reaches its module, whose options name it;
    options without a subcommand, and a record mode's subcommand, reach the serving benchmark."""
    import pytest

    from benchmarks import __main__ as cli
    from benchmarks.records import serving
    for name, sub in cli.SUBCOMMANDS.items():
        if sub.mode:
            continue
        with pytest.raises(SystemExit) as exited:
            cli.main([name, "--help"])
        assert exited.value.code == 0 and capsys.readouterr().out.startswith(f"usage: python -m benchmarks {name} ")
    seen: list[list[str]] = []
    monkeypatch.setattr(serving, "main", lambda argv: seen.append(argv) or 0)
    assert cli.main(["--quick"]) == cli.main(["cpu-record", "--rounds", "2"]) == cli.main([]) == 0
    assert seen == [["--quick"], ["--cpu-record", "--rounds", "2"], []]
    assert serving.parse_args(seen[1]).cpu_record
    assert cli.main(["no-such-benchmark"]) == 2 and "unknown subcommand 'no-such-benchmark'" in capsys.readouterr().err
    assert cli.main(["reproduce", "docs/benchmarks/2026-11-peers"]) == 2  # a record without reproduce.py
    assert "2026-11-peers/reproduce.py: no such file" in capsys.readouterr().err


def test_kernel_ab_builds_two_commits_kernels_and_compares_every_case(tmp_path):
    """The kernel A/B tool end to end on one commit against itself: sources from git, two
    libraries loaded side by side, every case run and compared (a kernel whose output varied
    between calls would show here as not bit for bit equal)."""
    import pytest

    from benchmarks.kernels import kernel_ab
    from engine.kernels import native
    if native.library() is None:
        pytest.skip("no C compiler on this machine")
    assert kernel_ab.main(["--base", "HEAD", "--repeats", "1", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "results.json").read_text())
    assert [r["case"] for r in result["rows"]] == list(kernel_ab.CASES)
    assert all(r["bit_equal"] and r["base_us"] > 0 and r["head_us"] > 0 for r in result["rows"])
    assert "| int8 output layer, 16 rows |" in (tmp_path / "results.md").read_text()


def test_kernel_ab_hands_each_sides_flags_to_its_build(tmp_path):
    """--head-flags reaches the head's compiler (a flag no compiler knows fails that build only,
    naming it), and the table's columns name the flags of each side."""
    import pytest

    from benchmarks.kernels import kernel_ab
    from engine.kernels import build, native
    if native.library() is None:
        pytest.skip("no C compiler on this machine")
    one = ["--case", "int8 output layer, 1 rows"]
    with pytest.raises(build.Unbuilt, match="no-such-flag"):
        kernel_ab.main(["--base", "HEAD", "--head-flags=-fno-such-flag", "--repeats", "1", *one])
    assert kernel_ab.main(["--base", "HEAD", "--base-flags=-DKERNEL_AB_SIDE", "--repeats", "1", "--out", str(tmp_path),
                           *one]) == 0
    text = (tmp_path / "results.md").read_text()
    header = text.split("| case | ")[1].splitlines()[0]
    assert " -DKERNEL_AB_SIDE (us) |" in header and header.count("KERNEL_AB_SIDE") == 1
    assert [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| int")] == ["| int8 output layer, 1 rows"]


def test_kernel_abs_case_filter_names_the_cases_when_none_matches(capsys):
    import pytest

    from benchmarks.kernels import kernel_ab
    with pytest.raises(SystemExit):
        kernel_ab.main(["--base", "HEAD", "--case", "no such case"])
    assert "--case: no case's name contains 'no such case'" in capsys.readouterr().err


def test_the_products_benchmark_times_every_kind_of_a_ggufs_layers(gguf_model, monkeypatch):
    """`python -m benchmarks products` on Gemma 3 270M's file (briefly): each kind of quantized layer
    that its load made, the bytes a weight they read, and each row count's rate as a fraction of the
    multiply bound, and at one row of the read bandwidth (a kernel at no cost would give fractions far
    over 1; at none, 0). Which row count is faster is the benchmark's to show, not a test's: a
    neighbour's load on a shared machine can turn it."""
    from pathlib import Path

    from benchmarks.kernels import products_rate
    monkeypatch.setattr(products_rate, "SECONDS", 0.05)
    monkeypatch.setattr(products_rate, "read_bandwidth", lambda threads: 1e12)
    result = products_rate.measure(Path(gguf_model), [1, 16])
    assert result["bound_g_s"] > 0 and result["form"].startswith("int16")
    assert len(result["kinds"]) >= 2  # Gemma's file: Q4_K's int4 layers and int8 ones (Q5_0, Q6_K, Q8_0)
    for kind, entry in result["kinds"].items():
        assert entry["layers"] > 0 and 0.4 < entry["bytes_a_weight"] < 1.5, (kind, entry)
        for n in ("1", "16"):
            figures = entry["rows"][n]
            assert 0 < figures["of_bound"] < 1.5, (kind, n, entry)
            assert abs(figures["of_bound"] - figures["g_products_s"] / result["bound_g_s"]) < 0.002, (kind, n, entry)
            assert ("of_arithmetic" in figures) == result["form"].startswith("int16, vpdpwssd"), (kind, n, entry)
            assert 0 < figures.get("of_arithmetic", 1) < 1.5, (kind, n, entry)
        one = entry["rows"]["1"]
        assert one["gb_s"] > 0 and abs(one["of_bandwidth"] - one["gb_s"] / 1000) < 0.002, (kind, entry)
    text = products_rate.table(result, "python -m benchmarks products", "abc1234")
    assert text.count("\n| ") == 1 + 2 * len(result["kinds"])  # the header, then a row per kind and count


def test_the_arithmetics_bound_counts_each_kinds_multiplies():
    """Each kind's layers at the rate of `vpdpwssd` beside the fp32 multiplies its blocks carry:
    int4 3 a block of 32, Q8_0's int8 2, int8 by sub-blocks of 16 4, and 6 with lows; none without
    VNNI's rates."""
    import torch

    from benchmarks.kernels import products_rate
    from engine.kernels import native
    from engine.model.int4 import Int4Linear, Int8Linear, _quantize
    if not native.int8_ready():
        import pytest
        pytest.skip("quant_matmul.c does not run here (no compiler)")
    g = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(64, 32, bias=False)
    steps, scale, low, _ = _quantize(torch.randn(32, 64, generator=g))
    sub = torch.randint(-32, 32, (32, 64), generator=g, dtype=torch.int8)
    scales = torch.rand(32, 4, generator=g) + 0.1
    layers = [Int4Linear(linear, steps, scale, low), Int8Linear(linear), Int8Linear(linear, (sub, scales, None)),
              Int8Linear(linear, (sub, scales, -scales))]
    assert [products_rate.multiplies(layer) for layer in layers] == [3, 2, 4, 6]
    rates = [(products_rate.SCALED_FORM.format(m), rate)
             for m, rate in ((2, 200.0), (3, 150.0), (4, 100.0), (6, 50.0))]
    seconds = products_rate.arithmetic_seconds(layers, 8, rates, threads=2)
    assert seconds is not None
    assert abs(seconds - 8 * 64 * 32 * (1 / 150 + 1 / 200 + 1 / 100 + 1 / 50) / 2e9) < 1e-15
    assert products_rate.arithmetic_seconds(layers, 8, rates[:3], threads=2) is None


def test_the_steps_benchmark_splits_passes_by_what_they_held():
    """Passes with prompt tokens and decoding-only ones are summed apart; each position costs the
    layers' products, and each sampling one the output layer's too."""
    from benchmarks.kernels.step_split import Pass, split
    passes = [Pass(1.0, 500, 3, 4), Pass(0.5, 0, 16, 16), Pass(0.25, 0, 16, 16)]
    result = split(passes, layers=10**9, output=10**8, bound=100.0)
    prompt, decode = result["with prompt tokens"], result["decoding only"]
    assert (prompt["passes"], prompt["prompt_tokens"], prompt["positions_s"]) == (1, 500, 503.0)
    assert prompt["g_products_s"] == 503.4 and prompt["of_bound"] == 5.034  # 503 x 1e9 + 4 x 1e8 in a second
    assert (decode["passes"], decode["seconds"], decode["positions_s"]) == (2, 0.75, 42.7)
    assert decode["g_products_s"] == 46.9 and decode["median_ms_at_16_rows"] == 375.0
    assert "decoding only" not in split(passes[:1], 1, 1, 1.0)


def test_the_steps_benchmark_times_the_engines_passes(gguf_model, monkeypatch):
    """`python -m benchmarks steps` on Gemma 3 270M's file, its loads made small: every prompt
    token of the cold prompt is in a pass that held prompt tokens, and the table has a row per kind
    of pass of each load."""
    from pathlib import Path

    from benchmarks.kernels import step_split
    monkeypatch.setattr(step_split, "SIXTEEN", 2)
    monkeypatch.setattr(step_split, "REQUESTS", 3)
    monkeypatch.setattr(step_split, "TOKENS", 3)
    monkeypatch.setattr(step_split, "COLD_PARAGRAPHS", 1)
    monkeypatch.setattr(step_split, "multiply_rates", lambda: [("int16", 500.0), ("int16, vpdpwssd (512 bits)", 500.0)])
    result = step_split.measure(Path(gguf_model))
    assert (result["layer_products"], result["output_products"]) == (100_270_080, 262_144 * 640)  # Gemma 3 270M's
    cold = result["cold"]
    assert cold["split"]["with prompt tokens"]["prompt_tokens"] == cold["prompt_tokens"] > 20
    sixteen = result["sixteen"]["split"]
    assert sixteen["with prompt tokens"]["passes"] >= 1 and sixteen["decoding only"]["passes"] >= 1
    assert result["sixteen"]["tok_s"] > 0 and result["bound_g_s"] == 500.0 * result["threads"]
    for kind in (*sixteen.values(), *cold["split"].values()):  # billions a second, as the bound
        assert 0 < kind["g_products_s"] and 0 < kind["of_bound"] < 1.5, kind
    text = step_split.table(result, "python -m benchmarks steps", "abc1234")
    assert text.count("\n| ") == 1 + len(sixteen) + len(cold["split"])
