"""The engine's cache folders (compiled kernels, quantized weights): one rule for where they are."""
import os
from pathlib import Path
from typing import Optional

from contract import settings


def cache_folder(setting: str, name: str) -> Optional[Path]:
    """$`setting` where set, else `name` under the user's cache folder (`llm-stream/NAME`); made
    where missing. None where it cannot be written (no home folder to expand "~" into, or no
    permission): the caller then keeps nothing."""
    root = settings.read(setting) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llm-stream", name)
    if root.startswith("~"):
        return None
    folder = Path(root)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return folder if os.access(folder, os.W_OK) else None
