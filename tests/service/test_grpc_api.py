"""The gRPC API as other languages see it: the shipped protos, strict errors at the edge,
the standard services, and a Node.js client (client/node) against a real Flow."""
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import grpc_tools
import pytest
from docarray.proto import NodeProto
from docarray.proto.pb import docarray_pb2
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from jina.proto import jina_pb2_grpc
from jina.proto.docarray_v2.pb import jina_pb2 as installed_jina_pb2
from jina.types.request.data import DataRequest, SingleDocumentRequest

from client import StreamError, stream
from tests.conftest import ROOT

NODE = ROOT / "client" / "node"
PROMPT = "naïve café 東京 the quick brown fox"


def _normalized(fd: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """Without the options we add, and without json_name, which only protoc's output carries."""
    fd.ClearField("options")
    stack = list(fd.message_type)
    while stack:
        message = stack.pop()
        stack += list(message.nested_type)
        for field in message.field:
            field.ClearField("json_name")
    return fd


def test_the_shipped_protos_compile_to_the_descriptors_the_packages_use(tmp_path):
    out = tmp_path / "set.pb"
    include = Path(grpc_tools.__file__).parent / "_proto"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{include}", f"-I{ROOT / 'proto'}",
                    f"--descriptor_set_out={out}", "jina.proto", "docarray.proto"], check=True, cwd=ROOT / "proto")
    compiled = {f.name: f for f in descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file}
    for name, module in (("jina.proto", installed_jina_pb2), ("docarray.proto", docarray_pb2)):
        installed = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(installed)
        assert compiled[name].options.go_package and compiled[name].options.java_package
        assert compiled[name].options.csharp_namespace
        assert _normalized(compiled[name]) == _normalized(installed), name
    sys.path.insert(0, str(ROOT / "proto"))
    import generate  # the committed files are what the generator writes now
    for module, package in ((docarray_pb2, "docarray"), (installed_jina_pb2, "jina")):
        text = (ROOT / "proto" / f"{package}.proto").read_text()
        assert generate.render(generate.file_descriptor(module), text.split("from ")[1].split(":")[0]) == text


def request(fields: dict, endpoint="/stream", request_id="req-7", parameters=None) -> SingleDocumentRequest:
    proto = SingleDocumentRequest().proto
    proto.header.request_id = request_id
    if endpoint is not None:
        proto.header.exec_endpoint = endpoint
    for name, node in fields.items():
        proto.document.data[name].CopyFrom(node)
    if parameters:
        proto.parameters.update(parameters)
    return SingleDocumentRequest(proto)


async def call(port: int, req) -> tuple[str, list]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        responses = []
        try:
            async for response in jina_pb2_grpc.JinaSingleDocumentRequestRPCStub(channel).stream_doc(req):
                responses.append(response)
            return "OK", responses
        except grpc.aio.AioRpcError as exc:
            return exc.code().name, [exc.details()]


def text(s: str) -> NodeProto:
    return NodeProto(text=s)


def integer(n: int) -> NodeProto:
    return NodeProto(integer=n)


@pytest.mark.parametrize("fields,field", [
    ({"prompt": integer(5)}, "prompt"),  # each was OK with no document
    ({"prompt": text("hi"), "max_tokens": text("4")}, "max_tokens"),  # each was coerced
    ({"prompt": text("hi"), "max_tokens": NodeProto(float=4.5)}, "max_tokens"),
    ({"prompt": text("hi"), "max_tokens": NodeProto()}, "max_tokens"),
    ({"prompt": text("hi"), "stop": text("x")}, "stop"),
    ({"prompt": text("hi"), "max_tokens": NodeProto(boolean=True)}, "max_tokens"),
    ({"prompt": text("hi"), "do_sample": text("true")}, "do_sample"),
    ({"prompt": text("hi"), "max_token": integer(3)}, "max_token"),  # a typo ran with the default
    ({"prompt": text("hi"), "seed": text("12ab")}, "seed"),
])
async def test_mistyped_and_unknown_fields_are_invalid_argument_naming_them(flow, fields, field):
    code, (details,) = await call(flow[0], request(fields))
    assert code == "INVALID_ARGUMENT" and details.startswith(f"{field}:"), details


