"""Which of the Flow's deployments serves which endpoint, where it is not the generating one
(`llm`, whose replicas the gateway's router picks among): the executors bind these names, and the
gateway's router sends each such request to its deployment."""

EMBED = "/embed"  # DocList[EmbeddingDocument] in, each with its .embedding out
EMBED_INFO = "/embed_info"  # the embedding model's dimensions and limits, as JSON
EMBEDDER = "embedder"  # the embedding executor's deployment (flows/llm.yml)

KEEP_ALIVE = "/keep_alive"  # a model's: load it and keep it so long, or unload it (Ollama's keep_alive)
MODELS = "/models"  # the gateway's own: every served model's /info, as a JSON list

DEPLOYMENT_OF = {EMBED: EMBEDDER, EMBED_INFO: EMBEDDER}
