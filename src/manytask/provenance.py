"""Where a run's numbers came from (summary.json's `provenance`, the report's last section): the package version,
the git commit of the code and whether it had uncommitted changes (when the package runs from a repository), the
Python, torch and Flower versions, the device clients trained on, the platform and the command line."""

from __future__ import annotations

import importlib.metadata
import platform
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import torch

import manytask
from manytask.devices import resolve_device

PACKAGE_DIR = Path(manytask.__file__).resolve().parent


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(*arguments: str) -> str | None:
    """`git -C <the package's folder> ...`'s output, or None where there is no git or no repository."""
    try:
        done = subprocess.run(["git", "-C", str(PACKAGE_DIR), *arguments], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@cache
def code_state() -> dict[str, Any]:
    """The package's version, and its git commit and dirty flag where it runs from a repository (once a process:
    the code does not change under a running process)."""
    commit = _git("rev-parse", "HEAD")
    dirty = None if commit is None else bool(_git("status", "--porcelain", "--untracked-files=no", "--", "."))
    return {"manytask": _version("manytask") or manytask.__version__, "git_commit": commit, "git_dirty": dirty}


def device_name(device: str) -> str:
    """The card's name for a GPU, the processor's (or the machine type) for the CPU."""
    resolved = resolve_device(device)
    if resolved.type == "cuda":
        return torch.cuda.get_device_name(resolved)
    return _cpu_model() or platform.processor() or platform.machine() or "cpu"


def _cpu_model() -> str | None:
    """The CPU's model name where Linux gives it (/proc/cpuinfo), else None."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return next((line.partition(":")[2].strip() for line in text.splitlines() if line.startswith("model name")),
                None)


def provenance(device: str) -> dict[str, Any]:
    """This process's provenance for a run whose clients train on `device` (a config's `device`)."""
    return {
        **code_state(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "flwr": _version("flwr"),
        "device": f"{resolve_device(device)} ({device_name(device)})",
        "platform": platform.platform(),
        "command": shlex.join(sys.argv),
    }
