"""Jina executor package; `py_modules: executors/__init__.py` registers LLMExecutor."""
from .llm_executor import LLMExecutor

__all__ = ["LLMExecutor"]
