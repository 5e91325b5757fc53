"""docs/api.md documents every request field: the table after `<!-- REQUEST-FIELDS -->` has one
row per field of PromptDocument's request, named in backticks in its first column."""
import re
from pathlib import Path

from contract import request_fields

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
MARKER = "<!-- REQUEST-FIELDS -->"
DOCUMENT_ONLY = {"prompt", "messages"}  # PromptDocument's own fields, beside the request fields


def documented_fields(text: str) -> list[str]:
    """The backticked names in the first column of the table that follows the marker, up to the
    next blank line (its header and separator rows are skipped)."""
    assert MARKER in text, f"{API_DOC}: no `{MARKER}` line before the request fields' table"
    lines = text.split(MARKER, 1)[1].lstrip("\n").split("\n\n", 1)[0].splitlines()
    rows = [line for line in lines if line.strip().startswith("|")]
    assert len(rows) > 2, f"{API_DOC}: no table (header, separator, rows) after `{MARKER}`"
    names = []
    for row in rows[2:]:
        first = row.strip().strip("|").split("|")[0].strip()
        match = re.fullmatch(r"`(\w+)`", first)
        assert match, f"{API_DOC}: a row of the request fields' table does not start with a `name`: {row!r}"
        names.append(match.group(1))
    return names


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
