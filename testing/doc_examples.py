"""The example outputs in README.md and docs/: each sits between `<!-- example: NAME -->` and
`<!-- /example -->`, and a test produces it from the running service
(tests/real_model/test_doc_examples.py), so that an example can never drift from what the quick
start gives. `LLM_WRITE_EXAMPLES=1` writes what the service answered back into the documents.

Volatile parts (ids, timestamps) are shown as `...` or compared without their value (`mask`).
"""
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", "docs/clients.md", "docs/api.md", "docs/models.md", "docs/configuration.md",
             "docs/operations.md", "docs/performance.md", "docs/cpu-weights.md", "docs/how-it-works.md",
             "deploy/README.md", "benchmarks/README.md")
_REGION = re.compile(r"<!-- example: (?P<name>[\w-]+) -->\n?(?P<body>.*?)<!-- /example -->", re.S)
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n?", re.S | re.M)
# a fenced block shows an output when it is a console session or text, or JSON of a response
OUTPUT_LANGUAGES = ("console", "text")
RESPONSE_KEYS = ('"choices":', '"object": "', '"generated_text":')


@dataclass
class Example:
    document: str
    name: str
    body: str  # what is between the markers, as written
    start: int
    end: int

    @property
    def fenced(self) -> bool:
        return self.body.lstrip().startswith("```")

    def content(self) -> str:
        """The example's text: inside its fence, or the inline text between the markers."""
        match = _FENCE.search(self.body)
        return match.group(2) if self.fenced and match else self.body.strip()


def examples() -> dict[str, Example]:
    found: dict[str, Example] = {}
    for document in DOCUMENTS:
        text = (ROOT / document).read_text()
        for match in _REGION.finditer(text):
            name = match["name"]
            assert name not in found, f"example {name} appears twice"
            found[name] = Example(document, name, match["body"], match.start("body"), match.end("body"))
    return found


def unmarked_outputs() -> list[str]:
    """Output blocks (console sessions, response bodies) outside any example region."""
    loose = []
    for document in DOCUMENTS:
        text = (ROOT / document).read_text()
        regions = [(m.start(), m.end()) for m in _REGION.finditer(text)]
        for fence in _FENCE.finditer(text):
            output = fence.group(1) in OUTPUT_LANGUAGES or (
                fence.group(1) == "json" and any(key in fence.group(2) for key in RESPONSE_KEYS))
            if output and not any(a <= fence.start() < b for a, b in regions):
                line = text[:fence.start()].count("\n") + 1
                loose.append(f"{document}:{line}: {fence.group(2).splitlines()[0][:60]}")
    return loose


def write(example: Example, content: str) -> None:
    """Put `content` in the example's place (inside its fence, or inline)."""
    path = ROOT / example.document
    text = path.read_text()
    if example.fenced:
        fence = _FENCE.search(example.body)
        assert fence is not None
        body = example.body[:fence.start(2)] + content.rstrip("\n") + "\n" + example.body[fence.end(2):]
    else:
        body = content
    path.write_text(text[:example.start] + body + text[example.end:])


def mask(text: str) -> str:
    """The text without what changes from run to run: timestamps, drawn ids, and how much of a
    prompt another request left in the prefix cache."""
    text = re.sub(r'"created": \d+', '"created": ...', text)
    text = re.sub(r'"cached_tokens": \d+', '"cached_tokens": ...', text)
    text = re.sub(r"^id: strm_[\w.]+/", "id: strm_.../", text, flags=re.M)  # an SSE stream's id, for a reconnect
    return re.sub(r'"(id|requestId)": "[^"]*"', r'"\1": "..."', text)
