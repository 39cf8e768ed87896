"""Run configuration: a YAML file or the default job plus `key=value` overrides (`config_sources.py`), validated
into a `RunConfig`.

Named components (method, benchmark, model backbone) are written either as a bare name or as a mapping with a
`name` (for the model: `backbone`) plus that component's parameters, which its registry validates later.
`method` may also be a list: the run then compares several methods, one sub-directory each; `sweep` runs every method
once per point of a grid of other keys' values.
"""

from __future__ import annotations

import copy
import itertools
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, Field, PrivateAttr, ValidationError, field_validator, model_validator

from manytask.client.trainer import TrainConfig
from manytask.config_sources import (
    apply_overrides,
    apply_sweeps,
    default_config,
    load_yaml,
    set_key,
    shown_value,
    sweep_hint,
)
from manytask.devices import DEVICE_PATTERN
from manytask.engine.adversaries import AdversaryConfig
from manytask.errors import ManytaskError, clipped
from manytask.method_entry import (
    PLUGIN,
    TRAIN_OVERRIDES,
    Named,
    check_label,
    method_label,
    method_train,
    named,
    split_plugin,
    with_plugin,
    with_point,
)
from manytask.registry import Params
from manytask.user_code import anchored, import_all

MAX_CLIENTS = 1_000_000  # the client table alone would take gigabytes beyond this
MAX_WIDTH = 65_536  # one layer's width (features or channels); wider layers do not fit in memory next to others
WIDTH_KEYS = ("hidden", "channels", "width", "hidden_size", "intermediate_size", "embed_dim")
MAX_THREADS = 1024
UNSWEPT = ("seed", "seeds", "sweep")  # keys a sweep may not vary: seeds have `seeds`


class FederationConfig(Params):
    num_clients: int = Field(default=10, ge=1, le=MAX_CLIENTS)
    tasks: dict[str, Any] = Field(default_factory=lambda: {"kind": "one-per-client"})
    samples: dict[str, Any] = Field(default_factory=lambda: {"kind": "iid"})
    same_samples: bool | None = Field(
        default=None, description="every task a client holds on the same samples (the first task's partition for "
        "all, on tasks that label the same inputs and are held by the same clients); none: where the method needs "
        "it (lookahead affinities: mas, tag)")


class FlowerConfig(Params):
    """How the Flower engines reach and wait for clients."""

    superlink: str = Field(default="127.0.0.1:9093", description="SuperLink Control API address (engine=flower)")
    root_certificates: str | None = Field(default=None, description="CA certificate (PEM) for TLS; None: insecure")
    round_timeout: float = Field(default=300.0, gt=0, description="seconds to wait for a round's replies")
    connect_timeout: float = Field(default=120.0, gt=0, description="seconds to wait for all SuperNodes")
    client_cpus: float = Field(default=1.0, gt=0, description="CPUs per virtual client (engine=flower-sim)")
    client_gpus: float = Field(default=0.0, ge=0, description="GPUs per virtual client (engine=flower-sim): 0 trains "
                               "them on the CPU (Ray hides the GPUs from them); a fraction shares one, 0.25 among four")
    sim_cpus: int = Field(default=2, ge=1, description="CPUs Ray may use (engine=flower-sim)")


class MlflowConfig(Params):
    tracking_uri: str | None = Field(default=None, description="an MLflow tracking URI (none: SQLite in the run "
                                     "directory, mlflow.db)")
    experiment: str | None = Field(default=None, description="the MLflow experiment's name (none: the config's name)")


class TuneConfig(Params):
    """`manytask tune`: an equal budget of Optuna trials per member, scored on a validation split."""

    trials: int = Field(default=20, ge=1, description="trials per member (the same budget for every method)")
    validation: float = Field(default=0.2, gt=0, lt=1, description="share of every task's training data held "
                              "out to score trials (the test set is never used)")
    space: dict[str, dict[str, Any]] = Field(default_factory=dict, description="per member label: dimensions "
                                             "replacing the declared ones ({low, high, log} or {choices}; null drops)")
    startup_trials: int = Field(default=4, ge=1, description="random trials before TPE models the space and "
                                "before any trial is pruned")
    pruning: bool = Field(default=True, description="stop trials whose validation curve is below the median")
    repeats: int = Field(default=1, ge=1, description="seeds each trial is scored over (seed, seed + 1, ...), each "
                         "with its own validation split, so luck does not pick the values")
    score: Literal["mean", "worst"] = Field(default="mean", description="a trial's score over its repeats: their "
                                            "mean, or the worst of them (values that fail on one seed lose)")


