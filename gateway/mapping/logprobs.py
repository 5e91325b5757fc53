"""Log probabilities in OpenAI's two shapes, from the documents' per-token lists: chat's
`logprobs.content` and completions' `tokens`/`token_logprobs`/`top_logprobs`/`text_offset`.
Each chunk carries exactly its own tokens' numbers, each token its own alternatives, so a
stream's chunks join to the whole answer's."""
from typing import Any, Optional

from schemas import ModelOutputDocument


def _unflatten(counts: list[int], ids: list[int], texts: list[str], logprobs: list[float],
               length: int) -> list[list[tuple[int, str, float]]]:
    out, at = [], 0
    for count in counts:
        out.append(list(zip(ids[at:at + count], texts[at:at + count], logprobs[at:at + count], strict=True)))
        at += count
    return out or [[] for _ in range(length)]


def alternatives(doc: ModelOutputDocument) -> list[list[tuple[int, str, float]]]:
    """Per token of the document, its alternatives (id, text, log probability)."""
    return _unflatten(doc.alternative_counts, doc.alternative_ids, doc.alternative_texts, doc.alternative_logprobs,
                      len(doc.token_ids))


def prompt_alternatives(doc: ModelOutputDocument) -> list[list[tuple[int, str, float]]]:
    """Per prompt token from the second on, its alternatives (prompt_logprobs)."""
    return _unflatten(doc.prompt_alternative_counts, doc.prompt_alternative_ids, doc.prompt_alternative_texts,
                      doc.prompt_alternative_logprobs, len(doc.prompt_logprobs))


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def chat_logprobs(docs: list[ModelOutputDocument]) -> dict[str, Any]:
    content = []
    for doc in docs:
        for token, logprob, alts in zip(doc.tokens, doc.logprobs, alternatives(doc), strict=True):
            content.append({**_entry(token, logprob), "top_logprobs": [_entry(t, lp) for _, t, lp in alts]})
    return {"content": content}


def completion_logprobs(docs: list[ModelOutputDocument], offset: int) -> dict[str, Any]:
    """`offset`: where the first token's text starts in the choice's text (after an echo).
    An answer's first document carries the prompt's numbers when they were asked (echo):
    they come first, from offset 0, the first token's null as OpenAI has it."""
    tokens: list[str] = []
    logprobs: list[Optional[float]] = []
    tops: list[Optional[dict[str, float]]] = []
    offsets: list[int] = []
    for doc in docs:
        if doc.prompt_token_texts:
            at = 0
            for token in doc.prompt_token_texts:
                tokens.append(token)
                offsets.append(at)
                at += len(token)
            logprobs += [None, *doc.prompt_logprobs]
            tops += [None, *({t: lp for _, t, lp in alts} for alts in prompt_alternatives(doc))]
        for token, text, logprob, alts in zip(doc.tokens, doc.texts, doc.logprobs, alternatives(doc), strict=True):
            tokens.append(token)
            logprobs.append(logprob)
            tops.append({t: lp for _, t, lp in alts})
            offsets.append(offset)
            offset += len(text)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}
