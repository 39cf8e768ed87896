"""Where a run config comes from: the built-in default job, a YAML file, and `key=value` overrides and `--sweep`
grids on top."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from manytask.errors import ManytaskError, clipped
from manytask.input_limits import load_limited, read_config_text, shown_path

MAX_KEY_PARTS = 16


BENCHMARK_BOUND = ("benchmark", "federation", "model")  # the default job's choices for its own benchmark


def default_config(overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """The built-in default job's config. Where `overrides` name another benchmark (`benchmark=X`), the job's
    federation and model (pretraining on held-out digits included) give way to X's own (`benchmarks/defaults.py`)."""
    text = resources.files("manytask").joinpath("configs/default.yaml").read_text()
    job = yaml.safe_load(text)
    named = [item for item in overrides if item.partition("=")[0] == "benchmark"]
    if not named:
        return job
    from manytask.benchmarks.defaults import benchmark_setup  # the benchmark registry is not needed otherwise

    benchmark = apply_overrides({}, named)["benchmark"]
    return {**{k: v for k, v in job.items() if k not in BENCHMARK_BOUND}, **benchmark_setup(benchmark),
            "benchmark": benchmark}


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
        key, raw = _split_item(item, "override")
        where = f"override '{clipped(item)}'"
        set_key(data, key, load_limited(raw, f"the value of {where}"), where)
    return data


def apply_sweeps(data: dict[str, Any], sweeps: Sequence[str]) -> dict[str, Any]:
    """Add `a.b.c=v1,v2` sweeps (`--sweep`) to the config's `sweep` mapping; the values are parsed as one YAML list
    (`model.hidden=[64],[64,32]` sweeps two lists)."""
    data = copy.deepcopy(data)
    for item in sweeps:
        key, raw = _split_item(item, "sweep")
        sweep = data.get("sweep") or {}
        if not isinstance(sweep, dict):
            raise ManytaskError("config key 'sweep' must map keys to lists of values (train.lr: [0.01, 0.1]).")
        data["sweep"] = {**sweep, key: load_limited(f"[{raw}]", f"the values of sweep '{clipped(item)}'")}
    return data


def _split_item(item: str, kind: str) -> tuple[str, str]:
    """(key, raw value) of a command line's `key=value`."""
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ManytaskError(f"{kind} '{clipped(item)}' is not of the form key=value.")
    return key, raw


def set_key(data: dict[str, Any], key: str, value: Any, where: str) -> None:
    """Set the dotted `key` (`train.lr`) of `data` to `value`, creating mappings on the way; `where` names the
    setting in errors."""
    parts = key.split(".")
    if "" in parts:
        raise ManytaskError(f"{where} has an empty part in its key; write keys as names joined by single dots "
                            "(train.lr=0.1).")
    if len(parts) > MAX_KEY_PARTS:
        raise ManytaskError(f"{where} has a key of more than {MAX_KEY_PARTS} parts.")
    _set_nested(data, parts, value)


def shown_value(value: Any) -> str:
    """A value as a command line writes it: text as it is, anything else as JSON (`0.01`, `true`, `[64, 32]`)."""
    return value if isinstance(value, str) else json.dumps(value)


def sweep_hint(error: Mapping[str, Any], key: str = "KEY") -> str:
    """'; to run one member per value, use --sweep KEY=a,b' where pydantic refused a list given for one value (an
    override `x=[a,b]` meant as a sweep); '' otherwise."""
    given = error.get("input")
    if not isinstance(given, list) or not (error["type"].endswith("_type") or error["type"] == "literal_error"):
        return ""
    return f"; to run one member per value, use --sweep {clipped(key)}={clipped(','.join(map(shown_value, given)))}"


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