class RunConfig(Params):
    imports: list[str] = Field(
        default_factory=list, description="modules or .py files imported before the config is resolved: your own "
        "methods and benchmarks (file paths relative to the config file; stored absolute)"
    )
    name: str = "run"
    method: Named | list[Named]
    benchmark: Named
    federation: FederationConfig = FederationConfig()
    model: Named = Field(default_factory=lambda: {"backbone": "mlp"})
    train: TrainConfig = TrainConfig()
    rounds: int = Field(default=20, ge=1)
    seed: int = Field(default=0, ge=0, description="a non-negative integer")
    seeds: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, description="run every member once per seed (replaces 'seed'); reports show mean ± std"
    )
    sweep: dict[str, list[Any]] | None = Field(
        default=None, description="run every member once per point of this grid, the product of the lists in order "
        "({train.lr: [0.01, 0.1]}), labelled with the point's values (fedavg lr=0.01)"
    )
    engine: Literal["local", "flower-sim", "flower"] = "local"
    flower: FlowerConfig = FlowerConfig()
    participation: float = Field(default=1.0, gt=0, le=1, description="fraction of clients sampled per round")
    clients_per_round: int | None = Field(default=None, ge=1, description="overrides participation when set")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="probability a sampled client fails to reply")
    eval_every: int = Field(default=1, ge=1)
    min_replies: int = Field(default=1, ge=1, description="fewer replies than this (or than sampled) fail a round")
    reference: str | None = Field(default="centralized", description="run label normalizing accuracy")
    threads: int = Field(
        default=1, ge=1, le=MAX_THREADS, description="torch intra-op threads; small models are fastest on 1"
    )
    workers: int = Field(default=1, ge=1, description="processes training a round's clients in parallel (local "
                         "engine); with execution sequential the numbers do not depend on it, batched only within "
                         "float tolerance")
    execution: Literal["auto", "sequential", "vectorized"] = Field(
        default="auto", description="local engine: a round's clients trained as one batched computation where their "
        "methods allow it, else one after another with a one-line notice saying why (auto); always one after another "
        "(sequential); or batched, refusing to fall back (vectorized). With workers, each worker batches its share of "
        "the round. Batched equals sequential within float tolerance",
    )
    vector_clients: int = Field(default=256, ge=1,
                                description="execution auto or vectorized: clients per batched computation")
    memory_budget_gb: float | None = Field(
        default=None, gt=0, description="execution auto or vectorized: memory one batched computation may take "
        "(estimated per client); more clients train in several; none: half a GPU's free memory, a quarter of RAM")
    device: str = Field(
        default="auto", description="where clients train: cpu, cuda (the first GPU), cuda:N (GPU N), or auto (the "
        "first GPU when torch sees one, else the CPU)"
    )
    checkpoint_every: int = Field(
        default=1, ge=1, description="write the checkpoint after every k-th round (and the last): a resumed run "
        "gives the uninterrupted numbers either way, redoing at most k - 1 rounds"
    )
    checkpoint_background: bool = Field(
        default=True, description="write each checkpoint on a second thread while the next round trains (a crash "
        "then may lose one round more, which the resumed run redoes to the same numbers); false: the round waits"
    )
    power_watts: float = Field(
        15.0, gt=0, description="power of one busy client process for energy estimates (W): a laptop CPU core"
    )
    plugins: list[Named | None] | None = Field(
        default=None, description="run every method entry with each of these plug-ins (null: the method alone)"
    )
    adversaries: AdversaryConfig | None = Field(
        default=None, description="attack simulation: which clients corrupt their replies, and how"
    )
    loggers: list[Literal["tensorboard", "mlflow"]] = Field(
        default_factory=list, description="experiment trackers that log every round, the config, the summary and the "
        "report (each an optional extra)"
    )
    mlflow: MlflowConfig = MlflowConfig()
    tune: TuneConfig | None = Field(default=None, description="settings of manytask tune (ignored by run)")
    tuned: dict[str, Any] | None = Field(
        default=None, description="written by manytask tune: its budget, each member's space and best values"
    )
    _point: str = PrivateAttr(default="")  # the values of the sweep point this config is (`lr=0.01 zeta=0.1`)

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        if re.fullmatch(DEVICE_PATTERN, value) is None:
            raise ValueError("input should be 'auto', 'cpu', 'cuda' or 'cuda:N' (N a GPU's number)")
        return value

    @field_validator("method", mode="before")
    @classmethod
    def _methods(cls, value: Any) -> Any:
        if isinstance(value, list):
            if not value:
                raise ValueError("the method list is empty")
            return [named(v, "name") for v in value]
        return named(value, "name")

    @field_validator("benchmark", mode="before")
    @classmethod
    def _benchmark(cls, value: Any) -> Named:
        return named(value, "name")

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, value: Any) -> Named:
        return named(value, "backbone")

    @field_validator("plugins", mode="before")
    @classmethod
    def _plugins(cls, value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, list) or not value:
            raise ValueError("expected a non-empty list of plug-ins (null or 'none' for the method alone)")
        return [None if v is None or v == "none" else named(v, "name") for v in value]

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and not value:
            raise ValueError("the seed list is empty (leave 'seeds' out for one run with 'seed')")
        if value is not None and len(set(value)) < len(value):
            raise ValueError("a seed appears twice")
        return value

    @field_validator("sweep")
    @classmethod
    def _sweep(cls, value: dict[str, list[Any]] | None) -> dict[str, list[Any]] | None:
        if value is not None and not value:
            raise ValueError("the sweep is empty (leave 'sweep' out to run every member once)")
        for key, values in (value or {}).items():
            if key.split(".")[0] in UNSWEPT:
                raise ValueError(f"'{clipped(key)}' cannot be swept; list seeds in 'seeds'")
            if not values:
                raise ValueError(f"'{clipped(key)}' has no values to sweep")
        return value

    @property
    def is_comparison(self) -> bool:
        """Several members (a method list, methods crossed with plug-ins, seeds, or a sweep), one sub-directory
        each."""
        return (isinstance(self.method, list) or self.plugins is not None or self.seeds is not None
                or self.sweep is not None)

    @property
    def point(self) -> str:
        """The values of the sweep point this config is one member of (`lr=0.01 zeta=0.1`); '' outside a sweep."""
        return self._point

    def points(self) -> list[RunConfig]:
        """One config per point of `sweep` (the product of its lists, in order), each validated: this config with
        the point's values set, no `sweep`, and its member entries (`methods`) labelled with the values
        (`fedavg lr=0.01`); or this config alone."""
        if self.sweep is None:
            return [self]
        base = self.model_dump(mode="json", exclude={"sweep"})
        keys = list(self.sweep)
        names = short_names(keys)
        return [self._at_point(base, list(zip(keys, names, values, strict=True)))
                for values in itertools.product(*self.sweep.values())]

    @staticmethod
    def _at_point(base: dict[str, Any], settings: list[tuple[str, str, Any]]) -> RunConfig:
        """`base` with each (key, short name, value) of `settings` set, its member entries labelled with them."""
        data = copy.deepcopy(base)
        for key, _, value in settings:
            set_key(data, key, value, f"sweep key '{clipped(key)}'")
        point = " ".join(f"{name}={shown_value(value)}" for _, name, value in settings)
        entries = [with_point(entry, point) for entry in validate(data).methods]
        config = validate({**data, "method": entries, "plugins": None})
        config._point = point
        return config

    def per_seed(self) -> list[RunConfig]:
        """One config per seed of `seeds` (each with that `seed` and no `seeds`), or this config alone."""
        if self.seeds is None:
            return [self]
        return [self.model_copy(update={"seed": seed, "seeds": None}) for seed in self.seeds]

    @property
    def methods(self) -> list[Named]:
        """The member entries: the method entries, each crossed with every entry of `plugins` when given."""
        entries = self.method if isinstance(self.method, list) else [self.method]
        if self.plugins is None:
            return entries
        return [with_plugin(entry, plugin) for entry in entries for plugin in self.plugins]

    @model_validator(mode="after")
    def _method_entries(self) -> RunConfig:
        entries = self.method if isinstance(self.method, list) else [self.method]
        if self.plugins is not None and any(PLUGIN in entry for entry in entries):
            raise ValueError("give plug-ins either in 'plugins' or in method entries, not both")
        for method in self.methods:
            method_train(self.train, method)
            split_plugin(method)
            check_label(method_label(method))
        return self

    def for_method(self, method: Named) -> RunConfig:
        """The single-method config of one member of a comparison, with the method's own `train` overrides (papers
        tune the learning rate per method) applied to the run's train settings."""
        entry = {k: v for k, v in method.items() if k != TRAIN_OVERRIDES}
        return self.model_copy(update={"method": entry, "train": method_train(self.train, method), "plugins": None,
                                       "sweep": None})


