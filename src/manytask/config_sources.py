"""Where a run config comes from: the built-in default job, a YAML file, and `key=value` overrides on top."""

from __future__ import annotations

import copy
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from manytask.errors import ManytaskError, clipped
from manytask.input_limits import load_limited, read_config_text, shown_path

MAX_KEY_PARTS = 16


def default_config() -> dict[str, Any]:
    """The built-in default job's config."""
    text = resources.files("manytask").joinpath("configs/default.yaml").read_text()
    return yaml.safe_load(text)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """A config file's mapping; one sentence when the file is missing, too large, binary, not YAML, over the
    alias/nesting limits of `manytask.input_limits`, or not a mapping."""
    path = Path(path)
    where = f"config file '{shown_path(path)}'"
    data = load_limited(read_config_text(path), where)
    if not isinstance(data, dict):
        got = "nothing (it is empty)" if data is None else "a list" if isinstance(data, list) else "a single value"
        raise ManytaskError(f"{where} must hold a mapping of keys to values, not {got}.")
    return data


NAMED_KEYS = {"method": "name", "benchmark": "name", "model": "backbone"}


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides; values are parsed as YAML (`rounds=5` is an int, `x=[a,b]` a list)."""
    data = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ManytaskError(f"override '{clipped(item)}' is not of the form key=value.")
        parts = key.split(".")
        if "" in parts:
            raise ManytaskError(f"override '{clipped(item)}' has an empty part in its key; write keys as names "
                                "joined by single dots (train.lr=0.1).")
        if len(parts) > MAX_KEY_PARTS:
            raise ManytaskError(f"override '{clipped(item)}' has a key of more than {MAX_KEY_PARTS} parts.")
        value = load_limited(raw, f"the value of override '{clipped(item)}'")
        _set_nested(data, parts, value)
    return data


def _set_nested(data: dict[str, Any], path: list[str], value: Any) -> None:
    node = data
    for depth, part in enumerate(path[:-1]):
        child = node.get(part)
        if isinstance(child, str) and depth == 0 and part in NAMED_KEYS:
            child = {NAMED_KEYS[part]: child}  # `method=fedprox` then `method.mu=0.1`
        if child is None:
            child = {}
        if not isinstance(child, dict):
            raise ManytaskError(f"cannot set '{clipped('.'.join(path))}': '{clipped(part)}' is not a mapping in the "
                                "config.")
        node[part] = child
        node = child
    node[path[-1]] = value
