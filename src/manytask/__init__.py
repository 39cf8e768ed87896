"""manytask: federated many-task learning.

The Python API (`manytask.api`): `run(config, out, **values) -> RunResult`, `resume(run_dir)`, `load(run_dir)`,
`compare(*run_dirs)`. They are imported on first use, so `import manytask` stays light."""

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"
__all__ = ["RunResult", "__version__", "compare", "load", "resume", "run"]

if TYPE_CHECKING:
    from manytask.api import RunResult, compare, load, resume, run


def __getattr__(name: str) -> Any:
    if name in {"run", "resume", "load", "compare", "RunResult"}:
        from manytask import api

        return getattr(api, name)
    raise AttributeError(f"module 'manytask' has no attribute {name!r}")
