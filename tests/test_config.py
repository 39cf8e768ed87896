from pathlib import Path

import pytest

from manytask.config import resolve, validate
from manytask.config_sources import apply_overrides
from manytask.errors import ManytaskError
from tests.conftest import small_config_dict

ROOT = Path(__file__).resolve().parents[1]


def test_overrides_parse_yaml_values_and_nest():
    data = apply_overrides(small_config_dict(), ["rounds=5", "train.lr=0.1", "method=[fedavg, local]"])
    config = validate(data)
    assert config.rounds == 5 and config.train.lr == 0.1
    assert [m["name"] for m in config.methods] == ["fedavg", "local"]


def test_override_parameter_of_a_named_method():
    data = apply_overrides(small_config_dict(method="fedprox"), ["method.mu=0.3"])
    assert validate(data).method == {"name": "fedprox", "mu": 0.3}


def test_override_without_equals_is_an_error():
    with pytest.raises(ManytaskError, match="key=value"):
        apply_overrides({}, ["rounds"])


def test_default_config_is_the_matu_comparison_and_matches_its_shipped_twin():
    config = resolve(None, [])
    assert [m["name"] for m in config.methods] == ["matu", "fedavg", "matfl", "individual"]
    assert config.benchmark["name"] == "digits-tasks"
    assert config.federation.tasks["kind"] == "dirichlet"
    shipped = resolve(str(ROOT / "configs" / "matu" / "digits_multi_task.yaml"), ["name=default"])
    assert shipped == config


def test_missing_required_key_names_it():
    data = small_config_dict()
    del data["benchmark"]
    with pytest.raises(ManytaskError, match="missing the required key 'benchmark'"):
        validate(data)


def test_a_method_may_override_train_settings_for_itself_only(tmp_path):
    import json

    from manytask.launch import run_config

    data = small_config_dict(method=["local", {"name": "local", "label": "fast", "train": {"lr": 0.2}}], rounds=1)
    config = validate(data)
    plain, fast = (config.for_method(m) for m in config.methods)
    assert (plain.train.lr, fast.train.lr) == (0.05, 0.2)
    assert fast.train.local_steps == 5 and "train" not in fast.method  # the rest is the run's; params stay clean
    run_config(config, tmp_path)
    assert "lr: 0.2" in (tmp_path / "fast" / "config.yaml").read_text()
    assert json.loads((tmp_path / "fast" / "summary.json").read_text())["tasks"] != json.loads(
        (tmp_path / "local" / "summary.json").read_text())["tasks"]


@pytest.mark.parametrize(("train", "message"), [
    ({"lr": -1}, r"method 'fedprox': train\.lr: Input should be greater than 0"),
    ({"bogus": 1}, r"method 'fedprox': unknown train key 'bogus'; valid keys: optimizer, lr"),
    (5, r"method 'fedprox': 'train' must map train settings to values"),
])
def test_bad_method_train_overrides_are_one_clear_sentence(train, message):
    with pytest.raises(ManytaskError, match=message):
        validate(small_config_dict(method=[{"name": "fedprox", "train": train}]))


def test_a_plugin_wraps_a_host_and_labels_it():
    from manytask.launch import plan
    from manytask.method_entry import method_label

    config = validate(small_config_dict(method={"name": "fedprox", "mu": 0.01, "plugin": {"name": "dea", "rho": 0.3}}))
    (experiment,) = plan(config)
    assert experiment.label == "fedprox+dea" and experiment.plugin_params.rho == 0.3
    assert method_label({"name": "fedavg", "plugin": "pcgrad"}) == "fedavg+pcgrad"
    assert type(experiment.client_program().host).__name__ == "FedProxClient"
    assert type(experiment.server_program().host).__name__ == "FedAvgServer"


def test_plugins_cross_every_method_entry():
    config = validate(small_config_dict(method=["fedavg", {"name": "fedprox", "label": "prox"}],
                                        plugins=[None, "dea", {"name": "fedheal", "beta": 0.5}]))
    from manytask.method_entry import method_label

    assert config.is_comparison
    assert [method_label(m) for m in config.methods] == [
        "fedavg", "fedavg+dea", "fedavg+fedheal", "prox", "prox+dea", "prox+fedheal"]
    assert config.for_method(config.methods[2]).plugins is None
    ablation = validate(small_config_dict(method="fedavg", plugins=[
        {"name": "dea", "rho": 0.3}, {"name": "dea", "rho": 0.3, "rescale": False, "label": "dea-plain"}]))
    assert [method_label(m) for m in ablation.methods] == ["fedavg+dea", "fedavg+dea-plain"]


@pytest.mark.parametrize(("method", "message"), [
    ({"name": "matu", "plugin": "dea"},
     r"plug-in 'dea' cannot wrap 'matu'; it wraps: fedacg, fedadagrad, fedadam, fedavg, fedbn, "),
    ({"name": "fedavg", "plugin": "dae"}, r"unknown plug-in 'dae'"),
    ({"name": "fedavg", "plugin": {"name": "dea", "rho": 0}}, r"parameter 'rho' of plug-in 'dea' is invalid"),
    ({"name": "fedavg", "plugin": {"rho": 0.3}}, r"'plugin' must be a name or a mapping with a 'name'"),
])
def test_bad_plugins_are_one_clear_sentence(method, message):
    from manytask.launch import plan

    with pytest.raises(ManytaskError, match=message):
        plan(validate(small_config_dict(method=method)))


def test_plugins_given_twice_is_an_error():
    with pytest.raises(ManytaskError, match="either in 'plugins' or in method entries"):
        validate(small_config_dict(method={"name": "fedavg", "plugin": "dea"}, plugins=["pcgrad"]))
