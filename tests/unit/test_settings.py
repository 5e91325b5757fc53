"""contract/settings.py: the one reader of the LLM_* variables, its one rule, and the docs' table."""
import ast
import os
import re
from dataclasses import fields
from pathlib import Path

import pytest

from contract import EngineConfig, ValidationError
from contract.limits import RequestLimits, ResumeLimits
from contract.settings import OFF, ON, SETTINGS, markdown_table, read
from tests.conftest import ROOT

PRODUCT = ("contract", "engine", "executors", "gateway", "schemas", "client")
READER = Path("contract") / "settings.py"
DOCS = ROOT / "docs" / "configuration.md"
_TABLE = re.compile(r"<!-- variables -->\n(?P<table>.*?)<!-- /variables -->", re.S)


def _names_llm(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("LLM_")
               for n in ast.walk(node))


def _touches_environment(node: ast.AST) -> bool:
    return any((isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv"))
               or (isinstance(n, ast.Name) and n.id in ("environ", "getenv")) for n in ast.walk(node))


def environment_reads(source: str) -> list[int]:
    """Lines that read an LLM_ variable from the environment: `os.environ[...]`, `.get(...)`,
    `in os.environ`, `os.getenv(...)`, and `.get("LLM_...")` or `["LLM_..."]` on an alias of it."""
    lines = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            keyed = isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop", "setdefault")
            if _names_llm(ast.Tuple(elts=list(node.args), ctx=ast.Load())) and (
                    keyed or _touches_environment(node.func)):
                lines.add(node.lineno)
        elif isinstance(node, ast.Subscript) and _names_llm(node.slice):
            lines.add(node.lineno)
        elif isinstance(node, ast.Compare) and _names_llm(node.left) and any(
                isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and _touches_environment(node):
            lines.add(node.lineno)
    return sorted(lines)


def test_the_scan_finds_every_way_of_reading_a_variable():
    source = '\n'.join(['import os', 'from os import environ, getenv', 'env = os.environ',
                        'a = os.environ.get("LLM_A")', 'b = os.environ["LLM_B"]', 'c = "LLM_C" in os.environ',
                        'd = os.getenv("LLM_D", "")', 'e = env.get("LLM_E")', 'f = environ["LLM_F"]',
                        'g = getenv("LLM_G")', 'h = os.environ.get("HOME")', 'i = os.environ.get("LLM_" + "I")'])
    assert environment_reads(source) == [4, 5, 6, 7, 8, 9, 10, 12]


def test_only_contract_settings_reads_llm_variables():
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if relative == READER:
                continue
            found += [f"{relative}:{line}" for line in environment_reads(path.read_text())]
    assert not found, f"LLM_* read outside contract/settings.py (declare it there and read it with settings.read): {found}"


def test_every_variable_the_product_names_is_declared():
    named = set()
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            named |= set(re.findall(r"\bLLM_[A-Z0-9_]*[A-Z0-9](?![\w*])", path.read_text()))
    assert named and not named - set(SETTINGS), sorted(named - set(SETTINGS))


@pytest.mark.parametrize("raw", [*ON, *OFF, " Yes ", "OFF", "True"])
def test_one_boolean_rule_for_every_variable(raw):
    want = raw.strip().lower() in ON
    for name in ("LLM_HTTP_DEBUG", "LLM_ROUTER_RESOLVE", "LLM_CUDA_GRAPHS", "LLM_PREFIX_CACHING"):
        assert read(name, {name: raw}) is want, name


@pytest.mark.parametrize("name, raw, says", [
    ("LLM_HTTP_DEBUG", "enabled", "expected one of 1/true/yes/on"),
    ("LLM_PREFIX_CACHING", "2", "expected one of"),
    ("LLM_MAX_MESSAGES", "many", "expected a whole number, got 'many'"),
    ("LLM_MAX_MESSAGES", "0", "must be >= 1, got 0"),
    ("LLM_SPECULATIVE_TOKENS", "-1", "expected a whole number"),
    ("LLM_GRPC_PORT", "70000", "must be <= 65535"),
    ("LLM_ROUTER_WAIT_S", "soon", "expected a number"),
    ("LLM_ROUTER_MIN_MATCH", "nan", "expected a finite number"),
    ("LLM_ROUTER", "random", "must be one of cache-aware, round-robin"),
])
def test_a_bad_value_is_refused_naming_the_variable(name, raw, says):
    with pytest.raises(ValidationError) as err:
        read(name, {name: raw})
    assert err.value.field == name and str(err.value).startswith(f"{name}: ") and says in str(err.value)


def test_unset_or_blank_is_the_default_but_where_blank_is_a_value():
    assert read("LLM_DTYPE", {}) == read("LLM_DTYPE", {"LLM_DTYPE": "  "}) == "auto"
    assert read("LLM_MAX_BODY_BYTES", {"LLM_MAX_BODY_BYTES": ""}) == 2 * 1024 * 1024
    assert read("LLM_EMBEDDING_MODEL", {}) is None and read("LLM_EMBEDDING_MODEL", {"LLM_EMBEDDING_MODEL": ""}) == ""
    assert read("LLM_ROUTER_POLL_MS", {"LLM_ROUTER_POLL_MS": " 250 "}) == 250


def test_read_takes_this_process_environment_by_default(monkeypatch):
    monkeypatch.setenv("LLM_REPLICAS", "3")
    assert read("LLM_REPLICAS") == 3
    monkeypatch.delenv("LLM_REPLICAS")
    assert read("LLM_REPLICAS") == 1
    with pytest.raises(KeyError, match="LLM_NOT_A_VARIABLE is not declared"):
        read("LLM_NOT_A_VARIABLE", {})


def test_the_records_take_their_defaults_and_values_from_the_declarations():
    from gateway.config import GatewayConfig
    env_fields = {f.name: f.metadata["env"] for f in fields(EngineConfig) if "env" in f.metadata}
    assert len(env_fields) >= 9
    for field_name, name in env_fields.items():
        assert getattr(EngineConfig(model="m"), field_name) == SETTINGS[name].default, name
    assert EngineConfig.from_env({"LLM_PREFIX_CACHING": "no", "LLM_DTYPE": ""}) == {"prefix_caching": False}
    for limits in (RequestLimits, ResumeLimits):
        for f in fields(limits):
            assert f.default == SETTINGS["LLM_" + f.name.upper()].default, f.name
    assert GatewayConfig().router_poll_s * 1000 == SETTINGS["LLM_ROUTER_POLL_MS"].default
    assert GatewayConfig.from_env({"LLM_HTTP_DEBUG": "on"}).http_debug  # "on" was off for the gateway
    with pytest.raises(ValidationError, match="LLM_ROUTER_RESOLVE"):
        GatewayConfig.from_env({"LLM_ROUTER_RESOLVE": "sure"})


def test_the_configuration_page_lists_every_variable_as_declared():
    """docs/configuration.md's table is rendered from SETTINGS; LLM_WRITE_EXAMPLES=1 renders it anew."""
    text = DOCS.read_text()
    match = _TABLE.search(text)
    assert match, "docs/configuration.md: no <!-- variables --> table"
    if os.environ.get("LLM_WRITE_EXAMPLES") == "1":
        DOCS.write_text(text[:match.start("table")] + markdown_table() + text[match.end("table"):])
        return
    assert match["table"] == markdown_table(), \
        "docs/configuration.md's variables differ from contract/settings.py: LLM_WRITE_EXAMPLES=1 rewrites them"
