"""`engine: flower`: submit the run to a real SuperLink with `flwr run` and follow it to the end.

The ServerApp runs next to the SuperLink and writes the run directory there; SuperNodes rebuild their own
partition from the config they receive. `flwr run` exits 0 even when a run fails, so the run's status is read
back with `flwr ls` and a failed run becomes a clear error. Given a `Drill`, the run is held at the drill's points
and the driver acts there (`drill.py`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from manytask.config import FlowerConfig, RunConfig, to_yaml
from manytask.engine.flower.cluster import flower_command, flower_env
from manytask.engine.flower.drill import HOLD_KEY, Drill, holds_folder
from manytask.engine.loop import RoundObserver
from manytask.errors import ManytaskError
from manytask.experiment import Experiment
from manytask.launch import plan
from manytask.rundir import RunDir

CONNECTION = "manytask"
POLL_SECONDS = 1.0
HELD = "held by a drill"  # `_follow`'s status of a run a drill's action left held
APP_PYPROJECT = """\
[project]
name = "manytask-run"
version = "1.0.0"
description = "A manytask run submitted to a Flower SuperLink"
license = "Apache-2.0"

[tool.flwr.app]
publisher = "manytask"

[tool.flwr.app.components]
serverapp = "manytask.engine.flower.server_app:app"
clientapp = "manytask.engine.flower.client_app:app"

[tool.flwr.app.config]
manytask-config = ""
run-dir = ""
stop-after = 0
hold-at = ""
"""


def connection_toml(flower: FlowerConfig) -> str:
    """The `flwr` CLI's connection entry for the configured SuperLink."""
    security = "insecure = true" if flower.root_certificates is None else (
        f"root-certificates = {json.dumps(str(Path(flower.root_certificates).resolve()))}")
    return (f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f"address = {json.dumps(flower.superlink)}\n{security}\n")


def run_config_toml(experiment: Experiment, run_dir: RunDir, stop_after: int | None = None,
                    drill: Drill | None = None) -> str:
    """The run's config for the ServerApp; JSON string escapes are valid TOML basic strings. `stop-after` 0 runs
    to the end, `hold-at` "" holds nowhere (Flower accepts only the keys the app declares, each with a value)."""
    return (f"manytask-config = {json.dumps(to_yaml(experiment.config))}\n"
            f"run-dir = {json.dumps(str(run_dir.path.resolve()))}\nstop-after = {int(stop_after or 0)}\n"
            f"{HOLD_KEY} = {json.dumps(drill.run_config_value if drill else '')}\n")


def run_on_superlink(
    experiment: Experiment, run_dir: RunDir, observer: RoundObserver | None = None, stop_after: int | None = None,
    drill: Drill | None = None,
) -> dict[str, Any] | None:
    """Submit the run to the SuperLink and follow it; the summary, or None when it stopped at `stop_after`
    completed rounds (checkpointed, to be resumed) or a drill's action left it held."""
    work = run_dir.path / "flower"
    (work / "app").mkdir(parents=True, exist_ok=True)
    (work / "app" / "pyproject.toml").write_text(APP_PYPROJECT)
    (work / "home").mkdir(exist_ok=True)
    (work / "home" / "config.toml").write_text(connection_toml(experiment.config.flower))
    (work / "run-config.toml").write_text(run_config_toml(experiment, run_dir, stop_after, drill))
    shutil.rmtree(holds_folder(run_dir.path), ignore_errors=True)  # an earlier submission's holds
    env = flower_env(work / "home")
    run_id = _submit(work, env)
    if observer:
        observer.started(experiment.label, experiment.total_rounds, 0)
    status = _follow(run_id, experiment, run_dir, env, observer, drill)
    if status["status"] == HELD:
        return None
    stopped = stop_after is not None and len(run_dir.read_metrics()) >= stop_after
    if status["status"] == "finished:completed" and stopped and not run_dir.summary.exists():
        return None
    if status["status"] != "finished:completed" or not run_dir.summary.exists():
        raise ManytaskError(
            f"Flower run {run_id} ended as '{status['status']}' ({status.get('status-details') or 'no details'}); "
            f"its log: flwr log {run_id} {CONNECTION} --show (with FLWR_HOME={work / 'home'})."
        )
    return json.loads(run_dir.summary.read_text())


def run_drill(config: RunConfig, out: Path, drill: Drill) -> dict[str, Any] | None:
    """Start a one-method, one-seed `engine: flower` run in `out` under a drill; its summary, or None when an action
    left it held (continue it with `manytask run --resume`, or `launch.resume`)."""
    experiments = plan(config)
    if len(experiments) != 1 or config.engine != "flower":
        raise ManytaskError(f"a drill runs one method with one seed on engine flower; this config has "
                            f"{len(experiments)} member(s) on engine {config.engine}.")
    run_dir = RunDir(out)
    run_dir.start(to_yaml(experiments[0].config), experiments[0].federation_record())
    return run_on_superlink(experiments[0], run_dir, drill=drill)


def flwr_cli(args: list[str], env: dict[str, str], timeout: float = 120) -> str:
    done = subprocess.run([flower_command("flwr"), *args], capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        raise ManytaskError(f"'flwr {args[0]}' failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}.")
    return done.stdout


def _submit(work: Path, env: dict[str, str]) -> str:
    out = flwr_cli(["run", str(work / "app"), CONNECTION, "--run-config", str(work / "run-config.toml"),
                    "--format", "json"], env)
    reply = json_in(out)
    if not reply.get("success"):
        raise ManytaskError(f"the SuperLink refused the run: {reply.get('error-message', out.strip())}.")
    return str(reply["run-id"])


def _follow(
    run_id: str, experiment: Experiment, run_dir: RunDir, env: dict[str, str], observer: RoundObserver | None,
    drill: Drill | None,
) -> dict[str, Any]:
    """Poll the run's status until it finishes (with a deadline), reporting rounds as metrics.jsonl grows and
    serving the drill's hold points (status `HELD` once an action leaves the run held)."""
    flower = experiment.config.flower
    deadline = time.monotonic() + flower.connect_timeout + experiment.total_rounds * flower.round_timeout
    reported = 0
    while time.monotonic() < deadline:
        status = _status(run_id, env)
        rows = run_dir.read_metrics()
        for row in rows[reported:]:
            if observer:
                observer.finished_round(row)
        reported = len(rows)
        if status["status"].startswith("finished"):
            return status
        if drill and not drill.serve(holds_folder(run_dir.path)):
            return {"status": HELD}
        time.sleep(POLL_SECONDS)
    flwr_cli(["stop", run_id, CONNECTION], env)
    raise ManytaskError(f"Flower run {run_id} did not finish before its deadline; it was stopped.")


def _status(run_id: str, env: dict[str, str]) -> dict[str, Any]:
    runs = json_in(flwr_cli(["ls", CONNECTION, "--run-id", run_id, "--format", "json"], env)).get("runs", [])
    if not runs:
        raise ManytaskError(f"the SuperLink does not know run {run_id}.")
    return runs[0]


def json_in(text: str) -> dict[str, Any]:
    """The JSON object in a `flwr --format json` output (which may have log lines around it)."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ManytaskError(f"unexpected output from flwr: {text.strip()[:200]!r}.")
    return json.loads(text[start : end + 1])
