"""`python deploy/jina_cli.py ARGS`: Jina's command line (`jina ARGS`), in processes that do without
PyTorch until they compute with it.

`import jina` imports docarray, and docarray imports PyTorch whenever it is installed, to accept
torch tensors in documents. That costs every process Jina starts (the Flow's, the gateway's, each
executor's) 1.3 s of CPU before it serves and about 190 MB of memory, paid again by each replica.
No document of this service carries a torch tensor (an embedding is an NdArray), and the processes
that compute (the engine process, the embedder) import PyTorch themselves. So docarray is imported
here while `import torch` fails, which leaves its torch tensor types out, and then PyTorch is
importable again for whoever needs it. `make serve` (deploy/serve.py) and the test fleets start
Jina this way; `jina ARGS` as typed works the same, with PyTorch in every process.

Reading a Flow file, Jina (`ArgNamespace.kwargs2namespace`) hands `warn_unknown_args` the
arguments that no parser knew, an empty set for flows/llm.yml, and that function builds the table
of every Jina command's arguments before it finds nothing to warn of: 0.6 s of the launcher's CPU,
before it starts any of the Flow's processes. `skip_empty_warnings` makes an empty call return at
once (the launcher's one patch of Jina; gateway/edge/jina_patches.py lists the others, and
tests/unit/test_jina_patches.py checks this one too).

For `flow`, its first act is to start the engine process of the Flow's executor
(engine/core/ahead_process.py), whose imports (about 4.5 s) then run beside Jina's here (1.7 s)
and the Flow's start, instead of after them; the executor claims it.
"""
import sys
from collections.abc import Iterable
from pathlib import Path


def command() -> list[str]:
    """This launcher as a command line's start: `command() + ["flow", "--uses", FILE]`."""
    return [sys.executable, str(Path(__file__).resolve())]


def import_docarray_without_torch() -> None:
    """docarray imported as if PyTorch were not installed; PyTorch stays importable afterwards."""
    if "torch" in sys.modules:  # imported already: nothing to save
        return
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError
    try:
        import docarray  # noqa: F401
    finally:
        del sys.modules["torch"]


def skip_empty_warnings() -> None:
    """jina.helper.warn_unknown_args returns at once when there is nothing to warn of."""
    import jina.helper

    warn = jina.helper.warn_unknown_args
    if getattr(warn, "skips_empty", False):
        return

    def warn_unknown_args(unknown_args: Iterable[str]) -> None:
        if unknown_args:
            warn(unknown_args)

    warn_unknown_args.skips_empty = True  # type: ignore[attr-defined]
    jina.helper.warn_unknown_args = warn_unknown_args


def main() -> None:
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        del sys.path[0]  # as the `jina` script's: this folder's scripts are not modules of the service
    if sys.argv[1:2] == ["flow"]:  # its executor's engine process, importing beside Jina's imports
        from engine.frontend.ahead import start_ahead
        start_ahead()
    import_docarray_without_torch()
    skip_empty_warnings()
    from jina_cli import main as jina_main

    sys.argv[0] = "jina"
    jina_main()


if __name__ == "__main__":
    main()
