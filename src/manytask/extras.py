"""The optional extras (pyproject.toml's `[project.optional-dependencies]`): a feature whose library is missing
stops with one sentence naming the extra that installs it, never a `ModuleNotFoundError` traceback."""

from __future__ import annotations

import importlib
from types import ModuleType

from manytask.errors import ManytaskError

# the extra that installs each optional top-level module
EXTRA_OF = {"optuna": "tune", "flwr": "flower", "transformers": "vision", "PIL": "vision", "tensorboard": "tensorboard",
            "mlflow": "mlflow", "datasets": "hf", "flwr_datasets": "hf", "opacus": "dp"}


def missing_extra(feature: str, module: str) -> ManytaskError:
    """'`feature` needs <module>, which the '<extra>' extra installs: pip install 'manytask[<extra>]' ...'
    (manytask is not on PyPI: the spelling for a clone is given too)."""
    extra = EXTRA_OF[module.partition(".")[0]]
    return ManytaskError(f"{feature} needs {module.partition('.')[0]}, which the '{extra}' extra installs: "
                         f"pip install 'manytask[{extra}]' from a wheel, or pip install -e '.[{extra}]' in a clone "
                         "of manytask.")


def require(module: str, feature: str) -> ModuleType:
    """`module`, imported; or the one-sentence error of `missing_extra` where it (or its own top-level package) is
    not installed. A module that is installed but fails to import for another reason raises as it does."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is None or err.name.partition(".")[0] != module.partition(".")[0]:
            raise
        raise missing_extra(feature, module) from None
