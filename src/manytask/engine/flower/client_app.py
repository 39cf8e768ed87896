"""Flower's ClientApp for every manytask method: a thin shell around `ClientRunner`.

A SuperNode learns the run's config in the handshake (a `query` message), rebuilds the benchmark and federation
from it locally (or, with exported partitions, reads its own folder: `data-path` in its node config), and keeps the
client's state in Flower's `context.state` across rounds. Its client id is its node config's `partition-id`.

A node given `state-path` in its node config keeps the client's state there instead, one file per round it trained
(`NodeStates`): written atomically after each fit, named by the run and the round, loaded by the round the server
names (the last one whose reply reached it, kept in the server's checkpoint). So a SuperNode restarted, or a run
resumed as a new Flower run, continues from the very state an uninterrupted run would hold."""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml
from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp

from manytask.benchmarks.exported import check_node_folder
from manytask.config import validate
from manytask.engine.client_runner import ClientRunner, ClientState
from manytask.engine.flower.node_states import NodeStates
from manytask.engine.flower.records import (
    CONTROL_RECORD,
    METRICS_RECORD,
    STATE_RECORD,
    control_of,
    data_of,
    metrics_record,
    payload_bytes,
    payload_record,
    request,
)
from manytask.errors import ManytaskError
from manytask.experiment import Experiment
from manytask.messages import Message as WireMessage
from manytask.messages import as_bytes, decode, encode

CONFIG_RECORD = "manytask.config"
SIMULATED_DROPOUT = 1001  # error code of a reply from a client told to fail (config `dropout`)
_runners: dict[str, ClientRunner] = {}  # one per config per process: building a benchmark is not free

app = ClientApp()


def partition_id(context: Context) -> int:
    return int(context.node_config["partition-id"])


@app.query()
def handshake(msg: Message, context: Context) -> Message:
    """Store the run's config and answer with this node's client id."""
    config_text = node_local(str(control_of(msg.content)["config"]), context)
    context.state[CONFIG_RECORD] = ConfigRecord({"yaml": config_text})
    runner = _runner(config_text)
    client, num_clients = partition_id(context), runner.exp.federation.num_clients
    if client >= num_clients:
        raise ValueError(f"partition-id {client} is outside the federation's {num_clients} clients")
    data = runner.exp.client_fingerprint(client)  # the server refuses a node whose data differ from its own
    return Message(RecordDict({CONTROL_RECORD: ConfigRecord({"client": client, "data": data})}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    control = control_of(msg.content)
    if bool(control.get("drop", False)):
        return Message(Error(SIMULATED_DROPOUT, "simulated dropout"), reply_to=msg)
    runner, client = _runner_for(context), partition_id(context)
    saved, state = _client_state(context, control)
    round_index = int(control["round"])
    reply, seconds = runner.fit(client, round_index, data_of(msg.content), state)
    if saved is None:
        _save_state(context, state)
    else:
        saved.save(round_index + 1, state, keep_from=int(control["keep_from"]))
    return Message(request(None if reply is None else as_bytes(reply), {"seconds": seconds}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    runner, client = _runner_for(context), partition_id(context)
    metrics = runner.evaluate(client, data_of(msg.content), _client_state(context, control_of(msg.content))[1])
    return Message(RecordDict({METRICS_RECORD: metrics_record(metrics)}), reply_to=msg)


def _client_state(context: Context, control: ConfigRecord) -> tuple[NodeStates | None, ClientState]:
    """(the node's saved states, where it keeps them; the client's state the server names, or its context's)."""
    saved = node_states(context, control)
    return saved, _load_state(context) if saved is None else saved.load(int(control["state_round"]))


def node_states(context: Context, control: ConfigRecord) -> NodeStates | None:
    """This node's saved client states for the run the server names, where its node config has a `state-path`."""
    path = context.node_config.get("state-path")
    if not path:
        return None
    return NodeStates(Path(str(path)), str(control["run"]), partition_id(context))


def node_local(config_text: str, context: Context) -> str:
    """The run's config as this node builds it: with exported partitions (`benchmark: exported`), the benchmark
    reads the node's own folder (`data-path` in its node config), checked to hold this client's partition."""
    config = yaml.safe_load(config_text)
    benchmark = config.get("benchmark")
    if not isinstance(benchmark, dict) or benchmark.get("name") != "exported":
        return config_text
    path = context.node_config.get("data-path")
    if not path:
        raise ValueError(f"the run reads node-local data, but this SuperNode (partition-id {partition_id(context)}) "
                         "has no data-path in its node config")
    try:
        check_node_folder(Path(str(path)), str(benchmark.get("export")), partition_id(context))
    except ManytaskError as err:
        raise ValueError(str(err)) from None
    config["benchmark"] = {**benchmark, "node": str(path)}
    return yaml.safe_dump(config, sort_keys=False)


def _runner(config_text: str) -> ClientRunner:
    key = hashlib.sha256(config_text.encode()).hexdigest()
    if key not in _runners:
        _runners[key] = ClientRunner(Experiment.build(validate(yaml.safe_load(config_text))))
    return _runners[key]


def _runner_for(context: Context) -> ClientRunner:
    if CONFIG_RECORD not in context.state:
        raise RuntimeError("this node has not received the run's config (no handshake)")
    return _runner(str(context.state.config_records[CONFIG_RECORD]["yaml"]))


def _load_state(context: Context) -> ClientState:
    """The client's persistent state, stored as one serialized manytask message in context.state."""
    if STATE_RECORD not in context.state:
        return {}
    data = payload_bytes(context.state.array_records[STATE_RECORD])
    return {} if data is None else decode(data).tensors()


def _save_state(context: Context, state: ClientState) -> None:
    context.state[STATE_RECORD] = payload_record(encode(WireMessage.from_tensors(state)) if state else None)

