"""Log probabilities with the trained default model, read by the openai SDK and LangChain, and
checked against a direct forward pass of the same weights."""
import openai
import pytest
import torch

from tests.real_model.test_real_model import Reference, user

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def ref(real_model) -> Reference:
    return Reference(real_model)


def test_openai_sdk_chat_logprobs_equal_a_forward_pass(real_flow, ref):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{real_flow[1]}/v1", api_key="unused", max_retries=0)
    kw = dict(model="m", messages=user(QUESTION), temperature=0, max_tokens=8, logprobs=True, top_logprobs=5)
    choice = client.chat.completions.create(**kw).choices[0]
    content = choice.logprobs.content
    assert "".join(c.token for c in content).removesuffix("<|im_end|>") == choice.message.content  # the EOS is scored too
    prompt = ref.prompt_ids(user(QUESTION))
    ids = [ref.tok.convert_tokens_to_ids(ref.tok.tokenize(c.token))[0] for c in content]
    with torch.no_grad():
        rows = torch.log_softmax(ref.model(torch.tensor([prompt + ids])).logits[0].float(), -1)
    for k, entry in enumerate(content):
        row = rows[len(prompt) - 1 + k]
        values, top = row.topk(5)
        assert [ref.tok.decode([t]) for t in top.tolist()] == [a.token for a in entry.top_logprobs]
        assert [a.logprob for a in entry.top_logprobs] == pytest.approx(values.tolist(), abs=2e-2)
        assert entry.logprob == entry.top_logprobs[0].logprob  # greedy: the likeliest
        assert entry.bytes == list(entry.token.encode())
    streamed = [c for chunk in client.chat.completions.create(stream=True, **kw)
                if chunk.choices and chunk.choices[0].logprobs for c in chunk.choices[0].logprobs.content]
    assert [(c.token, c.logprob, [a.token for a in c.top_logprobs]) for c in streamed] == [
        (c.token, c.logprob, [a.token for a in c.top_logprobs]) for c in content]


def test_openai_completions_and_langchain_read_logprobs(real_flow):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{real_flow[1]}/v1", api_key="unused", max_retries=0)
    c = client.completions.create(model="m", prompt="The capital of France is", max_tokens=4, temperature=0,
                                  logprobs=3).choices[0]
    assert "".join(c.logprobs.tokens) == c.text and len(c.logprobs.top_logprobs[0]) == 3
    assert c.logprobs.text_offset[0] == 0 and all(lp <= 0 for lp in c.logprobs.token_logprobs)
    from langchain_openai import ChatOpenAI
    llm = ChatOpenAI(base_url=f"http://127.0.0.1:{real_flow[1]}/v1", api_key="unused", model="m", temperature=0,
                     max_tokens=8, max_retries=0, logprobs=True)
    message = llm.invoke(QUESTION)
    content = message.response_metadata["logprobs"]["content"]
    assert "".join(t["token"] for t in content).removesuffix("<|im_end|>") == message.content and all(t["logprob"] <= 0 for t in content)
