"""The typed documents that flow through the service (DocArray v2).

Every request option lives in PromptDocument: Jina drops `parameters` on
streaming endpoints. Types only here; the engine validates values and names
the offending field, the same way for every transport.
"""
from typing import List, Optional

from docarray import BaseDoc


class PromptDocument(BaseDoc):
    prompt: str = ""
    max_tokens: int = 64
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    typical_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: Optional[int] = None
    stop: List[str] = []
    # Chat: a JSON list of {role, content}; when set it replaces `prompt`, and the engine
    # renders it (chat template, or a plain format) and drops the oldest turns to fit.
    messages: str = ""


class ModelOutputDocument(BaseDoc):
    """One streamed step: a token (several when the reader fell behind), or an error."""

    token_id: int = -1  # the last token of this document
    token_ids: List[int] = []  # every token this document covers
    text: str = ""  # only this document's new text
    generated_text: str = ""  # all text so far
    index: int = 0  # position of token_id in the generation
    logprob: float = 0.0
    logprobs: List[float] = []
    special: bool = False  # whether token_id is a special token
    specials: List[bool] = []  # the same for each of token_ids
    finish_reason: Optional[str] = None  # last document only: length | eos_token | stop_sequence | error
    generated_tokens: Optional[int] = None  # last document only
    prompt_tokens: Optional[int] = None  # last document only
    seed: Optional[int] = None  # last document only, when sampling
    error: Optional[str] = None  # set on a final error document
    error_type: Optional[str] = None  # validation | overloaded | generation


__all__ = ["ModelOutputDocument", "PromptDocument"]