def data_request(fields: dict) -> DataRequest:
    """A unary /generate request of one prompt document."""
    proto = installed_jina_pb2.DataRequestProto()
    proto.header.exec_endpoint = "/generate"
    document = proto.data.docs.docs.add()
    for name, node in fields.items():
        document.data[name].CopyFrom(node)
    return DataRequest(proto)


async def test_the_unary_generate_refuses_an_unknown_field_naming_it(flow):
    """process_single_data and JinaRPC/Call (Jina's Client.post), as stream_doc: the executor's
    DocArray would drop the field and run the typo with the default."""
    typo, ok = {"prompt": text("hi"), "max_token": integer(3)}, {"prompt": text("hi"), "max_tokens": integer(3)}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{flow[0]}") as channel:
        unary = jina_pb2_grpc.JinaSingleDataRequestRPCStub(channel).process_single_data
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await unary(data_request(typo))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details().startswith("max_token:"), refused.value.details()
        assert (await unary(data_request(ok))).header.status.code == 0
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            [r async for r in jina_pb2_grpc.JinaRPCStub(channel).Call(iter([data_request(typo)]))]
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details().startswith("max_token:"), refused.value.details()
        answers = [r async for r in jina_pb2_grpc.JinaRPCStub(channel).Call(iter([data_request(ok)]))]
        assert len(answers) == 1 and answers[0].header.status.code == 0


async def test_endpoints_parameters_and_request_ids(flow):
    port, ok = flow[0], {"prompt": text("hi"), "max_tokens": integer(3)}
    assert (await call(port, request(ok, endpoint="/nope")))[0] == "UNIMPLEMENTED"
    assert (await call(port, request(ok, endpoint=None)))[0] == "UNIMPLEMENTED"
    code, (details,) = await call(port, request(ok, endpoint="/generate"))
    assert code == "INVALID_ARGUMENT" and "unary" in details
    code, (details,) = await call(port, request(ok, parameters={"max_tokens": 5}))
    assert code == "INVALID_ARGUMENT" and details.startswith("parameters:")
    code, responses = await call(port, request(ok))
    assert code == "OK" and responses and all(r.header.request_id == "req-7" for r in responses)
    big = {**ok, "do_sample": NodeProto(boolean=True), "seed": text(str(2**64 - 1))}
    code, responses = await call(port, request(big))
    assert code == "OK" and responses[-1].document.data["seed"].text == str(2**64 - 1)


