"""A method entry of a run config: `{name, label?, plugin?, train?, ...params}`. Its label names its run directory in a
comparison, its `plugin` wraps it (FedDEA's plug-ins), and its `train` overrides the run's train settings (papers tune
the learning rate per method)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from manytask.client.trainer import TrainConfig
from manytask.errors import clipped

Named = dict[str, Any]

MAX_NAME = 60  # registered names are short; a longer one is a mistake (and is never echoed whole)
MAX_LABEL = 100
TRAIN_OVERRIDES = "train"  # the key of an entry's own train settings
PLUGIN = "plugin"  # the key of an entry's plug-in


def named(value: Any, key: str) -> Named:
    """`value` as a mapping: a bare name becomes {key: name}; a mapping must hold a name of 1 to `MAX_NAME`
    characters under `key`."""
    name = value if isinstance(value, str) else value.get(key) if isinstance(value, dict) else None
    if not isinstance(name, str):
        raise ValueError(f"expected a name or a mapping with a '{key}' entry")
    if not name or len(name) > MAX_NAME:
        raise ValueError(f"expected a name of 1 to {MAX_NAME} characters")
    return {key: value} if isinstance(value, str) else dict(value)


def with_plugin(entry: Named, plugin: Named | None) -> Named:
    """A method entry with a plug-in added (its label, if it has one, gets `+<plug-in>`)."""
    if plugin is None:
        return entry
    crossed = {**entry, PLUGIN: plugin}
    if entry.get("label"):
        crossed["label"] = f"{entry['label']}+{plugin_label(crossed)}"
    return crossed


def with_point(entry: Named, point: str) -> Named:
    """A method entry labelled for one point of a sweep (`swept_label`)."""
    return {**entry, "label": swept_label(method_label(entry), point)}


def swept_label(label: str, point: str) -> str:
    """A member's label at a sweep point: the label, then the point's values (`fedavg lr=0.01`); as it is outside
    a sweep (`point` '')."""
    return f"{label} {point}" if point else label


def method_train(train: TrainConfig, method: Named) -> TrainConfig:
    """The run's train settings updated with a method entry's `train: {...}` overrides, validated."""
    overrides = method.get(TRAIN_OVERRIDES)
    if overrides is None:
        return train
    if not isinstance(overrides, dict):
        raise ValueError(f"method '{clipped(method_label(method))}': 'train' must map train settings to values")
    unknown = sorted(str(key) for key in set(overrides) - set(TrainConfig.model_fields))
    if unknown:
        raise ValueError(f"method '{clipped(method_label(method))}': unknown train key '{clipped(unknown[0])}'; "
                         f"valid keys: {', '.join(TrainConfig.model_fields)}")
    try:
        return TrainConfig.model_validate({**train.model_dump(), **overrides})
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ValueError(f"method '{clipped(method_label(method))}': train.{clipped(where)}: {first['msg']} "
                         f"(got {clipped(repr(first.get('input')))})") from None



def check_label(label: str) -> None:
    """A comparison writes each member to `--out/<label>`: the label must name one directory inside it."""
    if (not 1 <= len(label) <= MAX_LABEL or label in (".", "..") or any(c in label for c in "/\\")
            or not label.isprintable()):
        raise ValueError(f"method label '{clipped(label)}' cannot name a run directory; use 1 to {MAX_LABEL} "
                         "printable characters without '/' or '\\', other than '.' and '..'")


def method_label(method: Named) -> str:
    """The entry's `label`, else its name, with `+<plug-in>` when it has one (`fedprox+dea`)."""
    if method.get("label"):
        return str(method["label"])
    plugin = plugin_label(method)
    return str(method["name"]) + ("" if plugin is None else f"+{plugin}")


def plugin_label(method: Named) -> str | None:
    """The label of a method entry's plug-in: its `label`, else its name (`plugin: dea`; `plugin: {name: dea,
    rescale: false, label: dea-plain}`); None without a plug-in."""
    plugin = method.get(PLUGIN)
    if plugin is None:
        return None
    entry = named(plugin, "name")
    return str(entry.get("label") or entry["name"])


def split_method(method: Named) -> tuple[str, dict[str, Any]]:
    """(registered name, its parameters) of a method entry."""
    params = {k: v for k, v in method.items() if k not in ("name", "label", TRAIN_OVERRIDES, PLUGIN)}
    return method["name"], params


def split_plugin(method: Named) -> tuple[str, dict[str, Any]] | None:
    """(registered name, its parameters) of the entry's plug-in (`plugin: dea` or `plugin: {name: dea, rho: 0.3}`),
    or None without one."""
    plugin = method.get(PLUGIN)
    if plugin is None:
        return None
    try:
        entry = named(plugin, "name")
    except ValueError:
        raise ValueError(f"method '{method['name']}': 'plugin' must be a name or a mapping with a 'name' (names "
                         f"have 1 to {MAX_NAME} characters)") from None
    return entry["name"], {k: v for k, v in entry.items() if k not in ("name", "label")}
