"""The drivers of the published records: the serving benchmark (serving.py, the default subcommand)
and its modes, each a subcommand of its own (cpu-record, gguf-record, speculation-sweep, speculative,
prefix, replicas, structured)."""
