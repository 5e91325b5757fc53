"""The wire formats, one module each: a request onto the contract's PromptDocument, the documents
back in the protocol's own shape (OpenAI, Anthropic, Ollama, TGI, Jina SSE, the WebSocket chat,
embeddings, tokens, operations)."""
