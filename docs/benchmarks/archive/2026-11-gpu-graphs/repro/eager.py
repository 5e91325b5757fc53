"""pytest -p eager: every EngineConfig that does not name cuda_graphs gets cuda_graphs=False."""
from typing import Any

import contract.params as params

_original = params.EngineConfig.__init__


def _eager(self: params.EngineConfig, *args: Any, **kwargs: Any) -> None:
    kwargs.setdefault("cuda_graphs", False)
    _original(self, *args, **kwargs)


params.EngineConfig.__init__ = _eager  # type: ignore[method-assign]
