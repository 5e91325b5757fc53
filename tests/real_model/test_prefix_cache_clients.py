"""Prefix caching as clients see it, with the trained default model: a conversation resent by
the openai SDK reuses its history (usage.prompt_tokens_details.cached_tokens, streamed or not),
the answers are transformers' own generate's on the same weights, and /metrics counts the hits under vLLM's names."""
import openai
import requests

from tests.real_model.test_real_model import ref, user  # noqa: F401 - the fixture

SYSTEM = {"role": "system", "content": "You are a terse assistant for a museum. " * 20}


def test_a_conversation_hits_the_cache_and_answers_as_without_it(real_flow, ref):  # noqa: F811
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{real_flow[1]}/v1", api_key="unused", max_retries=0)
    messages = [SYSTEM, *user("Where is the museum?")]
    first = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, temperature=0, max_tokens=16)
    messages += [{"role": "assistant", "content": first.choices[0].message.content}, *user("When does it open?")]
    second = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, temperature=0, max_tokens=16)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens <= cached < second.usage.prompt_tokens
    assert second.choices[0].message.content == ref.answer(messages, 16)
    chunks = list(client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, temperature=0, max_tokens=16,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == second.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= cached
    metrics = requests.get(f"http://127.0.0.1:{real_flow[1]}/metrics", timeout=10).text
    values = {line.split("{")[0]: float(line.split()[-1]) for line in metrics.splitlines()
              if line.startswith("vllm:prefix_cache")}
    assert values["vllm:prefix_cache_hits_total"] >= 2 * cached
    assert values["vllm:prefix_cache_queries_total"] > values["vllm:prefix_cache_hits_total"]
