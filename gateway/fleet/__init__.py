"""The replicas one gateway routes to: who they are, their load and predicted caches, the router's
policy, and the streamer through which every request reaches its replica (or its deployment)."""
