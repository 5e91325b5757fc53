"""The gateway's edges to Jina and to the network: the one way to the executor (backend.py), the
gRPC port's refusals as status codes, calls that end with their requests, and the HTTP guards
(sizes, CORS, the API key, unrouted paths)."""
