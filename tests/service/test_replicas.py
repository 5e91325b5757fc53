"""Several replicas behind one gateway (testing/fleet.py: the multi-host shape on one machine): the
router keeps a conversation where its prefix is cached and spreads the rest, every replica is in
/metrics, /stats and /info, a stream whose replica dies goes on elsewhere with the very bytes it
would have had (a kept background response too), and a rolling restart under load fails no request."""
import asyncio
import json
import signal
import threading
import time

import pytest
import requests

from client import stream
from testing.fleet import LocalFleet

STREAMED = {"prompt": "the cat sat on the mat and the dog", "max_tokens": 600, "ignore_eos": True,
            "stream": True}


@pytest.fixture(scope="module")
def fleet(int4_llama_model, tmp_path_factory):
    with LocalFleet(int4_llama_model, tmp_path_factory.mktemp("fleet")) as running:
        yield running


def completion_stream(port: int, body: dict, on_document=None) -> dict:
    """An OpenAI completions stream, flattened: its text, tokens' log probabilities, finish and usage."""
    text, logprobs, tops, finish, documents, seed = "", [], [], None, 0, None
    with requests.post(f"http://127.0.0.1:{port}/v1/completions", json=body, stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            choice = chunk["choices"][0]
            text += choice["text"]
            if choice.get("logprobs"):
                logprobs += choice["logprobs"]["token_logprobs"]
                tops += choice["logprobs"]["top_logprobs"]
            finish = choice["finish_reason"] or finish
            seed = chunk.get("seed", seed)
            documents += 1
            if on_document is not None:
                on_document(documents)
    return {"text": text, "logprobs": logprobs, "tops": tops, "finish": finish, "seed": seed}


def serving(fleet: LocalFleet) -> int:
    """The replica that holds the one stream open now."""
    replicas = fleet.stats()["replicas"]
    return next(r["replica"] for r in replicas if r["streams"])


def kill_when(fleet: LocalFleet, at: int, sig: signal.Signals = signal.SIGKILL):
    killed: list[int] = []

    def on_document(documents: int) -> None:
        if documents == at and not killed:
            killed.append(serving(fleet))
            fleet.signal(killed[0], sig)
    return on_document, killed


def rejoin(fleet: LocalFleet, replica: int) -> None:
    fleet.wait_exit(replica)
    fleet.start(replica)
    fleet.wait_routable(len(fleet.ports))


def test_every_replica_is_reported_and_labelled(fleet):
    stats = fleet.stats()
    assert [r["replica"] for r in stats["replicas"]] == [0, 1] and stats["router"]["policy"] == "cache-aware"
    assert stats["kv_blocks"] == sum(r["kv_blocks"] for r in stats["replicas"]) and stats["healthy"]
    metrics = requests.get(f"http://127.0.0.1:{fleet.http_port}/metrics", timeout=30).text
    for replica in (0, 1):
        assert f'vllm:num_requests_running{{replica="{replica}",' in metrics, metrics[:2000]
    assert metrics.count("# TYPE vllm:num_requests_running gauge") == 1
    info = requests.get(f"http://127.0.0.1:{fleet.http_port}/info", timeout=30).json()
    assert info["replicas"] == 2 and info["routing"] == "cache-aware"


def test_a_conversations_turns_follow_its_cached_prefix(fleet):
    """Six conversations of three turns, each with a system prompt of its own: every later turn
    lands where its earlier turns are cached (the previous turn's prompt, block for block, comes
    from the cache; the answer, written again into the next prompt, tokenizes its own way), and the
    conversations spread over both replicas."""
    base = f"http://127.0.0.1:{fleet.http_port}/v1/chat/completions"
    before = [r["routed_total"] for r in fleet.stats()["replicas"]]
    cached = []  # (cached tokens, the previous turn's prompt tokens)
    for c in range(6):
        previous = 0
        messages = [{"role": "system", "content": f"conversation {c}: " + "you answer about rivers and hills " * 12}]
        for turn in range(3):
            messages.append({"role": "user", "content": f"turn {turn} of conversation {c}: tell me more"})
            r = requests.post(base, json={"messages": messages, "max_tokens": 12, "temperature": 0},
                              timeout=60)
            assert r.status_code == 200, r.text
            usage = r.json()["usage"]
            if turn:
                cached.append((usage["prompt_tokens_details"]["cached_tokens"], previous))
            previous = usage["prompt_tokens"]
            messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
    assert all(hit >= (previous // 16 - 1) * 16 for hit, previous in cached), cached
    after = [r["routed_total"] for r in fleet.stats()["replicas"]]
    assert all(a - b >= 3 for a, b in zip(after, before, strict=True)), (before, after)


@pytest.mark.parametrize("params", [
    {"temperature": 0, "logprobs": 2},
    {"temperature": 0.9, "seed": 77, "logprobs": 1},
    {"temperature": 0.8, "top_p": 0.9, "repetition_penalty": 1.2},  # the gateway draws the seed
], ids=["greedy", "seeded", "unseeded"])
def test_a_stream_whose_replica_is_killed_goes_on_with_the_same_bytes(fleet, params):
    body = {**STREAMED, **params}
    on_document, killed = kill_when(fleet, 20)
    broken = completion_stream(fleet.http_port, body, on_document)
    assert killed, "the stream ended before its replica could be killed"
    try:
        unbroken = completion_stream(fleet.http_port, {**body, "seed": broken["seed"]})  # the seed it reported
        assert broken == unbroken and broken["finish"] == "length"
        assert fleet.stats()["router"]["migrations"] >= 1
    finally:
        rejoin(fleet, killed[0])


def test_a_grpc_stream_goes_on_too(fleet):
    async def run(on_document=None) -> tuple[str, list[int], list[float]]:
        text, ids, logprobs, documents = "", [], [], 0
        async for doc in stream("the dog sat", host="127.0.0.1", port=fleet.grpc_port, max_tokens=600,
                                ignore_eos=True, do_sample=True, seed=5):
            text, ids, logprobs, documents = text + doc.text, ids + doc.token_ids, logprobs + doc.logprobs, documents + 1
            if on_document is not None:
                await asyncio.to_thread(on_document, documents)
        return text, ids, logprobs
    on_document, killed = kill_when(fleet, 20)
    broken = asyncio.run(run(on_document))
    try:
        assert killed and broken == asyncio.run(run()) and len(broken[1]) == 600
    finally:
        rejoin(fleet, killed[0])


def test_requests_sent_after_a_kill_do_not_fail(fleet):
    fleet.signal(0, signal.SIGKILL)
    try:
        for i in range(6):
            r = requests.post(f"http://127.0.0.1:{fleet.http_port}/v1/completions",
                              json={"prompt": f"hello {i}", "max_tokens": 8}, timeout=60)
            assert r.status_code == 200, r.text
    finally:
        rejoin(fleet, 0)


def test_a_rolling_restart_under_load_fails_no_request(fleet):
    """Two clients send requests without pause while each replica in turn is stopped (SIGTERM)
    and started again: every request completes."""
    stop, outcomes = threading.Event(), []

    def client(k: int) -> None:
        while not stop.is_set():
            body = {**STREAMED, "prompt": f"client {k} at {time.monotonic()}", "max_tokens": 80}
            try:
                outcomes.append(completion_stream(fleet.http_port, body)["finish"] == "length")
            except Exception as exc:  # noqa: BLE001 - counted as a failure
                outcomes.append(repr(exc))
    clients = [threading.Thread(target=client, args=(k,)) for k in range(2)]
    for thread in clients:
        thread.start()
    try:
        for replica in (0, 1):
            time.sleep(1.0)
            fleet.signal(replica, signal.SIGTERM)
            rejoin(fleet, replica)
        time.sleep(1.0)
    finally:
        stop.set()
        for thread in clients:
            thread.join(120)
    assert len(outcomes) >= 6 and all(o is True for o in outcomes), outcomes


def test_a_background_response_is_kept_whichever_replica_makes_it_and_survives_it(fleet):
    """The gateway keeps a background response (its stream store), whichever replica the router
    gave it; when that replica dies mid-answer, the migration finishes it with the very text and
    usage of an unbroken run."""
    base = f"http://127.0.0.1:{fleet.http_port}/v1/responses"
    ask = {"input": "the cat sat on the mat and the dog", "max_output_tokens": 600, "temperature": 0}
    migrations = fleet.stats()["router"]["migrations"]
    started = requests.post(base, json={**ask, "background": True}, timeout=60).json()
    deadline = time.monotonic() + 30
    while not any(r["streams"] for r in fleet.stats()["replicas"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    killed = serving(fleet)
    fleet.signal(killed, signal.SIGKILL)
    try:
        deadline = time.monotonic() + 120
        while (kept := requests.get(f"{base}/{started['id']}", timeout=30).json())["status"] == "in_progress":
            assert time.monotonic() < deadline, kept
            time.sleep(0.2)
        unbroken = requests.post(base, json=ask, timeout=120).json()
        assert kept["status"] == unbroken["status"] and kept["output"][0]["content"][0]["text"] \
            == unbroken["output"][0]["content"][0]["text"]
        assert kept["usage"]["output_tokens"] == unbroken["usage"]["output_tokens"] > 20
        assert fleet.stats()["router"]["migrations"] > migrations  # it was cut mid-answer, and went on
    finally:
        rejoin(fleet, killed)
