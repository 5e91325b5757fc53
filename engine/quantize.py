"""python -m engine.quantize MODEL_DIR OUT.gguf [--type q8_0]: a Hugging Face folder written as a
GGUF file of the blocks this service serves it from, for llama.cpp and Ollama (model/to_gguf.py)."""
import sys

from .model.to_gguf import main

if __name__ == "__main__":
    sys.exit(main())
