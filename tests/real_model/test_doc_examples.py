"""Every example output in README.md and docs/ is what the service gives now, on the default
model (testing/doc_examples.py). A console example's commands are read from the document and
run; a response's request is the one the document shows. `LLM_WRITE_EXAMPLES=1` writes the
answers back into the documents instead of comparing."""
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from typing import TypeVar

import grpc
import pytest
import requests
from google.protobuf import json_format

from testing import doc_examples
from testing.doc_examples import ROOT, Example, mask

WRITE = os.environ.get("LLM_WRITE_EXAMPLES") == "1"
Ports = tuple[int, int]  # (grpc, http)
T = TypeVar("T")
PRODUCERS: dict[str, Callable[[Example, Ports], str]] = {}


def producer(*names: str) -> Callable:
    def register(fn: Callable[[Example, Ports], str]) -> Callable:
        for name in names:
            PRODUCERS[name] = fn
        return fn
    return register


def readme_chat_body() -> dict:
    readme = (ROOT / "README.md").read_text()
    return json.loads(re.search(r"-d '(\{.*?\})'", readme.split("README-CURL-BODY")[1]).group(1))


@producer("readme-chat-completion")
def chat_completion(example: Example, ports: Ports) -> str:
    """The README's first curl, its body as written: greedy, so the answer is the same on every
    CPU (tests/real_model/test_golden.py holds it to the golden file)."""
    r = requests.post(f"http://127.0.0.1:{ports[1]}/v1/chat/completions", json=readme_chat_body(), timeout=120)
    assert r.status_code == 200, r.text
    answer = r.json()
    answer["id"] = answer["id"][:9] + "..."
    return json.dumps(answer, ensure_ascii=False, indent=1)


@producer("api-structured-answer")
def structured_answer(example: Example, ports: Ports) -> str:
    doc = (ROOT / "docs" / "api.md").read_text()
    body = json.loads(doc.split("<!-- STRUCTURED-EXAMPLE -->")[1].split("```")[1].removeprefix("json\n"))
    r = requests.post(f"http://127.0.0.1:{ports[1]}/v1/chat/completions", json=body, timeout=120)
    return f"`{r.json()['choices'][0]['message']['content']}`"


@producer("api-ollama-chat")
def ollama_chat(example: Example, ports: Ports) -> str:
    """The curl's body, posted; the fields its jq filter keeps, as jq -c prints them."""
    command = example.content().splitlines()[0]
    body = json.loads(re.search(r"-d '(\{.*?\})'", command).group(1))
    r = requests.post(f"http://127.0.0.1:{ports[1]}/api/chat", json=body, timeout=120)
    assert r.status_code == 200, r.text
    answer = r.json()
    kept = {"content": answer["message"]["content"],
            **{k: answer[k] for k in ("done_reason", "prompt_eval_count", "eval_count")}}
    return f"{command}\n{json.dumps(kept, ensure_ascii=False, separators=(',', ':'))}"


@producer("clients-cli")
def cli_session(example: Example, ports: Ports) -> str:
    """Each `$ python -m client ...` line of the example, run against the service."""
    lines = []
    for command in (line[2:] for line in example.content().splitlines() if line.startswith("$ ")):
        argv = shlex.split(command)
        assert argv[:3] == [".venv/bin/python", "-m", "client"], command
        port = ports[1] if "--protocol" in argv and argv[argv.index("--protocol") + 1] == "http" else ports[0]
        done = subprocess.run([sys.executable, *argv[1:], "--port", str(port)], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        lines += [f"$ {command}", done.stdout.rstrip("\n"), done.stderr.strip().splitlines()[-1]]
    return "\n".join(lines)


def one_per_token(ask: Callable[[], T], merged: Callable[[T], bool], tries: int = 5) -> T:
    """An answer whose documents carry one token each: a reader that falls behind (a loaded
    machine) gets several tokens in one document, the same content in fewer documents, while the
    examples show one per token; such an answer is asked again, a few times at most."""
    answer = ask()
    for _ in range(tries - 1):
        if not merged(answer):
            break
        answer = ask()
    return answer


@producer("api-sse")
def sse_session(example: Example, ports: Ports) -> str:
    """The example's `curl -N` of Jina's SSE route, each document's id and the stream's cut short."""
    command = example.content().splitlines()[0]
    url = shlex.split(command[2:])[-1].replace("localhost:12346", f"127.0.0.1:{ports[1]}")
    def ask() -> str:
        return requests.get(url, timeout=120).text.replace("\r\n", "\n")

    def merged(body: str) -> bool:
        return any(len(json.loads(line[len("data: "):])["token_ids"]) > 1
                   for line in body.splitlines() if line.startswith("data: "))
    body = one_per_token(ask, merged)
    body = re.sub(r'"id": "(\w{6})\w*"', r'"id": "\1..."', body)
    body = re.sub(r"^id: strm_(\w{6})\w*/", r"id: strm_\1.../", body, flags=re.M)
    return command + "\n" + body.rstrip("\n")


@producer("api-grpc-buf")
def grpc_session(example: Example, ports: Ports) -> str:
    """The example's gRPC request, its first answer as protojson (what `buf curl` prints), the
    document's data cut to its first fields."""
    from jina.proto import jina_pb2
    content = example.content()
    command = content[:content.index("\n{")]
    request = json.loads(re.search(r"-d '(\{.*?\})'", command, re.S).group(1))
    message = json_format.ParseDict(request, jina_pb2.SingleDocumentRequestProto())
    with grpc.insecure_channel(f"127.0.0.1:{ports[0]}") as channel:  # raw protobuf, as another language's stub
        call = channel.unary_stream("/jina.JinaSingleDocumentRequestRPC/stream_doc",
                                    request_serializer=jina_pb2.SingleDocumentRequestProto.SerializeToString,
                                    response_deserializer=jina_pb2.SingleDocumentRequestProto.FromString)
        first = one_per_token(lambda: next(iter(call(message, timeout=120))),
                              lambda reply: len(reply.document.data["token_ids"].list.data) > 1)
    answer = json_format.MessageToDict(first)
    data = answer["document"]["data"]
    shown = json.dumps({key: data[key] for key in ("text", "index", "logprob")}, ensure_ascii=False)[:-1] + ", ...}"
    request_id = answer["header"]["requestId"][:8]
    return f'{command}\n{{\n  "header": {{"requestId": "{request_id}..."}},\n  "document": {{"data": {shown}}}\n}}\n...'


@pytest.mark.parametrize("name", sorted(doc_examples.examples()))
def test_the_documents_example_is_what_the_service_gives(name, real_flow):
    example = doc_examples.examples()[name]
    assert name in PRODUCERS, f"{example.document}: example {name} has no producer in this test"
    produced = PRODUCERS[name](example, real_flow)
    if WRITE:
        doc_examples.write(example, produced)
        return
    assert mask(example.content()).rstrip() == mask(produced).rstrip(), (
        f"{example.document}'s example {name} drifted (LLM_WRITE_EXAMPLES=1 rewrites it):\n{produced}")
