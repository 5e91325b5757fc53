"""pytest -p eager: every EngineConfig without cuda_graphs given gets cuda_graphs=False."""
import contract.params as p
_orig = p.EngineConfig.__init__
def _init(self, *a, **kw):
    kw.setdefault("cuda_graphs", False)
    _orig(self, *a, **kw)
p.EngineConfig.__init__ = _init
