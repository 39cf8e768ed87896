"""Users' own methods and benchmarks without editing the package: a config's `imports` (modules or .py files,
imported before the config is resolved, so every process that reads the config — run, --resume, tune, workers,
Flower's apps — registers the same names), and installed packages' entry points (`manytask.methods`,
`manytask.benchmarks`), loaded when a name is looked up and not yet registered."""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import re
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from manytask.errors import ManytaskError, clipped
from manytask.input_limits import shown_path

MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
FILE_PACKAGE = "manytask_user"  # files are imported as manytask_user.<stem>_<hash of their path>


def is_file_entry(entry: str) -> bool:
    """A path to a .py file (anything else is a module name)."""
    return entry.endswith(".py") or "/" in entry or "\\" in entry


def anchored(entries: Any, base: Path) -> Any:
    """`entries` with each relative file path made absolute against `base` (the directory of the config file that
    names it); anything that is not a list of text is left for `import_all` to refuse."""
    if not isinstance(entries, list):
        return entries
    return [str((base / e).resolve()) if isinstance(e, str) and is_file_entry(e) and not Path(e).is_absolute()
            else e for e in entries]


def import_all(entries: Any) -> list[str]:
    """Import every entry of a config's `imports` (idempotent); returns them with file paths absolute, as the run
    directory's config.yaml stores them so that a resume elsewhere in the tree imports the same files."""
    if entries is None:
        return []
    if not isinstance(entries, list) or not all(isinstance(e, str) and e for e in entries):
        raise ManytaskError(f"config key 'imports' must be a list of module names or .py file paths (got "
                            f"{clipped(repr(entries))}).")
    resolved = [str(Path(e).resolve()) if is_file_entry(e) else e for e in entries]
    for entry in resolved:
        if is_file_entry(entry):
            import_file(Path(entry))
        else:
            import_module(entry)
    return resolved


def import_module(name: str) -> ModuleType:
    if not MODULE_NAME.match(name):
        raise ManytaskError(f"imports: '{clipped(name)}' is neither a module name (a.b.c) nor a path to a .py file.")
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name is not None and name.startswith(err.name):
            raise ManytaskError(f"imports: no module named '{clipped(name)}' on the Python path (install its package, "
                                "or give the path to its .py file).") from None
        raise ManytaskError(f"imports: module '{clipped(name)}' failed: {_describe(err, None)}") from None
    except Exception as err:  # the user's module raised while importing: say where, in one sentence
        raise ManytaskError(f"imports: module '{clipped(name)}' failed: {_describe(err, None)}") from None


def import_file(path: Path) -> ModuleType:
    """Import a .py file once per process under a name derived from its absolute path."""
    if path.suffix != ".py" or not path.is_file():
        raise ManytaskError(f"imports: '{shown_path(path)}' is not a .py file that exists.")
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    stem = re.sub(r"\W", "_", path.stem)
    name = f"{FILE_PACKAGE}.{stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: its classes pickle by this name (workers, Flower)
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[name]
        raise ManytaskError(f"imports: '{shown_path(path)}' failed: {_describe(err, path)}") from None
    return module


def _describe(err: BaseException, path: Path | None) -> str:
    """`TypeError: ... (line 12)`: the error and the line of the user's file (or the innermost frame) it came from."""
    frames = traceback.extract_tb(err.__traceback__)
    mine = [f for f in frames if path is not None and Path(f.filename) == path] or frames[-1:]
    where = f" (line {mine[-1].lineno} of {Path(mine[-1].filename).name})" if mine else ""
    return f"{type(err).__name__}: {clipped(str(err))}{where}."


def load_entry_point(group: str, name: str) -> bool:
    """Load the installed entry point `name` of `group` (importing its module registers the name); False when no
    installed package declares it."""
    found = [ep for ep in importlib.metadata.entry_points(group=group) if ep.name == name]
    for ep in found:
        _load(ep, group)
    return bool(found)


def load_entry_points(group: str) -> None:
    """Load every installed entry point of `group` (for listings and for 'valid choices' in errors)."""
    for ep in importlib.metadata.entry_points(group=group):
        _load(ep, group)


def _load(ep: importlib.metadata.EntryPoint, group: str) -> None:
    package = ep.dist.name if ep.dist is not None else "an installed package"
    try:
        ep.load()
    except Exception as err:
        raise ManytaskError(f"entry point '{ep.name}' of {package} (group {group}, {ep.value}) failed to load: "
                            f"{_describe(err, None)}") from None
