"""Names of the logged values that methods write and reports read, defined once for both sides.

Methods return these as `fit` scalars of a round (`ServerProgram.aggregate_fit`) or as evaluation metrics; the
report modules parse them back from `metrics.jsonl` and `summary.json`."""

from __future__ import annotations

# A server-evaluated method may add its clients' view of a task (the model a holder starts from) under the task's
# metric names with this prefix, averaged over the task's holders (MaTU's spec asks for both views).
CLIENT_VIEW_PREFIX = "client_"
TRAIN_LOSS_PREFIX = "train_loss/"  # sample-weighted mean training loss of a task over the round's replies
SIMILARITY_PREFIX = "similarity/"  # similarity/<task>/<task>: a task-similarity matrix entry (MaTU)
COMMUNITY_PREFIX = "community/"  # community/<client>: the community a client was put in this round
COMMUNITIES = "communities"  # the number of communities this round
GRAPH_PREFIX = "graph/"  # graph/<client>/<client>: a positive edge weight of the client graph (smaller id first)


def similarity_key(a: str, b: str) -> str:
    return f"{SIMILARITY_PREFIX}{a}/{b}"


def community_key(client: int) -> str:
    return f"{COMMUNITY_PREFIX}{client}"


def graph_key(a: int, b: int) -> str:
    return f"{GRAPH_PREFIX}{a}/{b}"


def train_loss_key(task: str) -> str:
    return f"{TRAIN_LOSS_PREFIX}{task}"
