"""Reproduces the Ray Serve / FastAPI streaming recipe: TextIteratorStreamer + model.generate in a thread per request, behind a StreamingResponse (uvicorn).

As in Ray Serve's "Streaming" guide (Textbot): generate runs via the loop's default
thread pool (`run_in_executor(None, ...)`), the response polls the streamer with
timeout=0 and sleeps 1 ms on Empty. Instrumentation added for the benchmark: each
text piece goes out as an SSE event `{"text", "tokens"}` (tokens the piece covers:
TextIteratorStreamer holds text back until a word ends), instead of bare text.
Run: python -m benchmarks.peers.hf_streamer --model PATH --port P
"""
import argparse
import asyncio
import json
from queue import Empty

import uvicorn
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer

from benchmarks.peers import pick_device_dtype


class CountingStreamer(TextIteratorStreamer):
    """TextIteratorStreamer whose items are (text, tokens covered since the previous item)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._count = 0

    def put(self, value) -> None:
        if not (self.skip_prompt and self.next_tokens_are_prompt):
            self._count += value.numel()
        super().put(value)

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        self.text_queue.put((text, self._count), timeout=self.timeout)
        self._count = 0
        if stream_end:
            self.text_queue.put(self.stop_signal, timeout=self.timeout)


def make_app(model_path: str) -> FastAPI:
    app = FastAPI()
    device, dtype = pick_device_dtype()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval()

    def generate_text(prompt: str, max_tokens: int, streamer: TextIteratorStreamer) -> None:
        input_ids = tokenizer([prompt], return_tensors="pt").input_ids.to(device)
        model.generate(input_ids, streamer=streamer, max_new_tokens=max_tokens, do_sample=False,
                       pad_token_id=tokenizer.eos_token_id)

    async def consume_streamer(streamer: TextIteratorStreamer):
        pending = 0
        while True:
            try:
                for text, tokens in streamer:
                    pending += tokens
                    if text:  # an empty piece reaches no client of the recipe
                        yield f"data: {json.dumps({'text': text, 'tokens': pending})}\n\n"
                        pending = 0
                break
            except Empty:
                await asyncio.sleep(0.001)
        if pending:
            yield f"data: {json.dumps({'text': '', 'tokens': pending})}\n\n"

    @app.post("/")
    async def handle_request(prompt: str, max_tokens: int = 64) -> StreamingResponse:
        streamer = CountingStreamer(tokenizer, timeout=0, skip_prompt=True, skip_special_tokens=True)
        asyncio.get_running_loop().run_in_executor(None, generate_text, prompt, max_tokens, streamer)
        return StreamingResponse(consume_streamer(streamer), media_type="text/event-stream")

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(make_app(args.model), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
