"""The Jina executor (llm_executor) and the jina-free decoding engine (engine).

Nothing is imported here, so `import engine` never pulls in jina.
"""
