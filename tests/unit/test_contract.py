"""The request contract: complete error tables, typed messages, and no upward imports."""
import pickle

import pytest

from contract import (
    ErrorKind,
    FinishReason,
    OverloadedError,
    RequestLimits,
    SamplingParams,
    ServerInfo,
    ValidationError,
    transport,
)

TABLES = {name: table for name, table in vars(transport).items() if name.isupper() and isinstance(table, dict)}


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_error_kind_has_a_code_on_every_transport(name):
    assert set(TABLES[name]) == set(ErrorKind), f"{name} lacks {set(ErrorKind) - set(TABLES[name])}"


def test_an_unknown_error_type_is_internal():
    assert transport.error_kind("validation") is ErrorKind.VALIDATION
    assert transport.error_kind("no such kind") is ErrorKind.INTERNAL
    assert transport.error_kind(None) is ErrorKind.INTERNAL


def test_server_info_round_trips_as_json():
    info = ServerInfo(model_id="m", max_context=512, max_tokens_limit=100, max_running=2, max_waiting=3,
                      max_batch_tokens=1024, max_prefill_tokens=64, **RequestLimits(max_messages=12).as_dict(),
                      device="cpu", dtype="fp32", chat_template=False)
    assert ServerInfo.from_json(info.to_json()) == info and info.max_concurrent == 5


def test_engine_messages_cross_the_pipe_and_replay_on_the_observer():
    from engine.messages import (
        Ack,
        AddRequest,
        Admitted,
        Finished,
        Prefilled,
        Prepared,
        StepOutputs,
        TokenTimed,
        replay,
    )
    from engine.observer import EngineObserver
    from engine.outputs import RequestOutput

    add = AddRequest("r1", Prepared([1, 2, 3], SamplingParams(max_tokens=4), None))
    assert pickle.loads(pickle.dumps(add)) == add
    step = StepOutputs([Ack("r1"), Ack("r2", OverloadedError())], [RequestOutput("r1", [5], ["a"], [-0.1], [False], 0)],
                       [Admitted(0.1), Prefilled(3, 2), TokenTimed(True, 0.2), Finished(FinishReason.LENGTH, 0.3)], {})
    back = pickle.loads(pickle.dumps(step))
    assert back.outputs == step.outputs and isinstance(back.acks[1].error, OverloadedError)

    calls = []

    class Seen(EngineObserver):
        def admitted(self, q): calls.append(("admitted", q))
        def prefilled(self, n, cached=None): calls.append(("prefilled", n, cached))
        def token(self, first, since): calls.append(("token", first, since))
        def finished(self, reason, e2e): calls.append(("finished", reason, e2e))

    for event in back.events:
        replay(event, Seen())
    assert calls == [("admitted", 0.1), ("prefilled", 3, 2), ("token", True, 0.2),
                     ("finished", FinishReason.LENGTH, 0.3)]


def test_one_output_record_merges_tokens_and_keeps_each_tokens_fields():
    from engine.outputs import RequestOutput
    parts = [RequestOutput("r", [i], [t], [-float(i)], [i == 1], i) for i, t in enumerate(["a", "", "bc"])]
    parts[-1].finish_reason = FinishReason.LENGTH
    merged = RequestOutput.merge(parts)
    assert (merged.token_ids, merged.texts, merged.logprobs, merged.special) == (
        [0, 1, 2], ["a", "", "bc"], [0.0, -1.0, -2.0], [False, True, False])
    assert merged.text == "abc" and merged.index == 2 and merged.ends
    assert RequestOutput.failure("r", "boom").ends and RequestOutput.failure("r", "boom").token_ids == []


def test_validation_errors_name_their_field_and_pickle():
    with pytest.raises(ValidationError) as err:
        SamplingParams(top_p=2.0).validate(100)
    assert err.value.field == "top_p"
    again = pickle.loads(pickle.dumps(err.value))
    assert (again.field, str(again)) == ("top_p", str(err.value))


def test_every_finish_reason_has_a_metrics_label():
    from executors.metrics import FINISHED
    assert set(FINISHED) == set(FinishReason)


def test_the_gateways_variables_are_read_into_one_record():
    from gateway.config import GatewayConfig
    assert GatewayConfig.from_env({}) == GatewayConfig()
    read = GatewayConfig.from_env({
        "LLM_HOST": "127.0.0.1", "LLM_API_KEY": "k", "LLM_CORS_ORIGINS": " https://a.example/ ,*", "LLM_HTTP_DEBUG": "yes",
        "LLM_ROUTER": "round-robin", "LLM_ROUTER_POLL_MS": "250", "LLM_ROUTER_WAIT_S": "3", "LLM_ROUTER_BALANCE_ABS": "2",
        "LLM_ROUTER_BALANCE_REL": "2.5", "LLM_ROUTER_MIN_MATCH": "0.5", "LLM_ROUTER_RESOLVE": "1"})
    assert read == GatewayConfig("127.0.0.1", "k", ("https://a.example", "*"), True, "round-robin", 0.25, 3.0, 2, 2.5,
                                 0.5, True)
