"""A run's summary.json and report say where its numbers came from (issue 35: provenance)."""

import json
import platform
import shlex
import subprocess
import sys

import torch
import yaml
from typer.testing import CliRunner

from manytask.cli import app
from manytask.provenance import PACKAGE_DIR
from tests.conftest import small_config_dict


def test_a_fresh_runs_summary_and_report_hold_its_provenance(tmp_path):
    config = tmp_path / "small.yaml"
    config.write_text(yaml.safe_dump(small_config_dict(rounds=1)))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(config), "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    facts = json.loads((out / "summary.json").read_text())["provenance"]
    assert set(facts) == {"manytask", "git_commit", "git_dirty", "python", "torch", "flwr", "device", "platform",
                          "command"}
    assert facts["python"] == platform.python_version() and facts["torch"] == torch.__version__
    assert facts["device"].startswith("cpu (") and facts["platform"] == platform.platform()
    assert facts["command"] == shlex.join(sys.argv)  # the command line of the process that ran it
    head = subprocess.run(["git", "-C", str(PACKAGE_DIR), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # the package runs from a repository (CI's clean clone, this checkout)
        assert facts["git_commit"] == head.stdout.strip() and isinstance(facts["git_dirty"], bool)
    else:
        assert facts["git_commit"] is None and facts["git_dirty"] is None
    report = (out / "report.md").read_text()
    assert "## Provenance" in report and f"torch: {torch.__version__}" in report
