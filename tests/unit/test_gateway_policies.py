"""The policies every protocol shares (gateway/mapping/policies.py, inputs.py's stop_list): each
decided once, the same for every protocol, and written nowhere else."""
import dataclasses
from pathlib import Path

import pytest

from contract import RequestLimits, SamplingParams, ServerInfo
from contract.limits import REASONING_EFFORT_BUDGETS
from gateway.mapping.inputs import BadRequest, stop_list
from gateway.mapping.policies import Handed, default_max_tokens, effort_budget, max_tokens_or_default, sampled
from gateway.protocols.openai_routes import OpenAI, openai_refusal
from gateway.protocols.responses_routes import Responses
from schemas import ModelOutputDocument

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
INFO = ServerInfo(model_id="m", max_context=512, max_tokens_limit=100, max_running=2, max_waiting=2,
                  max_batch_tokens=1024, max_prefill_tokens=512, **RequestLimits().as_dict(), dtype="float32",
                  device="cpu", chat_template=True, architecture="llama", parameters=1, weight_bytes=1)


@pytest.mark.parametrize("effort", list(REASONING_EFFORT_BUDGETS))
def test_an_effort_is_its_budget(effort):
    assert effort_budget(effort, "reasoning_effort") == {"reasoning_budget": REASONING_EFFORT_BUDGETS[effort]}


def test_no_effort_asks_for_no_budget():
    assert effort_budget(None, "reasoning_effort") == {}


@pytest.mark.parametrize("value", ["extreme", 3, ["low"], {"low": 1}])
def test_another_effort_is_refused_naming_the_field_as_the_request_named_it(value):
    with pytest.raises(BadRequest) as refused:
        effort_budget(value, "reasoning.effort", "reasoning")
    assert str(refused.value) == f"reasoning.effort: one of none, minimal, low, medium, high, got {value!r}"
    assert refused.value.param == "reasoning"
    with pytest.raises(BadRequest) as refused:
        effort_budget(value, "think", also="true, false or ")
    assert str(refused.value).startswith("think: true, false or one of none,") and refused.value.param == "think"


def test_the_default_length_is_half_the_context_within_the_limit():
    assert default_max_tokens(INFO) == 100  # half the context is 256: the limit bounds it
    assert default_max_tokens(dataclasses.replace(INFO, max_context=120)) == 60


async def test_the_backend_is_asked_only_when_the_client_gives_no_length():
    asked: list = []

    async def info(model):
        asked.append(model)
        return INFO

    assert await max_tokens_or_default(7, "m", info) == 7 and asked == []
    assert await max_tokens_or_default(0, "m", info) == 0 and asked == []  # 0 is a length (scores a prompt)
    assert await max_tokens_or_default(None, "m", info) == 100 and asked == ["m"]


@pytest.mark.parametrize("stop,kept,dropped", [
    (None, [], []), ("", [""], []), ("END", ["END"], ["END"]), ([], [], []),
    (["a", "", "b"], ["a", "", "b"], ["a", "b"]), (("a",), ["a"], ["a"])])
def test_a_stop_is_a_list(stop, kept, dropped):
    assert stop_list(stop) == kept
    assert stop_list(stop, drop_empty=True) == dropped


@pytest.mark.parametrize("do_sample", [None, False, True])
@pytest.mark.parametrize("temperature", [None, 0, 0.0, 0.7, 1])
def test_a_request_is_sampled_as_the_engine_decides(do_sample, temperature):
    params = SamplingParams(do_sample=bool(do_sample), **({} if temperature is None else {"temperature": temperature}))
    assert sampled(do_sample, temperature) is (not params.greedy)
    assert sampled(do_sample, temperature) is (bool(do_sample) and temperature != 0)


def test_a_stream_goes_on_from_the_requests_tokens_and_those_handed_since():
    handed = Handed([5, 6])  # the request itself went on from two tokens
    assert handed.generated_text("ab") == "ab"  # nothing resumed yet: the call's own text
    handed.sent([7], "a")
    handed.sent([8, 9], "bc")
    assert (handed.tokens, handed.text) == ([7, 8, 9], "abc")
    assert handed.resume_tokens() == [5, 6, 7, 8, 9]
    assert handed.generated_text("d") == "abcd"  # the new call counts from where it started
    assert handed.generated_text("") == "abc"  # a new call that ends with no text still has all the text
    handed.sent([10], "d")
    assert handed.resume_tokens() == [5, 6, 7, 8, 9, 10] and handed.generated_text("e") == "abcde"
    assert handed.resumes == 2


def test_responses_has_openais_errors_without_being_the_chat_encoder():
    assert not issubclass(Responses, OpenAI)
    error = ModelOutputDocument(finish_reason="error", error="temperature: must be >= 0", error_type="validation",
                                error_field="temperature")
    ours, openais = Responses().refusal(error), OpenAI().refusal(error)
    assert ours.status_code == openais.status_code == openai_refusal(error).status_code == 400
    assert ours.body == openais.body


@pytest.mark.parametrize("written", ["REASONING_EFFORT_BUDGETS[", "max_context // 2", "isinstance(req.stop, str)",
                                     "isinstance(p.stop, str)", "isinstance(o.stop, str)", "temperature != 0",
                                     "\"resume_tokens\": list("])
def test_each_policy_is_written_only_in_its_one_place(written):
    places = sorted(str(p.relative_to(GATEWAY)) for p in GATEWAY.rglob("*.py") if written in p.read_text())
    assert places in ([], ["mapping/policies.py"]), places
