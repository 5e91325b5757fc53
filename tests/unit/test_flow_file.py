"""flows/llm.yml runs as typed (no `${{ ENV.X }}` that an unset variable would leave unparsed), and the
Flow that `make serve` runs applies LLM_GRPC_PORT, LLM_HTTP_PORT, LLM_REPLICAS and LLM_MODELS to a copy."""
import pytest
import yaml

from deploy.flow_models import write_flow
from tests.conftest import ROOT

FLOW = str(ROOT / "flows" / "llm.yml")


def read(path: str) -> dict:
    return yaml.safe_load(open(path).read())


def test_the_flow_file_needs_no_variable():
    text = open(FLOW).read()
    assert "${{" not in "".join(line.split("#")[0] for line in text.splitlines())
    flow = read(FLOW)
    assert flow["gateway"]["port"] == [12345, 12346]
    assert next(e for e in flow["executors"] if e["name"] == "llm")["replicas"] == 1
    assert "${{" not in open(ROOT / "jina.yml").read().split("jtype")[1]  # the model: LLM_MODEL, else the default


def test_no_variable_runs_the_file_itself(tmp_path):
    assert write_flow(FLOW, [], tmp_path / "flow.yml", {}) == FLOW
    assert write_flow(FLOW, [], tmp_path / "flow.yml", {"LLM_GRPC_PORT": "12345", "LLM_REPLICAS": "1"}) == FLOW


def test_variables_override_the_ports_and_replicas(tmp_path):
    written = write_flow(FLOW, ["a", "b"], tmp_path / "flow.yml",
                         {"LLM_GRPC_PORT": "50051", "LLM_HTTP_PORT": "8080", "LLM_REPLICAS": "2"})
    flow = read(written)
    assert flow["gateway"]["port"] == [50051, 8080]
    generating = {e["name"]: e for e in flow["executors"] if e["name"] != "embedder"}
    assert {name: (e["replicas"], e["uses_with"]["model"]) for name, e in generating.items()} == {
        "llm": (2, "a"), "llm_2": (2, "b")}
    assert "replicas" not in next(e for e in flow["executors"] if e["name"] == "embedder")


@pytest.mark.parametrize("name,value", [("LLM_HTTP_PORT", "80a"), ("LLM_GRPC_PORT", "70000"), ("LLM_REPLICAS", "0")])
def test_a_bad_value_is_refused_naming_its_variable(tmp_path, name, value):
    with pytest.raises(ValueError, match=name):
        write_flow(FLOW, [], tmp_path / "flow.yml", {name: value})


def test_every_executor_allows_the_gateways_keepalive_pings(tmp_path):
    """gRPC's server defaults drop an idle connection whose client pings every 10 s, as Jina's
    channels do, with GOAWAY "too_many_pings" (gateway/fleet/channels.py): each executor's server
    takes PING_POLICY, in the Flow as typed, in the copy with several models and in the export's."""
    from gateway.fleet.channels import PING_POLICY
    several = write_flow(FLOW, ["models/a", "models/b"], tmp_path / "flow.yml", {})
    for path in (FLOW, several, str(ROOT / "deploy" / "flow.yml")):
        executors = read(path)["executors"]
        assert executors and all(e.get("grpc_server_options") == PING_POLICY for e in executors), path
    assert all(name.startswith(("grpc.keepalive_", "grpc.http2.")) for name in PING_POLICY)  # names gRPC reads
