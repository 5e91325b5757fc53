"""A prepared request becomes rows (one per answer), each with its own policies; a row's token
becomes the output its reader gets.

The grammar is compiled here, from the engine's cache (compiled once per process), and a resumed
request's tokens so far are replayed through each policy, so that the row goes on exactly where
the uncut run was.
"""
from collections.abc import Callable
from dataclasses import fields
from typing import Any, Optional

from contract import SEED_MAX, EngineConfig, FinishReason, SamplingParams, ValidationError

from ..messages import Prepared
from ..outputs import PromptScores, RequestOutput, merge_rules
from ..policies.output import OutputPipeline, TokenPiece, Vocabulary
from ..policies.sampling import TokenChooser
from ..policies.speculation import PromptLookup
from ..policies.structured import GrammarCompiler
from ..policies.tools import tool_spec
from .request import ParentRequest, Request


class RowFactory:
    def __init__(self, config: EngineConfig, vocab: Vocabulary, grammars: GrammarCompiler):
        self.config, self.vocab, self.grammars = config, vocab, grammars
        self.adapters = set(config.adapters())  # LoRA adapters' names: a request's `model` picks one

    def make(self, request_id: str, prepared: Prepared, sink: Callable[[RequestOutput], None]) -> Request:
        """The request's first row; its other answers (n > 1) wait in its ParentRequest to fan
        out, seeded one apart. Raises, naming the field, what cannot be served."""
        n = prepared.params.n
        if prepared.generated and n > 1:
            raise ValidationError("resume_tokens", "a request continued from its tokens has one answer (n = 1)")
        answers = [self._row(request_id, prepared, sink, i) for i in range(n)]
        if prepared.params.prompt_logprobs:
            scores = PromptScores(list(prepared.prompt_ids), [self.vocab.texts(t) for t in prepared.prompt_ids])
            for answer in answers:
                answer.prompt_scores = scores
        if n > 1:
            answers[0].parent = ParentRequest(answers[1:])
        return answers[0]

    def _speculative(self, params: SamplingParams) -> int:
        """The request's drafts per step: its own, else the server's for greedy requests (a sampled
        token is rarely the draft, so verifying drafts costs sampled requests more than it saves)."""
        if params.speculative_tokens is not None:
            return params.speculative_tokens
        return self.config.speculative_tokens if params.greedy else 0

    def _row(self, request_id: str, prepared: Prepared, sink: Callable[[RequestOutput], None],
             choice: int) -> Request:
        params = prepared.params
        seed = None if prepared.seed is None else (prepared.seed + choice) % (SEED_MAX + 1)
        matcher = self.grammars.matcher(params)
        spec = tool_spec(params)
        pipeline = OutputPipeline(self.vocab, params, prepared.prompt_ids, matcher, tools=spec is not None,
                                  tools_auto=spec is not None and spec.choice == "auto",
                                  turn_markers=prepared.turn_markers)
        pipeline.replay(prepared.generated)
        speculative = 0 if matcher is not None else self._speculative(params)  # masks: one position at a time
        drafter = PromptLookup(self.config.speculative_ngram_min, self.config.speculative_ngram_max) \
            if speculative else None
        return Request(request_id, prepared.prompt_ids, params, seed,
                       TokenChooser(params, seed, len(prepared.prompt_ids)), pipeline, sink, choice=choice,
                       drafter=drafter, speculative=speculative, adaptive=params.speculative_tokens is None,
                       generated=list(prepared.generated),
                       adapter=params.model if params.model in self.adapters else None)


def row_output(row: Request, piece: Optional[TokenPiece], index: int) -> RequestOutput:
    """What the reader gets of the row's token at `index` of its answer (None: a request that
    only scores its prompt, whose scores are the answer)."""
    if piece is None:
        return RequestOutput(row.request_id, finish_reason=FinishReason.LENGTH, prompt_tokens=len(row.prompt_ids),
                             seed=row.seed, choice=row.choice, prompt=row.prompt_scores,
                             cached_tokens=row.cached_tokens)
    return _TOKEN_OUTPUT(RequestOutput, row, piece, index)


Pairs = tuple[tuple[str, str], ...]  # (TokenPiece field, RequestOutput field)


def _piece_to_output() -> tuple[Pairs, Pairs, Pairs]:
    """The TokenPiece fields that fill one entry of a per-token list (none where the piece has
    None: not asked for), the token's parts of one, and a value as it is, each with the
    RequestOutput field it fills. A piece that names no output field is refused as the module loads."""
    rules = merge_rules(RequestOutput)
    per_token = {name for name, _ in rules.tokens}
    ones: list[tuple[str, str]] = []
    parts: list[tuple[str, str]] = []
    values: list[tuple[str, str]] = []
    for f in fields(TokenPiece):
        target = f.metadata.get("output")
        if target not in per_token | set(rules.first) | set(rules.last):
            raise TypeError(f"TokenPiece.{f.name} names no RequestOutput field it fills: {target!r}")
        (values if target not in per_token else parts if f.metadata.get("parts") else ones).append((f.name, target))
    return tuple(ones), tuple(parts), tuple(values)


def _token_output() -> Callable[..., RequestOutput]:
    """`row_output` of a token, made from the declarations (`_piece_to_output`) once, as
    dataclasses makes `__init__`: one call with each field's expression written out. A step
    makes one per row, and a loop over the declarations at every call doubled its cost."""
    ones, parts, values = _piece_to_output()
    filled = [f"{target}=p.{name}" for name, target in values]
    filled += [f"{target}=[] if p.{name} is None else [p.{name}]" for name, target in ones]
    filled += [f"{target}=p.{name}" for name, target in parts]  # the token's own list of parts
    source = ("def token_output(cls, row, p, index):\n"
              "    return cls(row.request_id, index=index, prompt_tokens=len(row.prompt_ids), generated_tokens=index + 1,"
              " seed=row.seed, choice=row.choice, prompt=row.prompt_scores if index == 0 else None,"
              f" cached_tokens=row.cached_tokens, {', '.join(filled)})\n")
    scope: dict[str, Any] = {}
    exec(source, scope)  # noqa: S102 - the source is made above from the dataclasses' own field names
    return scope["token_output"]


_TOKEN_OUTPUT = _token_output()
