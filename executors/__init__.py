"""The Jina executor (llm_executor): documents in and out around the engine (engine/).

Nothing is imported here, so `import engine` never pulls in jina.
"""
