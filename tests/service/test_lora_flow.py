"""LoRA adapters through the real Flow (LLM_LORA, as `make serve` reads it): listed as models of their
own, picked by the model name on every protocol the clients use, each answer its merged model's,
and an adapter that is not served refused with 404 naming the served ones."""
import openai
import pytest
import requests
from ollama import Client as OllamaClient

from contract import SamplingParams
from testing import lora_adapters
from testing.flows import start_flow
from tests.unit.test_batching import collect

PROMPT = "the quick brown fox jumps over a lazy dog while streams of tokens flow"


@pytest.fixture(scope="module")
def served(llama_model, tmp_path_factory):
    """(http port, the adapters' folders) of a Flow serving the tiny Llama with adapters a and b."""
    folders = lora_adapters.make(llama_model, tmp_path_factory.mktemp("adapters"))
    server, _, http_port = start_flow(llama_model, tmp_path_factory.mktemp("lora_flow"),
                                      env={"LLM_LORA": lora_adapters.spec(folders)})
    yield http_port, folders
    server.stop()


def test_the_adapters_are_listed_as_models(served):
    http_port, _ = served
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="none")
    assert [m.id for m in client.models.list().data][:3] == ["llama", "llama:a", "llama:b"]
    names = [m.model for m in OllamaClient(host=f"http://127.0.0.1:{http_port}").list().models]
    assert "llama:a" in names and "llama:b" in names
    info = requests.get(f"http://127.0.0.1:{http_port}/info", timeout=30).json()
    assert info["adapters"] == ["a", "b"]


async def test_each_adapter_answers_as_its_merged_model(served, make_engine):
    http_port, folders = served
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="none")

    def complete(model: str) -> str:
        return client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0).choices[0].text

    for name, folder in folders.items():
        merged = make_engine(str(lora_adapters.merged(folder)))
        expected = (await collect(merged, PROMPT, SamplingParams(max_tokens=12, ignore_eos=False)))[1]
        assert complete(f"llama:{name}") == complete(name) == expected
    assert complete("llama") != complete("llama:a")


def test_an_adapter_that_is_not_served_is_refused_naming_the_served_ones(served):
    http_port, _ = served
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="none")
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="llama:c", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert "llama:c" in str(err.value) and "llama:a" in str(err.value)
