"""TensorBoard: each member's rounds as scalars by step in `<member dir>/tensorboard` (so `tensorboard --logdir RUN`
shows every member as a run), its config and summary as text, and the report and its plots in the root's folder."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from manytask.trackers.session import Node

FOLDER = "tensorboard"
STEP_TAG = "round"  # logged every round: the last step a folder holds is the last round logged


class TensorBoardBackend:
    def __init__(self) -> None:
        self.writers: dict[Path, Any] = {}

    def open(self, nodes: Sequence[Node]) -> None:
        for node in nodes:
            if node.is_member and not self._has_events(node.run_dir / FOLDER):
                config = yaml.safe_dump(node.config, sort_keys=False)
                self._writer(node).add_text("config", f"```yaml\n{config}```", global_step=0)

    def last_step(self, node: Node) -> int:
        folder = node.run_dir / FOLDER
        if not self._has_events(folder):
            return 0
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        events.Reload()
        if STEP_TAG not in events.Tags().get("scalars", []):
            return 0
        return max(event.step for event in events.Scalars(STEP_TAG))

    def log(self, node: Node, step: int, scalars: dict[str, float]) -> None:
        writer = self._writer(node)
        for name, value in scalars.items():
            writer.add_scalar(name, value, global_step=step)
        writer.add_scalar(STEP_TAG, step, global_step=step)
        writer.flush()

    def conclude(self, node: Node, summary: dict[str, Any]) -> None:
        text = json.dumps(summary, indent=2, default=str)
        self._writer(node).add_text("summary", f"```json\n{text}\n```", global_step=summary.get("rounds", 0))

    def attach(self, node: Node, report: Path) -> None:
        from matplotlib.image import imread

        writer = self._writer(node)
        writer.add_text("report", report.read_text(), global_step=0)
        for plot in sorted((report.parent / "plots").glob("*.png")):
            writer.add_image(f"plots/{plot.stem}", imread(plot)[..., :3], global_step=0, dataformats="HWC")

    def close(self, finished: bool) -> None:
        for writer in self.writers.values():
            writer.close()
        self.writers.clear()

    def _writer(self, node: Node) -> Any:
        folder = node.run_dir / FOLDER
        if folder not in self.writers:
            from torch.utils.tensorboard import SummaryWriter

            self.writers[folder] = SummaryWriter(str(folder))
        return self.writers[folder]

    @staticmethod
    def _has_events(folder: Path) -> bool:
        return folder.is_dir() and any(folder.glob("events.out.tfevents.*"))