def short_names(keys: list[str]) -> list[str]:
    """Each key's last part (`lr` for train.lr) to label sweep points with, or the whole key where two end alike."""
    last = [key.rsplit(".", 1)[-1] for key in keys]
    return [part if last.count(part) == 1 else key for part, key in zip(last, keys, strict=True)]


def validate(data: dict[str, Any]) -> RunConfig:
    """Validate a raw config mapping; one sentence on the first problem. Its `imports` are imported first, so the
    names they register resolve in every process that validates the config."""
    _check_values(data)
    if "imports" in data:
        data = {**data, "imports": import_all(data["imports"])}
    try:
        config = RunConfig(**data)
    except ValidationError as err:
        raise ManytaskError(describe_config_error(err)) from None
    _check_widths(config.model)
    return config


def _check_values(data: dict[str, Any]) -> None:
    """Every mapping key is text and every number finite (`.inf`/`.nan` would pass `lr > 0` and diverge later)."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            for key, child in value.items():
                if not isinstance(key, str):
                    place = f"config key '{clipped(where)}'" if where else "the config"
                    raise ManytaskError(f"{place} has the key {clipped(repr(key))}, which is not text; keys are "
                                        "names such as 'rounds'.")
                stack.append((f"{where}.{key}" if where else key, child))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", child) for i, child in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise ManytaskError(f"config key '{clipped(where)}' is invalid: it must be a finite number (got {value}).")


def _check_widths(model: Named) -> None:
    """Layer widths are from 1 to `MAX_WIDTH`: 0 trains nothing, a negative or huge one fails after files exist.
    (Wrong types are left to the backbone's own parameter check, which names the expected type.)"""
    sections = [("model", model)]
    if isinstance(model.get("decoder"), dict):
        sections.append(("model.decoder", model["decoder"]))
    for prefix, section in sections:
        for key in WIDTH_KEYS:
            value = section.get(key)
            widths = value if isinstance(value, list) else [value]
            if any(isinstance(w, int) and not isinstance(w, bool) and not 1 <= w <= MAX_WIDTH for w in widths):
                raise ManytaskError(f"config key '{prefix}.{key}' is invalid: layer widths must be whole numbers from "
                                    f"1 to {MAX_WIDTH} (got {clipped(repr(value))}).")


def describe_config_error(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = [str(p) for p in first["loc"] if not isinstance(p, int)]
    key = clipped(".".join(loc))
    if first["type"] == "extra_forbidden":
        parent = _model_at(RunConfig, loc[:-1])
        valid = ", ".join(parent.model_fields) if parent else "none"
        return f"unknown config key '{key}'; valid keys here: {valid}."
    if first["type"] == "missing":
        return f"the config is missing the required key '{key}'."
    message = first["msg"].removeprefix("Value error, ")
    if not key:  # a check across keys: its message says where
        return f"the config is invalid: {message}."
    given = clipped(repr(first.get("input")))
    return f"config key '{key}' is invalid: {message[0].lower() + message[1:]} (got {given}){sweep_hint(first, key)}."


def _model_at(model: type[BaseModel], path: list[str]) -> type[BaseModel] | None:
    for part in path:
        field = model.model_fields.get(part)
        annotation = field.annotation if field else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def resolve(config_path: str | None, overrides: list[str], sweeps: list[str] | None = None) -> RunConfig:
    """The validated config from an optional YAML file (else the built-in default) plus overrides and `--sweep`
    grids (`train.lr=0.01,0.1`)."""
    base = load_yaml(config_path) if config_path else default_config(overrides)
    if config_path and "imports" in base:  # a file's imports are relative to the file, an override's to the cwd
        base["imports"] = anchored(base["imports"], Path(config_path).resolve().parent)
    return validate(apply_sweeps(apply_overrides(base, overrides), sweeps or []))


def to_yaml(config: RunConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
