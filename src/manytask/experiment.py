"""`Experiment`: a validated single-method config turned into benchmark, federation and method programs.

Everything an engine needs is here; engines only decide where the programs run."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from manytask.benchmarks import Benchmark, build_benchmark
from manytask.benchmarks.exported import FEDERATION_KEY, FINGERPRINTS_KEY
from manytask.client.trainer import TaskData
from manytask.config import RunConfig
from manytask.engine.adversaries import attacking_clients
from manytask.engine.sampling import clients_per_round
from manytask.errors import ManytaskError
from manytask.federation import Federation, build_federation
from manytask.federation.fingerprint import client_fingerprint, data_fingerprint
from manytask.method_entry import method_label, split_method, split_plugin
from manytask.methods import METHODS, PLUGINS, ClientProgram, MethodDef, ServerProgram, Setup
from manytask.methods.registry import PluginDef
from manytask.models import BACKBONES
from manytask.models.adapters import LoraParams
from manytask.models.decoders import DecoderParams
from manytask.pretrain import Pretrained, PretrainParams, pretrained_backbone
from manytask.registry import Params, describe_validation_error


@dataclass
class Experiment:
    config: RunConfig
    label: str
    method_name: str
    method: MethodDef
    method_params: Params
    benchmark: Benchmark
    federation: Federation
    setup: Setup
    pretraining: str | None = None  # what the backbone was pretrained on (for reports)
    plugin: PluginDef | None = None  # wraps the method's programs
    plugin_params: Params | None = None

    @classmethod
    def build(cls, config: RunConfig, benchmark: Benchmark | None = None) -> Experiment:
        """Validate everything and build the data; raises ManytaskError before anything is written."""
        if isinstance(config.method, list):
            raise ValueError("Experiment.build takes a single-method config; use config.for_method()")
        name, raw_params = split_method(config.method)
        method = METHODS.get(name).target
        params = METHODS.parse_params(name, raw_params)
        plugin, plugin_params = parse_plugin(config.method, name)
        model = ModelConfig(**config.model)
        if benchmark is None:
            benchmark = make_benchmark(config)
        benchmark = benchmark.with_losses(config.train.losses)
        pretrained = model.pretrained_weights(benchmark, config.seed)
        federation = make_federation(config, benchmark, method)
        if config.workers > 1 and config.engine != "local":
            raise ManytaskError(f"workers={config.workers} spreads clients over processes of the local engine; "
                                f"engine '{config.engine}' places clients itself, so set workers: 1.")
        if config.execution == "vectorized" and config.engine != "local":
            raise ManytaskError(f"execution: vectorized batches a round's clients in the local engine's processes; "
                                f"engine '{config.engine}' places clients elsewhere, so use one or the other.")
        if config.clients_per_round is not None and config.clients_per_round > federation.num_clients:
            raise ManytaskError(
                f"clients_per_round={config.clients_per_round} exceeds the {federation.num_clients} clients."
            )
        setup = Setup(
            specs=benchmark.specs, input_shape=benchmark.input_shape, backbone=model.backbone,
            backbone_params=model.backbone_params, train=config.train, seed=config.seed, rounds=config.rounds,
            holdings=federation.sizes(), adapter=model.adapter_settings(),
            pretrained=None if pretrained is None else str(pretrained.path), decoder=model.decoder_settings(),
            clients_per_round=clients_per_round(federation.num_clients, config.participation, config.clients_per_round),
        )
        description = None if pretrained is None else pretrained.description
        experiment = cls(config, method_label(config.method), name, method, params, benchmark, federation, setup,
                         description, plugin, plugin_params)
        experiment.total_rounds  # noqa: B018  (a method's round plan refuses impossible settings here, before any file)
        experiment.adversary_clients  # noqa: B018  (attackers the federation does not have are refused here too)
        return experiment

    @property
    def adversary_clients(self) -> frozenset[int]:
        """The clients that corrupt their replies (`adversaries:`), none without attack simulation."""
        attack = self.config.adversaries
        return frozenset() if attack is None else attacking_clients(attack, self.federation.num_clients,
                                                                    self.config.seed)

    @cached_property
    def data_fingerprint(self) -> str:
        """Every client's training data and every test set, as one digest (`federation/fingerprint.py`)."""
        return data_fingerprint(self.benchmark.tasks, self.federation)

    def client_fingerprint(self, client: int) -> str:
        """One client's training data as a digest: what the node that trains it must hold (the export's record,
        where the data live on the nodes)."""
        recorded = self.benchmark.metadata.get(FINGERPRINTS_KEY)
        if recorded is not None and self.benchmark.metadata.get("export_client") is None:
            return recorded[client]
        return client_fingerprint(self.client_data(client))

    def federation_record(self) -> dict[str, Any]:
        """What a run directory's federation.json holds: client -> task -> sample indices, and the data's
        fingerprint."""
        return {**self.federation.to_json(), "data_fingerprint": self.data_fingerprint}

    @property
    def total_rounds(self) -> int:
        """The rounds the engine runs: the config's `rounds`, or more for a method that trains models in turn."""
        return self.method.server.total_rounds(self.setup, self.method_params)

    def client_program(self) -> ClientProgram:
        host = self.method.client(self.setup, self.method_params)
        return host if self.plugin is None else self.plugin.client(host, self.setup, self.plugin_params)

    def server_program(self) -> ServerProgram:
        host = self.method.server(self.setup, self.method_params)
        return host if self.plugin is None else self.plugin.server(host, self.setup, self.plugin_params)

    def client_data(self, client: int) -> TaskData:
        """The client's training tensors per held task."""
        data = {}
        for task, indices in self.federation.clients[client].items():
            t = self.benchmark.tasks[task]
            data[task] = (t.x_train[indices], t.y_train[indices])
        return data

    def test_data(self, tasks: list[str] | None = None) -> TaskData:
        names = self.benchmark.task_names if tasks is None else tasks
        return {n: (self.benchmark.tasks[n].x_test, self.benchmark.tasks[n].y_test) for n in names}


