"""Streams kept for a reconnect (gateway/edge/resumable.py), with a scripted executor that makes a
token when the test says so: a reader that leaves stops the generation at once, a reconnect gets
the events after the id it names and then the rest, made from the tokens handed on so far, and the
store keeps within its bounds."""
import asyncio

from contract.limits import ResumeLimits
from gateway.edge.resumable import ResumableDocs, StreamStore, with_seed
from schemas import ModelOutputDocument, PromptDocument

WORDS = [f" w{i}" for i in range(8)]


class Script:
    """An executor that writes WORDS, one per `step()`, going on from a request's resume_tokens."""

    def __init__(self) -> None:
        self.sent: list[PromptDocument] = []
        self.open_streams = 0
        self.steps = asyncio.Queue()

    async def open(self, doc: PromptDocument):
        self.sent.append(doc)
        start = len(doc.resume_tokens)
        return self._doc(start, start), self._rest(start)

    def _doc(self, i: int, start: int) -> ModelOutputDocument:
        last = i == len(WORDS) - 1
        return ModelOutputDocument(token_ids=[i], text=WORDS[i], generated_text="".join(WORDS[start:i + 1]),
                                   finish_reason="length" if last else None, generated_tokens=len(WORDS) if last else None)

    async def _rest(self, start: int):
        self.open_streams += 1
        try:
            for i in range(start + 1, len(WORDS)):
                await self.steps.get()
                yield self._doc(i, start)
        finally:
            self.open_streams -= 1

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            self.steps.put_nowait(None)


async def frames(docs):
    """A protocol's encoder: an event per document, then a last one."""
    async for out in docs:
        yield f"data: {out.error or out.text}|{out.generated_text}\n\n"
    yield "data: [DONE]\n\n"


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def start(script: Script, store: StreamStore):
    docs = ResumableDocs(script.open, PromptDocument(prompt="hi", max_tokens=len(WORDS)))
    await docs.start()
    return store.start("/v1/x", docs, frames(docs))


async def take(reader, n: int) -> list[str]:
    return [await reader.__anext__() for _ in range(n)]


async def test_a_reconnect_gets_the_events_after_its_id_then_the_rest_made_from_the_tokens_so_far():
    script, store = Script(), StreamStore(ResumeLimits())
    stored = await start(script, store)
    reader = store.read(stored, 0)
    script.step(2)
    got = await take(reader, 3)
    assert [f.split("\n")[0] for f in got] == [f"id: {stored.id}/{i}" for i in range(3)]
    script.step(1)  # a fourth event is made, but the reader leaves before it reads it
    await settle()
    await reader.aclose()
    await settle()
    assert script.open_streams == 0  # the generation stopped with its reader
    script.step(1)  # nothing takes it while nobody reads
    found = store.find("/v1/x", got[-1].split("\n")[0].removeprefix("id: "))
    assert found == (stored, 3)
    assert store.find("/v1/other", f"{stored.id}/2") is None and store.find("/v1/x", f"{stored.id}/99") is None
    again = store.read(*found)
    script.step(len(WORDS))
    rest = [f async for f in again]
    assert script.sent[-1].resume_tokens == [0, 1, 2, 3]  # the tokens handed on, the unread one among them
    body = [f.split("\n", 1)[1] for f in got + rest]
    assert body == [f"data: {w}|{''.join(WORDS[:i + 1])}\n\n" for i, w in enumerate(WORDS)] + ["data: [DONE]\n\n"]
    assert [f.split("\n")[0] for f in got + rest] == [f"id: {stored.id}/{i}" for i in range(len(WORDS) + 1)]


async def test_a_request_that_went_on_from_tokens_resumes_from_those_and_the_ones_handed_since():
    """A client's own resume_tokens stay in front of the tokens handed on when the stream is cut."""
    script, store = Script(), StreamStore(ResumeLimits())
    docs = ResumableDocs(script.open, PromptDocument(prompt="hi", max_tokens=len(WORDS), resume_tokens=[0, 1]))
    await docs.start()
    stored = store.start("/v1/x", docs, frames(docs))
    reader = store.read(stored, 0)
    script.step(1)
    got = await take(reader, 2)  # tokens 2 and 3
    await reader.aclose()
    await settle()
    again = store.read(stored, 2)
    script.step(len(WORDS))
    rest = [f async for f in again]
    assert script.sent[-1].resume_tokens == [0, 1, 2, 3]
    assert docs.tokens == list(range(2, len(WORDS)))  # what this stream handed on
    texts = [f.split("\n", 1)[1] for f in got + rest]
    assert texts[-2] == f"data: {WORDS[-1]}|{''.join(WORDS[2:])}\n\n"  # all the text this stream made


async def test_the_store_keeps_within_its_count_and_drops_what_waited_longest():
    script, store = Script(), StreamStore(ResumeLimits(resume_streams=2))
    first = await start(script, store)
    await start(script, store)
    await start(script, store)  # the first goes: nobody reads any, and it waited longest
    await settle()
    assert len(store) == 2 and store.find("/v1/x", f"{first.id}/0") is None
    assert first.producer is not None and first.producer.cancelled()


async def test_a_stream_is_dropped_its_time_after_its_reader_left():
    script, store = Script(), StreamStore(ResumeLimits(resume_seconds=1))
    stored = await start(script, store)
    reader = store.read(stored, 0)
    await take(reader, 1)
    await reader.aclose()
    stored.idle_since -= 2  # as if two seconds had gone by
    assert store.find("/v1/x", f"{stored.id}/0") is None and len(store) == 0


def test_a_sampled_request_without_a_seed_gets_one_and_greedy_ones_none():
    assert with_seed(PromptDocument(prompt="x", do_sample=True)).seed is not None
    assert with_seed(PromptDocument(prompt="x", do_sample=True, seed=7)).seed == 7
    assert with_seed(PromptDocument(prompt="x", do_sample=False)).seed is None
    assert with_seed(PromptDocument(prompt="x", do_sample=True, temperature=0)).seed is None


async def test_a_cut_stream_of_several_answers_ends_with_an_error_event():
    script, store = Script(), StreamStore(ResumeLimits())
    docs = ResumableDocs(script.open, PromptDocument(prompt="hi", max_tokens=len(WORDS), n=2))
    await docs.start()
    stored = store.start("/v1/x", docs, frames(docs))
    reader = store.read(stored, 0)
    await take(reader, 1)
    await reader.aclose()
    await settle()
    rest_frames = [f async for f in store.read(stored, 1)]
    assert len(script.sent) == 1  # not opened again
    assert "several (n)" in rest_frames[0] and rest_frames[-1].endswith("data: [DONE]\n\n")


def test_the_drawn_seed_travels_on_the_protobuf_wire():
    doc = with_seed(PromptDocument(prompt="x", do_sample=True))
    assert PromptDocument.from_protobuf(doc.to_protobuf()).seed == doc.seed


async def test_a_call_that_raises_ends_the_stream_with_an_error_document():
    async def broken(doc):
        raise ConnectionError("the executor is gone")
    docs = ResumableDocs(broken, PromptDocument(prompt="hi"))
    first = await docs.start()
    assert first.finish_reason == "error" and "the executor is gone" in first.error
