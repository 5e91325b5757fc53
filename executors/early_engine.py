"""The executor's engine process, ready for its first load as soon as Jina loads the executor's
modules (jina.yml names this one first): the one that `make serve`'s launcher started before its own
imports, claimed (engine/frontend/ahead.py), else one started now. Its imports of torch,
transformers and the engine (about 4.5 s) then run beside the launcher's and the executor's own
(about 3 s), instead of after them. The executor's first load takes it, as a load after a
keep-alive unload takes the spare (engine/frontend/spare.py).

Only Jina's executor process imports this module (through jina.yml): a test or a script that
imports the executor starts no process. A process nobody takes is never left behind: it reads
EOF on its pipe and exits when this process goes, as every engine process does.
"""
from typing import Optional

from engine import CoreProcess, claim_ahead, spawn_core

# the one the launcher started before its imports (engine/frontend/ahead.py), else one started now
_ahead: Optional[CoreProcess] = claim_ahead() or spawn_core()


def take() -> Optional[CoreProcess]:
    """The process started at import, once (None after that)."""
    global _ahead
    core, _ahead = _ahead, None
    return core