def parse_plugin(entry: dict[str, Any], method: str) -> tuple[PluginDef | None, Params | None]:
    """The method entry's plug-in and its validated parameters; it must accept the method's family."""
    found = split_plugin(entry)
    if found is None:
        return None, None
    name, raw = found
    plugin = PLUGINS.get(name).target
    plugin.check_host(name, method)
    return plugin, PLUGINS.parse_params(name, raw)


def make_benchmark(config: RunConfig) -> Benchmark:
    params = {k: v for k, v in config.benchmark.items() if k != "name"}
    return build_benchmark(config.benchmark["name"], params, config.seed)


def make_federation(config: RunConfig, benchmark: Benchmark, method: MethodDef) -> Federation:
    fed = config.federation
    exported = benchmark.metadata.get(FEDERATION_KEY)
    if exported is not None:  # node-local data: the federation the partitions were exported with
        if config.engine != "flower":
            raise ManytaskError(f"exported partitions live on their SuperNodes, so they run on engine: flower (a "
                                f"deployment), not engine: {config.engine}; run the original config there.")
        if method.pooled:
            raise ManytaskError("a pooled reference (centralized) needs every client's data in one place; exported "
                                "partitions keep each on its node.")
        if exported.num_clients != fed.num_clients:
            raise ManytaskError(f"the export holds {exported.num_clients} clients, but federation.num_clients is "
                                f"{fed.num_clients}.")
        return exported
    if method.pooled:
        return Federation.pooled({n: t.num_train for n, t in benchmark.tasks.items()})
    return build_federation(benchmark, fed.num_clients, fed.tasks, fed.samples, config.seed,
                            same_samples=same_samples(config, method))


def same_samples(config: RunConfig, method: MethodDef) -> bool:
    """Whether a client's tasks get the same samples: as the config says, else where the method needs it."""
    chosen = config.federation.same_samples
    if chosen is None:
        return method.same_batch
    if method.same_batch and not chosen:
        raise ManytaskError(f"method '{split_method(config.method)[0]}' measures lookahead affinities on all of a "
                            "client's tasks at once, on the same inputs; leave federation.same_samples out or set it "
                            "true.")
    return chosen


class ModelConfig:
    """`model:` = a backbone name and its parameters, plus `adapter` (LoRA), `pretrained`, `pretrain` and
    `decoder` (the dense decoders' params)."""

    EXTRA = ("backbone", "adapter", "pretrained", "pretrain", "decoder")

    def __init__(self, **values: Any) -> None:
        self.backbone = values["backbone"]
        self.backbone_params = {k: v for k, v in values.items() if k not in self.EXTRA}
        parsed = BACKBONES.parse_params(self.backbone, self.backbone_params)  # a typo fails before data is built
        _check_weights_exist(getattr(parsed, "weights", None))
        adapter = values.get("adapter")
        self.adapter = None if adapter is None else _parse(LoraParams, adapter, "model.adapter")
        self.pretrained = bool(values.get("pretrained", False))
        self.pretrain = _parse(PretrainParams, values.get("pretrain") or {}, "model.pretrain")
        self.decoder = _parse(DecoderParams, values.get("decoder") or {}, "model.decoder")

    def decoder_settings(self) -> dict[str, Any] | None:
        return self.decoder.model_dump() if self.decoder.model_fields_set else None

    def adapter_settings(self) -> dict[str, Any] | None:
        return None if self.adapter is None else self.adapter.model_dump()

    def pretrained_weights(self, benchmark: Benchmark, seed: int) -> Pretrained | None:
        if not self.pretrained:
            return None
        return pretrained_backbone(benchmark, self.backbone, self.backbone_params, self.pretrain, seed)


def _check_weights_exist(weights: str | None) -> None:
    """A backbone checkpoint that is not there must stop the run before its directory is written."""
    if weights is not None and not Path(weights).expanduser().exists():
        raise ManytaskError(f"backbone weights not found: {Path(weights).expanduser()} does not exist.")


def _parse(model: type[Params], values: Any, where: str) -> Params:
    if not isinstance(values, dict):
        raise ManytaskError(f"'{where}' must be a mapping of parameters, got {values!r}.")
    try:
        return model(**values)
    except ValidationError as err:
        raise ManytaskError(describe_validation_error(err, f"'{where}'", model)) from None
