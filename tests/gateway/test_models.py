"""Several models behind one gateway: a request goes to the model it names (the first when it
names none), and a name that no served model has is refused with 404 before any work, in each
protocol's error shape, naming the served ones."""
from dataclasses import replace

import pytest

from contract import with_adapters
from contract.errors import ModelNotServedError
from gateway.fleet.models import ModelFleets
from tests.gateway.fake_upstream import INFO

SECOND = replace(INFO, model_id="second-model", max_context=1024)
HI = [{"role": "user", "content": "hi"}]
ROUTES = {  # route: (its minimal request, where the model's name goes)
    "/v1/completions": {"prompt": "hi"},
    "/v1/chat/completions": {"messages": HI},
    "/v1/messages": {"max_tokens": 4, "messages": HI},
    "/v1/responses": {"input": "hi"},
    "/api/chat": {"messages": HI, "stream": False},
    "/api/generate": {"prompt": "hi", "stream": False},
    "/generate": {"inputs": "hi"},
}


def _named(route: str, name: str) -> dict:
    body = dict(ROUTES[route])
    if route == "/generate":  # TGI's request has no model: the engine's field, among its parameters
        return {**body, "parameters": {"model": name}}
    return {**body, "model": name}


@pytest.mark.parametrize("route", ROUTES)
def test_an_unknown_model_is_refused_with_404_naming_the_served_ones(http, fake, route):
    fake.served = [INFO, SECOND]
    r = http.post(route, json=_named(route, "gpt-4o"))
    assert r.status_code == 404, r.text
    assert "gpt-4o" in r.text and "fake-model" in r.text and "second-model" in r.text
    assert not fake.sent  # refused before any work


@pytest.mark.parametrize("route", ROUTES)
def test_each_request_goes_to_the_model_it_names(http, fake, route):
    fake.served = [INFO, SECOND]
    r = http.post(route, json=_named(route, "second-model"))
    assert r.status_code == 200, r.text
    assert fake.sent[-1].model == "second-model"
    if route.startswith("/v1/"):  # the answer names the model that gave it
        assert r.json()["model"] == "second-model"
    http.post(route, json=ROUTES[route] if route != "/api/chat" and route != "/api/generate"
              else _named(route, "fake-model:latest"))
    assert fake.sent[-1].model in (None, "fake-model")  # none named: the first


def test_the_model_lists_name_every_served_model(http, fake):
    fake.served = [INFO, SECOND]
    cards = http.get("/v1/models").json()["data"]
    assert [(c["id"], c["max_model_len"]) for c in cards] == [("fake-model", 512), ("second-model", 1024),
                                                               ("fake-embedder", 16)]
    assert [m["name"] for m in http.get("/api/tags").json()["models"]] == [
        "fake-model:latest", "second-model:latest", "fake-embedder:latest"]
    shown = http.post("/api/show", json={"model": "second-model"}).json()
    assert shown["model_info"]["llama.context_length"] == 1024


def test_keep_alive_goes_with_the_request_and_an_empty_one_loads_or_unloads(http, fake):
    assert http.post("/api/chat", json={"model": "fake-model", "messages": HI, "stream": False,
                                        "keep_alive": "10m"}).status_code == 200
    assert fake.sent[-1].keep_alive == 600
    http.post("/api/chat", json={"model": "fake-model", "messages": HI, "stream": False, "keep_alive": -1})
    assert fake.sent[-1].keep_alive == -1  # for good
    loaded = http.post("/api/generate", json={"model": "fake-model"}).json()
    stopped = http.post("/api/generate", json={"model": "fake-model", "keep_alive": 0}).json()  # `ollama stop`
    assert (loaded["done_reason"], stopped["done_reason"]) == ("load", "unload")
    assert fake.kept == [("fake-model", None), ("fake-model", 0.0)]
    r = http.post("/v1/completions", json={"prompt": "hi", "keep_alive": "soon"})
    assert r.status_code == 400 and "keep_alive" in r.text  # every protocol's field: seconds


def test_the_states_of_the_models_are_listed(http, fake):
    fake.served = [replace(INFO, expires_at=1_900_000_000.0), replace(SECOND, state="unloaded")]
    cards = http.get("/v1/models").json()["data"]
    assert [(c["id"], c["state"]) for c in cards] == [("fake-model", "loaded"), ("second-model", "unloaded"),
                                                      ("fake-embedder", "loaded")]
    running = http.get("/api/ps").json()["models"]
    assert [(m["name"], m["expires_at"]) for m in running] == [("fake-model:latest", "2030-03-17T17:46:40Z"),
                                                               ("fake-embedder:latest", "9999-12-31T23:59:59Z")]


def test_tokenize_and_a_chats_default_length_are_the_named_models(http, fake):
    fake.served = [INFO, replace(SECOND, max_tokens_limit=1000)]
    r = http.post("/tokenize", json={"model": "second-model", "prompt": "ab"})
    assert r.status_code == 200 and r.json()["max_model_len"] == 1024 and fake.sent[-1].model == "second-model"
    http.post("/detokenize", json={"model": "second-model", "tokens": [97]})
    assert fake.sent[-1].model == "second-model"
    r = http.post("/tokenize", json={"model": "gpt-4o", "prompt": "ab"})
    assert r.status_code == 404 and "second-model" in r.text
    http.post("/v1/chat/completions", json={"model": "second-model", "messages": HI})
    assert fake.sent[-1].max_tokens == 512  # half its context (1024), not the first's limit (100)


def test_a_models_lora_adapters_are_listed_and_named_as_models(http, fake):
    """A model's adapters (EngineConfig.lora) are models of their own in every list, `MODEL:adapter`,
    and a request names one so or by its bare name."""
    fake.served = [*with_adapters(replace(INFO, adapters=["sql", "poet"])), SECOND]
    cards = [c["id"] for c in http.get("/v1/models").json()["data"]]
    assert cards == ["fake-model", "fake-model:sql", "fake-model:poet", "second-model", "fake-embedder"]
    assert "fake-model:sql" in [m["name"] for m in http.get("/api/tags").json()["models"]]
    for name in ("fake-model:sql", "sql"):
        r = http.post("/v1/chat/completions", json={"messages": HI, "model": name})
        assert r.status_code == 200, r.text
    r = http.post("/v1/chat/completions", json={"messages": HI, "model": "fake-model:nope"})
    assert r.status_code == 404 and "fake-model:sql" in r.text


async def test_the_gateway_routes_an_adapter_to_its_models_fleet():
    class Fleet:
        def __init__(self, info):
            self.info = info

        async def one(self, endpoint):
            return self.info.to_json()

        async def unary(self, endpoint):
            return self.info.to_json()

    first, second = Fleet(replace(INFO, adapters=["sql"])), Fleet(replace(SECOND, adapters=["sql"]))
    fleets = ModelFleets([first, second])
    assert await fleets.find("second-model:sql") == (second, "second-model:sql", "sql")
    assert await fleets.find("sql") == (first, "fake-model:sql", "sql")  # a bare name: the first model that has it
    assert await fleets.find("fake-model") == (first, "fake-model", None)
    with pytest.raises(ModelNotServedError):
        await fleets.find("third:sql")
    assert [i["model_id"] for i in await fleets.infos()] == ["fake-model", "fake-model:sql", "second-model",
                                                               "second-model:sql"]