async def test_standard_health_and_reflection_v1(flow):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{flow[0]}") as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        for service in ("grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"):
            info = channel.stream_stream(f"/{service}/ServerReflectionInfo",
                                         request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                                         response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
            call = info(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
            names = {s.name for r in [await call.read()] for s in r.list_services_response.service}
            assert "jina.JinaSingleDocumentRequestRPC" in names, (service, names)


# ----- the Node.js client -----

@pytest.fixture(scope="module")
def node_client():
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed for the Node.js client (Debian: apt-get install nodejs npm)")
    subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE, check=True, timeout=300)
    return NODE / "stream.js"


def node(script: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["node", str(script), *args], capture_output=True, timeout=120)


def test_node_streams_the_same_bytes_as_the_python_client(flow, node_client):
    port = str(flow[0])
    python = subprocess.run([sys.executable, "-m", "client", PROMPT, "--port", port, "--max-tokens", "24"],
                            capture_output=True, timeout=120, cwd=ROOT)
    got = node(node_client, "--port", port, "--max-tokens", "24", PROMPT)
    assert got.returncode == 0 and python.returncode == 0, got.stderr
    assert got.stdout == python.stdout and len(got.stdout) > 1
    assert b"finish_reason=length generated_tokens=24" in got.stderr
    sampled = node(node_client, "--port", port, "--max-tokens", "4", "--do-sample", "--seed", str(2**64 - 1), "hi")
    assert sampled.returncode == 0 and f"seed={2**64 - 1}]".encode() in sampled.stderr


@pytest.mark.parametrize("args,status", [
    (["--document", '{"prompt": {"text": "hi"}, "max_tokens": {"text": "4"}}'], b"INVALID_ARGUMENT: max_tokens:"),
    (["--document", '{"prompt": {"text": "hi"}, "max_token": {"integer": 4}}'], b"INVALID_ARGUMENT: max_token:"),
    (["--endpoint", "/nope", "hi"], b"UNIMPLEMENTED: header.exec_endpoint"),
    (["--endpoint", "/generate", "hi"], b"INVALID_ARGUMENT: header.exec_endpoint"),
    (["--max-tokens", "0", "hi"], b"INVALID_ARGUMENT: max_tokens:"),
    (["--seed", str(2**64), "--do-sample", "hi"], b"INVALID_ARGUMENT: seed:"),
])
def test_each_refusal_reaches_node_as_its_status(flow, node_client, args, status):
    got = node(node_client, "--port", str(flow[0]), *args)
    assert got.returncode == 2 and got.stderr.startswith(status), got.stderr


def test_the_api_docs_give_the_encoding_of_every_field():
    from schemas import ModelOutputDocument, PromptDocument
    section = (ROOT / "docs" / "api.md").read_text().split("## The gRPC API")[1].split("\n## ")[0]
    for schema in (PromptDocument, ModelOutputDocument):
        table = section.split(f"| {schema.__name__} field |")[1].split("\n\n")[0]
        documented = {name.strip() for line in table.splitlines()[2:] for name in line.split("|")[1].split(",")}
        assert set(schema.model_fields) <= documented, set(schema.model_fields) - documented


@pytest.mark.parametrize("protocol", ["grpc", "http"])
async def test_n_answers_and_prompt_scores_over_grpc_and_sse(flow, protocol):
    """Interleaved answers, each with its choice_index and its own end; the stream ends after
    the last. The prompt's scores ride on each answer's first document."""
    port = flow[0] if protocol == "grpc" else flow[1]
    docs = [d async for d in stream("hello there", port=port, protocol=protocol, n=2, max_tokens=5, do_sample=True,
                                    seed=11, ignore_eos=True, prompt_logprobs=True, top_logprobs=2)]
    answers = {i: [d for d in docs if d.choice_index == i] for i in (0, 1)}
    assert sorted({d.choice_index for d in docs}) == [0, 1]
    for i, mine in answers.items():
        assert sum(len(d.token_ids) for d in mine) == 5 and mine[-1].finish_reason == "length"
        assert mine[-1].seed == 11 + i and all(d.finish_reason is None for d in mine[:-1])
        assert len(mine[0].prompt_logprobs) == len(mine[0].prompt_token_ids) - 1 > 0
        assert mine[0].prompt_alternative_counts == [2] * len(mine[0].prompt_logprobs)
        assert all(not d.prompt_token_ids for d in mine[1:])
    assert answers[0][0].prompt_logprobs == answers[1][0].prompt_logprobs
    alone = [d async for d in stream("hello there", port=port, protocol=protocol, max_tokens=5, do_sample=True,
                                     seed=12, ignore_eos=True)]
    assert [t for d in alone for t in d.token_ids] == [t for d in answers[1] for t in d.token_ids]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
async def test_a_prompt_given_as_token_ids(flow, protocol):
    """The same answer as the text those ids encode; ids beside a text prompt are refused."""
    port = flow[0] if protocol == "grpc" else flow[1]
    from_text = [d async for d in stream(PROMPT, port=port, protocol=protocol, max_tokens=6, ignore_eos=True,
                                         prompt_logprobs=True)]
    ids = list(from_text[0].prompt_token_ids)
    from_ids = [d async for d in stream("", port=port, protocol=protocol, max_tokens=6, ignore_eos=True,
                                        prompt_token_ids=ids)]
    assert [t for d in from_ids for t in d.token_ids] == [t for d in from_text for t in d.token_ids]
    assert from_ids[-1].generated_text == from_text[-1].generated_text and from_ids[0].prompt_tokens == len(ids)
    with pytest.raises(StreamError, match="prompt_token_ids"):
        [d async for d in stream(PROMPT, port=port, protocol=protocol, max_tokens=3, prompt_token_ids=ids)]
