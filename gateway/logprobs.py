"""Log probabilities in OpenAI's two shapes, from the documents' per-token lists: chat's
`logprobs.content` and completions' `tokens`/`token_logprobs`/`top_logprobs`/`text_offset`.
Each chunk carries exactly its own tokens' numbers, each token its own alternatives, so a
stream's chunks join to the whole answer's."""
from typing import Any

from schemas import ModelOutputDocument


def alternatives(doc: ModelOutputDocument) -> list[list[tuple[int, str, float]]]:
    """Per token of the document, its alternatives (id, text, log probability)."""
    out, at = [], 0
    for count in doc.alternative_counts:
        out.append(list(zip(doc.alternative_ids[at:at + count], doc.alternative_texts[at:at + count],
                            doc.alternative_logprobs[at:at + count], strict=True)))
        at += count
    return out or [[] for _ in doc.token_ids]


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def chat_logprobs(docs: list[ModelOutputDocument]) -> dict[str, Any]:
    content = []
    for doc in docs:
        for token, logprob, alts in zip(doc.tokens, doc.logprobs, alternatives(doc), strict=True):
            content.append({**_entry(token, logprob), "top_logprobs": [_entry(t, lp) for _, t, lp in alts]})
    return {"content": content}


def completion_logprobs(docs: list[ModelOutputDocument], offset: int) -> dict[str, Any]:
    """`offset`: where the first token's text starts in the choice's text (after an echo)."""
    tokens, logprobs, tops, offsets = [], [], [], []
    for doc in docs:
        for token, text, logprob, alts in zip(doc.tokens, doc.texts, doc.logprobs, alternatives(doc), strict=True):
            tokens.append(token)
            logprobs.append(logprob)
            tops.append({t: lp for _, t, lp in alts})
            offsets.append(offset)
            offset += len(text)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}
