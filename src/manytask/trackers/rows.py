"""What a tracker logs from a metrics row or a config: flat `a/b/c` names of finite numbers, and flat params."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

PER_CLIENT = ("bytes_up", "bytes_down", "client_seconds")  # logged as round totals: one series, not one per client
LEFT_OUT = ("round", "sampled", "dropped", "clients", "energy_source")  # ids and per-client values
MAX_PARAM = 500  # the shortest limit a tracker keeps on a param's value (MLflow's older servers)


def row_scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """A metrics row as `{name: value}`: nested numbers as `eval/digit/accuracy`, per-client maps as their total,
    failures as a count; client ids and per-client accuracies are left out (they are in metrics.jsonl)."""
    scalars = {f"{key}_total": float(sum(row[key].values())) for key in PER_CLIENT if isinstance(row.get(key), dict)}
    if "failures" in row:
        scalars["failures"] = float(len(row["failures"]))
    rest = {k: v for k, v in row.items() if k not in (*PER_CLIENT, *LEFT_OUT, "failures")}
    scalars.update(flat_numbers(rest))
    return scalars


def flat_numbers(data: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Every finite number in nested mappings, named by its path (booleans and lists are left out)."""
    found: dict[str, float] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            found.update(flat_numbers(value, f"{name}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            found[name] = float(value)
    return found


def flat_params(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A config as `{"train.lr": "0.05", ...}`: mappings flattened by dotted paths, anything else as text (cut to
    `MAX_PARAM` characters)."""
    params: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            params.update(flat_params(value, f"{name}."))
        else:
            text = str(value)
            params[name] = text if len(text) <= MAX_PARAM else text[: MAX_PARAM - 3] + "..."
    return params
