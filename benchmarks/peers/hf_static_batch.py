"""Reproduces Ray Serve's `@serve.batch` recipe: up to N prompts (or what came within a short wait) generated together to the end with left padding, then each answer streamed token by token.

One batch at a time (Ray's default max_concurrent_batches=1); generate runs on a
worker thread so the event loop keeps accepting requests meanwhile. Greedy; an
answer ends at its first EOS (included, as the engine counts it).
Run: python -m benchmarks.peers.hf_static_batch --model PATH --port P [--max-batch-size 16]
"""
import argparse
import asyncio
import contextlib
import json
from dataclasses import dataclass, field

import torch
import uvicorn
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks.peers import pick_device_dtype


@dataclass
class Item:
    prompt: str
    max_tokens: int
    result: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


def make_app(model_path: str, max_batch_size: int, batch_wait_timeout_s: float) -> FastAPI:
    device, dtype = pick_device_dtype()
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval()
    queue: asyncio.Queue[Item] = asyncio.Queue()

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        batcher = asyncio.create_task(batch_loop())
        yield
        batcher.cancel()

    app = FastAPI(lifespan=lifespan)

    @torch.inference_mode()
    def generate_batch(prompts: list[str], max_tokens: int) -> list[list[int]]:
        enc = tokenizer(prompts, return_tensors="pt", padding=True).to(device)
        out = model.generate(**enc, max_new_tokens=max_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
        answers = []
        for row in out[:, enc["input_ids"].shape[1]:].tolist():
            if tokenizer.eos_token_id in row:
                row = row[:row.index(tokenizer.eos_token_id) + 1]
            answers.append(row)
        return answers

    async def batch_loop() -> None:
        while True:
            batch = [await queue.get()]
            deadline = asyncio.get_running_loop().time() + batch_wait_timeout_s
            while len(batch) < max_batch_size:
                try:
                    batch.append(await asyncio.wait_for(
                        queue.get(), max(0.0, deadline - asyncio.get_running_loop().time())))
                except TimeoutError:
                    break
            try:
                answers = await asyncio.to_thread(generate_batch, [i.prompt for i in batch],
                                                  max(i.max_tokens for i in batch))
                for item, ids in zip(batch, answers, strict=True):
                    item.result.set_result(ids[:item.max_tokens])
            except Exception as exc:  # noqa: BLE001 - fail the batch, keep serving
                for item in batch:
                    if not item.result.done():
                        item.result.set_exception(exc)

    async def stream_tokens(ids: list[int]):
        for token in ids:
            yield f"data: {json.dumps({'text': tokenizer.decode([token]), 'tokens': 1})}\n\n"

    @app.post("/")
    async def handle_request(prompt: str, max_tokens: int = 64) -> StreamingResponse:
        item = Item(prompt, max_tokens)
        await queue.put(item)
        return StreamingResponse(stream_tokens(await item.result), media_type="text/event-stream")

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--batch-wait-timeout-s", type=float, default=0.05)
    args = parser.parse_args()
    app = make_app(args.model, args.max_batch_size, args.batch_wait_timeout_s)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
