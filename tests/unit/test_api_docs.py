"""docs/api.md documents every request field: the table after `<!-- REQUEST-FIELDS -->` has one
row per field of PromptDocument's request, named in backticks in its first column; the tables
after `<!-- ANTHROPIC-FIELDS -->`, `<!-- OPENAI-CHAT-FIELDS -->`, `<!-- TGI-PARAMETERS -->` and the
like have one row per field of those APIs, with what it does here (served, no effect, refused) as
the routes declare it (the engine's request fields that an API also takes under their own names are
the first table's)."""
import re
from pathlib import Path

import pytest

from contract import request_fields
from gateway.mapping.api_fields import ApiFields, Handling
from gateway.protocols import (
    anthropic_routes,
    embedding_routes,
    ollama_models,
    ollama_options,
    openai_routes,
    responses_routes,
    tgi_routes,
    tokens_routes,
)

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
MARKER = "<!-- REQUEST-FIELDS -->"
DOCUMENT_ONLY = {"prompt", "prompt_token_ids", "messages"}  # PromptDocument's own fields, beside the request fields


def table_rows(text: str, marker: str = MARKER) -> list[list[str]]:
    """The cells of the table that follows the marker, up to the next blank line (its header and
    separator rows skipped); the first cell a backticked name, its backticks removed."""
    assert marker in text, f"{API_DOC}: no `{marker}` line before its table"
    lines = text.split(marker, 1)[1].lstrip("\n").split("\n\n", 1)[0].splitlines()
    rows = [line for line in lines if line.strip().startswith("|")]
    assert len(rows) > 2, f"{API_DOC}: no table (header, separator, rows) after `{marker}`"
    table = []
    for row in rows[2:]:
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        match = re.fullmatch(r"`(\w+)`", cells[0])
        assert match, f"{API_DOC}: a row of the table after {marker} does not start with a `name`: {row!r}"
        table.append([match.group(1), *cells[1:]])
    return table


def documented_fields(text: str) -> list[str]:
    return [row[0] for row in table_rows(text)]


def test_api_docs_list_every_request_field():
    names = documented_fields(API_DOC.read_text(encoding="utf-8"))
    duplicates = sorted({n for n in names if names.count(n) > 1})
    assert not duplicates, f"docs/api.md lists these request fields twice: {duplicates}"
    declared = {f.name for f in request_fields()} | DOCUMENT_ONLY
    missing, extra = sorted(declared - set(names)), sorted(set(names) - declared)
    assert not missing and not extra, (
        "docs/api.md's request fields table (after <!-- REQUEST-FIELDS -->) is out of date: "
        f"missing {missing} (declared in contract.request_fields() or PromptDocument), "
        f"extra {extra} (documented but not declared)")


def test_every_example_output_in_the_documents_is_produced_by_a_test():
    """Each is between example markers (testing/doc_examples.py), and the real-model tier has a
    producer for each, which checks it against the service."""
    from testing import doc_examples
    from tests.real_model.test_doc_examples import PRODUCERS
    assert doc_examples.unmarked_outputs() == []
    assert sorted(doc_examples.examples()) == sorted(PRODUCERS)


@pytest.mark.parametrize("marker,declared", [("<!-- OPENAI-CHAT-FIELDS -->", openai_routes.CHAT_FIELDS),
                                             ("<!-- OPENAI-COMPLETIONS-FIELDS -->", openai_routes.COMPLETIONS_FIELDS),
                                             ("<!-- TGI-FIELDS -->", tgi_routes.REQUEST_FIELDS),
                                             ("<!-- TGI-PARAMETERS -->", tgi_routes.PARAMETERS),
                                             ("<!-- ANTHROPIC-FIELDS -->", anthropic_routes.FIELDS),
                                             ("<!-- RESPONSES-FIELDS -->", responses_routes.FIELDS),
                                             ("<!-- OLLAMA-CHAT-FIELDS -->", ollama_options.CHAT_FIELDS),
                                             ("<!-- OLLAMA-GENERATE-FIELDS -->", ollama_options.GENERATE_FIELDS),
                                             ("<!-- OLLAMA-OPTIONS -->", ollama_options.OPTIONS),
                                             ("<!-- EMBEDDINGS-OPENAI-FIELDS -->", embedding_routes.OPENAI_FIELDS),
                                             ("<!-- EMBEDDINGS-OLLAMA-FIELDS -->", embedding_routes.OLLAMA_FIELDS),
                                             ("<!-- EMBEDDINGS-OLLAMA-OLD-FIELDS -->", embedding_routes.OLLAMA_OLD_FIELDS)])
def test_api_docs_give_each_foreign_apis_fields_as_the_route_declares_them(marker, declared: ApiFields):
    documented = {row[0]: row[1] for row in table_rows(API_DOC.read_text(encoding="utf-8"), marker)}
    expected = {f.name: f.handling.value for f in declared.fields}
    assert documented == expected, (
        f"docs/api.md's table after {marker} differs from {declared.api}'s declaration: "
        f"{sorted(set(documented.items()) ^ set(expected.items()))}")


@pytest.mark.parametrize("declared,request_model", [
    (openai_routes.CHAT_FIELDS, openai_routes.ChatRequest),
    (openai_routes.COMPLETIONS_FIELDS, openai_routes.CompletionRequest),
    (tgi_routes.REQUEST_FIELDS, tgi_routes.TGIRequest),
    (tgi_routes.PARAMETERS, tgi_routes.TGIParameters),
    (anthropic_routes.FIELDS, anthropic_routes.MessagesRequest),
    (responses_routes.FIELDS, responses_routes.ResponsesRequest),
    (ollama_options.CHAT_FIELDS, ollama_options.ChatRequest),
    (ollama_options.GENERATE_FIELDS, ollama_options.GenerateRequest),
    (ollama_options.OPTIONS, ollama_options.Options),
    (embedding_routes.OPENAI_FIELDS, embedding_routes.OpenAIEmbeddingRequest),
    (embedding_routes.OLLAMA_FIELDS, embedding_routes.OllamaEmbedRequest),
    (embedding_routes.OLLAMA_OLD_FIELDS, embedding_routes.OllamaEmbeddingsRequest),
    (tokens_routes.FIELDS, tokens_routes.TokenizeRequest),
    (tokens_routes.DETOKENIZE_FIELDS, tokens_routes.DetokenizeRequest),
    (ollama_models.MODEL_FIELDS, ollama_models.ModelRequest),
    (ollama_models.COPY_FIELDS, ollama_models.CopyRequest)])
def test_the_request_models_read_exactly_the_fields_served_or_accepted(declared: ApiFields, request_model):
    """A refused field reaches the check as an extra; a served one must be read by the model."""
    read = set(request_model.model_fields)
    assert read == declared.names(Handling.SERVED) | declared.names(Handling.NO_EFFECT)
