"""Two engine processes of one model on one machine map one file of its weights
(engine/model/shared_weights.py), its pages shared between them, and answer alike. That the
file's weights give the private copy's tokens and log probabilities: tests/unit/test_shared_weights.py."""
from contract import EngineConfig, SamplingParams
from engine import EngineProcess

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


async def _answer(engine: EngineProcess) -> list[str]:
    return [out.text for out in await engine.complete("Two replicas, one copy", GREEDY)]


def _shared_bytes(pid: int, path: str) -> int:
    """Bytes of `path` that process `pid` maps and another process maps too (smaps' Shared_*)."""
    total, inside = 0, False
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                inside = len(fields) >= 6 and fields[5] == path
            elif inside and fields[0] in ("Shared_Clean:", "Shared_Dirty:"):
                total += int(fields[1]) * 1024
    return total


async def test_two_engine_processes_share_the_pages_of_one_file_and_answer_alike(int4_llama_model, tmp_path,
                                                                                   monkeypatch):
    monkeypatch.setenv("LLM_SHARE_WEIGHTS", "on")
    monkeypatch.setenv("LLM_WEIGHTS_CACHE", str(tmp_path))
    engines = [EngineProcess(EngineConfig(model=int4_llama_model)) for _ in range(2)]
    try:
        first, second = [await _answer(engine) for engine in engines]
        assert first == second and first[0]
        (path,) = tmp_path.glob("*.weights")  # one file: the second process found the first's
        shared = [_shared_bytes(engine.pid, str(path)) for engine in engines]
        assert all(s > path.stat().st_size // 2 for s in shared), (shared, path.stat().st_size)
    finally:
        for engine in engines:
            engine.shutdown()
