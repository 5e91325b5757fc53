"""The Flow's gateway: gRPC (Jina's) and, on one HTTP port, Jina's HTTP/SSE routes plus
OpenAI-compatible, TGI-compatible and WebSocket chat routes, and a browser chat page.

Routes only convert wire formats to PromptDocument and back: sampling, stop sequences,
chat templates and detokenization stay in the executor, so every route streams the
same text for the same request. Nothing is imported here (jina loads gateway/composite.py).
"""
