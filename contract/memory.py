"""The memory a process has freed, given back to the system.

glibc keeps freed blocks under 32 MB in its heaps for later allocations, so the temporaries of a
one-off piece of work stay resident in the process that did it: a model's load (its file's
tensors repacked, a folder's dequantized) or a tokenizer's parse from its JSON (a 3 MB
tokenizer.json leaves 50 MB resident, half of it freed). Every replica pays them again. Each
process calls this after such work, once: the 1.17B Q4_K_M model's engine process holds 1.4 GB
after its load instead of 1.9 GB.
"""
import ctypes


def give_back_freed() -> None:
    """malloc_trim(0): the heaps' free pages back to the system (elsewhere than glibc, a no-op)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing kept this way
        pass
