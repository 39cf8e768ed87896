"""The run directory: config.yaml, federation.json, metrics.jsonl, summary.json, checkpoint.safetensors, and for
dense runs predictions.safetensors (a few test images, their targets and the final model's outputs).

Everything a user sees later (tables, plots, reports, resume) is read back from here."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from safetensors.torch import save_file
from torch import Tensor

from manytask.errors import ManytaskError


class RunDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    config = property(lambda self: self.path / "config.yaml")
    federation = property(lambda self: self.path / "federation.json")
    metrics = property(lambda self: self.path / "metrics.jsonl")
    summary = property(lambda self: self.path / "summary.json")
    checkpoint = property(lambda self: self.path / "checkpoint.safetensors")
    predictions = property(lambda self: self.path / "predictions.safetensors")  # dense runs: the picture grid's

    def create(self) -> None:
        """Make the directory; refuse to mix a new run into a non-empty one."""
        if self.path.exists() and any(self.path.iterdir()):
            raise ManytaskError(
                f"run directory '{self.path}' already exists and is not empty; "
                f"choose another --out or continue it with --resume {self.path}."
            )
        self.path.mkdir(parents=True, exist_ok=True)

    def start(self, config_yaml: str, federation: dict[str, Any]) -> None:
        """Create a new run directory with its resolved config and federation."""
        self.create()
        self.write_text(self.config, config_yaml)
        self.write_json(self.federation, federation)

    def is_finished(self) -> bool:
        return self.summary.is_file()

    def write_text(self, path: Path, text: str) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)

    def write_tensors(self, path: Path, tensors: dict[str, Tensor]) -> None:
        tmp = path.with_name(path.name + ".tmp")
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
        os.replace(tmp, path)

    def write_json(self, path: Path, data: Any) -> None:
        self.write_text(path, json.dumps(data, indent=2) + "\n")

    def append_metrics(self, row: dict[str, Any]) -> None:
        with self.metrics.open("a") as handle:
            handle.write(json.dumps(row) + "\n")

    def read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics.exists():
            return []
        return [json.loads(line) for line in self.metrics.read_text().splitlines() if line.strip()]

    def truncate_metrics(self, last_round: int) -> list[dict[str, Any]]:
        """Drop rows after `last_round` (written after the last checkpoint of a crashed run)."""
        rows = [r for r in self.read_metrics() if r["round"] <= last_round]
        self.write_text(self.metrics, "".join(json.dumps(r) + "\n" for r in rows))
        return rows
