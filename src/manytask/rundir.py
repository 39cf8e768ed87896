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
from manytask.input_limits import shown_path


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
        """Make the directory; refuse to mix a new run into a non-empty one, and refuse a path that is a file or
        cannot be created, leaving behind none of the parent directories made on the way."""
        shown = shown_path(self.path)
        try:
            if self.path.exists() and not self.path.is_dir():
                raise ManytaskError(f"run directory '{shown}' is an existing file, not a directory; choose another "
                                    "--out.")
            if self.path.is_dir() and self.holds_more_than_temporaries():
                raise ManytaskError(
                    f"run directory '{shown}' already exists and is not empty; "
                    f"choose another --out or continue it with --resume {shown}."
                )
            missing = [p for p in (self.path, *self.path.parents) if not p.exists()]
        except OSError as err:
            raise ManytaskError(f"run directory '{shown}' cannot be used ({err.strerror or err}); choose another "
                                "--out.") from None
        self.remove_temporaries()  # a run killed while writing its first file left only those: start it anew
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            if not os.access(self.path, os.W_OK | os.X_OK):
                raise PermissionError(13, "Permission denied")
        except OSError as err:
            for made in missing:  # deepest first; rmdir removes only empty directories, so this is safe
                try:
                    made.rmdir()
                except OSError:
                    continue  # never made (the failure came first), or not empty
            raise ManytaskError(f"cannot create the run directory '{shown}' ({err.strerror or err}); choose a "
                                "writable --out.") from None

    def start(self, config_yaml: str, federation: dict[str, Any]) -> None:
        """Create a new run directory with its resolved config and federation."""
        self.create()
        self.write_text(self.config, config_yaml)
        self.write_federation(federation)

    def is_finished(self) -> bool:
        """A summary exists and is not that of a run stopped by a failed round (which can be resumed)."""
        return self.summary.is_file() and "stopped" not in json.loads(self.summary.read_text())

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

    def write_federation(self, federation: dict[str, Any]) -> None:
        """federation.json, without indentation: it lists every sample index of every client, and indented JSON
        puts each index on a line of its own (100 MB for a million clients, against 40) and is written by json's
        pure-Python encoder (4.6 s there, against 0.7)."""
        self.write_text(self.federation, json.dumps(federation, separators=(",", ":")) + "\n")

    def append_metrics(self, row: dict[str, Any]) -> None:
        with self.metrics.open("a") as handle:
            handle.write(json.dumps(row) + "\n")

    def read_metrics(self) -> list[dict[str, Any]]:
        """The rows of metrics.jsonl. A last line without its newline is a row whose write a crash cut short: it is
        left out (the round is run again on resume)."""
        if not self.metrics.exists():
            return []
        text = self.metrics.read_text()
        lines = text.split("\n")
        complete = lines if text.endswith("\n") else lines[:-1]
        return [json.loads(line) for line in complete if line.strip()]

    def temporaries(self) -> list[Path]:
        """Files an interrupted atomic write left behind: ours (`<name>.tmp`) and those safetensors writes through
        before renaming (`.tmp` + 6 characters)."""
        if not self.path.is_dir():
            return []
        return sorted({*self.path.glob("*.tmp"), *self.path.glob(".tmp??????")})

    def holds_more_than_temporaries(self) -> bool:
        stray = set(self.temporaries())
        return any(path not in stray for path in self.path.iterdir())

    def remove_temporaries(self) -> list[Path]:
        """Delete the temporaries an interrupted atomic write left behind (the file it replaces is intact)."""
        stray = self.temporaries()
        for path in stray:
            path.unlink()
        return stray

    def truncate_metrics(self, last_round: int) -> list[dict[str, Any]]:
        """Drop rows after `last_round` (written after the last checkpoint of a crashed run)."""
        rows = [r for r in self.read_metrics() if r["round"] <= last_round]
        self.write_text(self.metrics, "".join(json.dumps(r) + "\n" for r in rows))
        return rows
