"""What a fresh process pays to start. A Flower deployment starts one ClientApp process per message (Flower 1.42:
`flwr-clientapp` handles one message and exits), so every import its module makes is paid by every client in every
round; the heavy libraries that only some paths need are imported where they are used."""

import subprocess
import sys

import pytest

HEAVY = ("sklearn", "scipy", "matplotlib", "networkx", "mnist1d", "pandas", "optuna", "transformers")


def imported_by(code: str) -> set[str]:
    """The HEAVY top-level packages in sys.modules after `code` runs in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(done.stdout.split()) & set(HEAVY)


def test_the_flower_client_app_imports_no_heavy_library():
    pytest.importorskip("flwr")
    assert imported_by("import manytask.engine.flower.client_app") == set()


def test_building_and_training_a_digits_client_imports_no_heavy_library():
    """What a ClientApp does with the default benchmark: build the experiment, train one client."""
    code = (
        "from manytask.config import validate\n"
        "from manytask.engine.client_runner import ClientRunner\n"
        "from manytask.experiment import Experiment\n"
        "from tests.conftest import small_config_dict\n"
        "from manytask.messages import encode\n"
        "experiment = Experiment.build(validate(small_config_dict(method='fedavg', rounds=1)))\n"
        "payload = experiment.server_program().configure_fit(0, [0])[0]\n"
        "reply, _ = ClientRunner(experiment).fit(0, 0, encode(payload), {})\n"
        "assert reply\n"
    )
    assert imported_by(code) == set()


def test_a_run_and_its_report_import_no_sklearn_or_scipy_until_a_report_needs_them():
    """`manytask run` imports the report's modules at its start; only the reports of runs with task groups or
    communities reach scikit-learn (and SciPy through it)."""
    code = "import manytask.cli, manytask.launch, manytask.report, manytask.progress"
    assert imported_by(code) <= {"matplotlib", "networkx"}
