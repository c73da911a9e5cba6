"""kiln.stages: JAX's ahead-of-time stages, jit(f).lower(*args) -> Lowered
and Lowered.compile(progress=...) -> Compiled (kiln/_api.py), and the
progress messages of a compile (kiln/_client.py)."""
from ._api import Compiled, Lowered  # noqa: F401
from ._client import CompileProgress  # noqa: F401

__all__ = ["Lowered", "Compiled", "CompileProgress"]
