"""MLflow: one MLflow run per node (a comparison's members nested under it, and under their label with `seeds`),
params from each node's resolved config, every round's metrics by step, each member's summary, and the report with
its plots as artifacts. The store defaults to SQLite inside the run directory (`mlflow.db`, artifacts in
`mlartifacts/`), so nothing needs a server; `mlflow.tracking_uri` points elsewhere. The runs' ids are kept in
`trackers.json`, so a resumed run continues the same MLflow runs."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from manytask.trackers.rows import flat_numbers, flat_params
from manytask.trackers.session import Node

STATE = "trackers.json"
STEP_KEY = "round"
BATCH = 1000  # metrics per log_batch call (MLflow's limit); params go 100 at a time
PARENT_TAG = "mlflow.parentRunId"


def metric_key(name: str) -> str:
    """A name MLflow accepts (letters, digits, _ - . space : /)."""
    return re.sub(r"[^\w\-. :/]", "_", name)


class MlflowBackend:
    def __init__(self, config: Any, out: Path) -> None:
        from mlflow import MlflowClient

        self.state_path = out / STATE
        saved = json.loads(self.state_path.read_text()).get("mlflow", {}) if self.state_path.is_file() else {}
        self.uri = (config.mlflow.tracking_uri or saved.get("tracking_uri")
                    or f"sqlite:///{(out / 'mlflow.db').resolve()}")
        self.client = MlflowClient(self.uri)
        name = config.mlflow.experiment or config.name
        found = self.client.get_experiment_by_name(name)
        self.experiment = found.experiment_id if found is not None else self.client.create_experiment(
            name, artifact_location=(out / "mlartifacts").resolve().as_uri())
        self.runs: dict[str, str] = dict(saved.get("runs", {}))

    def open(self, nodes: Sequence[Node]) -> None:
        from mlflow.entities import Param, RunStatus

        for node in nodes:
            if node.name in self.runs:  # a resumed run: the same MLflow run goes on
                self.client.update_run(self.runs[node.name], status=RunStatus.to_string(RunStatus.RUNNING))
                continue
            tags = {PARENT_TAG: self.runs[node.parent]} if node.parent is not None else {}
            run = self.client.create_run(self.experiment, run_name=node.name, tags=tags)
            self.runs[node.name] = run.info.run_id
            params = [Param(metric_key(k), v) for k, v in flat_params(node.config).items()]
            for start in range(0, len(params), 100):
                self.client.log_batch(run.info.run_id, params=params[start:start + 100])
            self._save()

    def last_step(self, node: Node) -> int:
        history = self.client.get_metric_history(self.runs[node.name], STEP_KEY)
        return max((m.step for m in history), default=0)

    def log(self, node: Node, step: int, scalars: dict[str, float]) -> None:
        self._metrics(node, step, {**scalars, STEP_KEY: float(step)})

    def conclude(self, node: Node, summary: dict[str, Any]) -> None:
        final = {f"summary/{k}": v for k, v in flat_numbers(summary).items()}
        self._metrics(node, int(summary.get("rounds", 0)), final)
        for name in ("summary.json", "config.yaml"):
            if (node.run_dir / name).is_file():
                self.client.log_artifact(self.runs[node.name], str(node.run_dir / name))

    def attach(self, node: Node, report: Path) -> None:
        run = self.runs[node.name]
        self.client.log_artifact(run, str(report))
        if not node.is_member and (node.run_dir / "summary.json").is_file():  # a comparison's normalized summary
            self.client.log_artifact(run, str(node.run_dir / "summary.json"))
        if (report.parent / "plots").is_dir():
            self.client.log_artifacts(run, str(report.parent / "plots"), "plots")

    def close(self, finished: bool) -> None:
        status = "FINISHED" if finished else "KILLED"  # KILLED runs are continued by --resume
        for run in self.runs.values():
            self.client.set_terminated(run, status)

    def _metrics(self, node: Node, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        metrics = [Metric(metric_key(k), v, stamp, step) for k, v in values.items()]
        for start in range(0, len(metrics), BATCH):
            self.client.log_batch(self.runs[node.name], metrics=metrics[start:start + BATCH])

    def _save(self) -> None:
        state = json.loads(self.state_path.read_text()) if self.state_path.is_file() else {}
        state["mlflow"] = {"tracking_uri": self.uri, "experiment_id": self.experiment, "runs": self.runs}
        temporary = self.state_path.with_suffix(".tmp")
        temporary.write_text(json.dumps(state, indent=2) + "\n")
        temporary.replace(self.state_path)
