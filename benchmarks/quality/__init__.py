"""Accuracy: quantized weights against fp32 beside llama.cpp (quality.py), and lm-evaluation-harness
through the service against transformers in-process (lm_eval_compare.py, with lm_eval_task/)."""
