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
    kw = dict(model="SmolLM2-135M-Instruct", messages=user(QUESTION), temperature=0, max_tokens=8, logprobs=True, top_logprobs=5)
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
    c = client.completions.create(model="SmolLM2-135M-Instruct", prompt="The capital of France is", max_tokens=4, temperature=0,
                                  logprobs=3).choices[0]
    assert "".join(c.logprobs.tokens) == c.text and len(c.logprobs.top_logprobs[0]) == 3
    assert c.logprobs.text_offset[0] == 0 and all(lp <= 0 for lp in c.logprobs.token_logprobs)
    from langchain_openai import ChatOpenAI
    llm = ChatOpenAI(base_url=f"http://127.0.0.1:{real_flow[1]}/v1", api_key="unused", model="SmolLM2-135M-Instruct", temperature=0,
                     max_tokens=8, max_retries=0, logprobs=True)
    message = llm.invoke(QUESTION)
    content = message.response_metadata["logprobs"]["content"]
    assert "".join(t["token"] for t in content).removesuffix("<|im_end|>") == message.content and all(t["logprob"] <= 0 for t in content)


def test_openai_sdk_scores_a_prompt_with_echo(real_flow, ref):
    """Completions' echo with logprobs, as evaluation harnesses send it: the prompt's tokens
    scored against a forward pass, the first one null; max_tokens 0 scores without
    generating, and generating after it changes none of the prompt's numbers."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{real_flow[1]}/v1", api_key="unused", max_retries=0)
    prompt = "The capital of France is Paris, and the capital of Italy is Rome."
    kw = dict(model="SmolLM2-135M-Instruct", prompt=prompt, echo=True, logprobs=2, temperature=0)
    only = client.completions.create(max_tokens=0, **kw).choices[0]
    ids = ref.tok(prompt)["input_ids"]
    assert only.text == prompt and only.logprobs.tokens == [ref.tok.decode([i]) for i in ids]
    with torch.no_grad():
        rows = torch.log_softmax(ref.model(torch.tensor([ids])).logits[0].float(), -1)
    assert only.logprobs.token_logprobs[0] is None and only.logprobs.top_logprobs[0] is None
    assert only.logprobs.token_logprobs[1:] == pytest.approx([float(rows[k, t]) for k, t in enumerate(ids[1:])],
                                                             abs=1e-3)
    for k, top in enumerate(only.logprobs.top_logprobs[1:]):
        assert list(top) == [ref.tok.decode([t]) for t in rows[k].topk(2).indices.tolist()]
    more = client.completions.create(max_tokens=3, **kw).choices[0]
    assert more.text.startswith(prompt) and len(more.logprobs.tokens) == len(ids) + 3
    assert more.logprobs.token_logprobs[:len(ids)] == only.logprobs.token_logprobs
    assert more.logprobs.text_offset[len(ids)] == len(prompt)


def test_n_choices_through_the_openai_sdk_and_tgi_best_of(real_flow):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{real_flow[1]}/v1", api_key="unused", max_retries=0)
    kw = dict(model="SmolLM2-135M-Instruct", messages=user(QUESTION), max_tokens=12, n=3, seed=7, temperature=1.2)
    whole = client.chat.completions.create(**kw)
    assert [c.index for c in whole.choices] == [0, 1, 2] and len({c.message.content for c in whole.choices}) > 1
    one = client.chat.completions.create(**{**kw, "n": 1})
    assert whole.usage.prompt_tokens == one.usage.prompt_tokens
    assert whole.choices[0].message.content == one.choices[0].message.content  # answer 0 keeps the seed
    streamed: dict[int, str] = {}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
    assert streamed == {c.index: c.message.content for c in whole.choices}
    from huggingface_hub import InferenceClient
    tgi = InferenceClient(f"http://127.0.0.1:{real_flow[1]}")
    out = tgi.text_generation("The capital of France is", max_new_tokens=5, best_of=2, do_sample=True, details=True,
                              decoder_input_details=True)
    assert len(out.details.best_of_sequences) == 1 and out.details.prefill[0].logprob is None
    best, other = out.details, out.details.best_of_sequences[0]
    assert sum(t.logprob for t in best.tokens) >= sum(t.logprob for t in other.tokens)
