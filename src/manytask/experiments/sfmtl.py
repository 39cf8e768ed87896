"""SFMTL-Graph's experiments ("Learning to Collaborate Over Graphs: A Selective Federated Multi-Task Learning
Approach"): Fig. 2 (accuracy and loss; cumulative bits), the local FLOPs of Section V-C, Table I (communities),
Fig. 4 (the anchors' t-SNE) and Table II (fairness); and the page's own analyses on the offline stand-ins of
the 8x8 digits and MNIST-1D (`analysis-*`: fairness, bits and communities of every method on one config).

The extracted text of the paper lost every number, so no experiment has the paper's figures beside ours. The CPU
stand-ins are the two Fashion-MNIST settings cut to the CPU that the results page reports: the label sets
(`fashion_mnist_label_skew_cpu.yaml`, for heterogeneous CIFAR-10) and the tuned rotated & masked setting
(`fashion_mnist_rotated_masked_tuned_cpu.yaml`, for rotated & masked MNIST). The experiments of one config share
its runs (`sfmtl_extras.shared_members`)."""

from __future__ import annotations

from collections.abc import Mapping

from manytask.experiments.measures import accuracy, fairness, summary_key, upload_per_round
from manytask.experiments.sfmtl_extras import gflops_ratio, local_gflops, tsne_value
from manytask.experiments.spec import TWO_ROUNDS, Column, Measure, PaperExperiment, Scale, Value, paper, register
from manytask.metric_names import COMMUNITIES
from manytask.report.graph import community_ari, community_summary
from manytask.report.runs import RunRecord, total_bytes

paper("sfmtl", "SFMTL-Graph: Learning to Collaborate Over Graphs",
      "SFMTL-Graph's claim: personal backbones that share only a head and per-class feature anchors, inside Louvain "
      "communities of a learned client graph, beat FedU, pFedMe and FedAvg on heterogeneous CIFAR-10 and rotated & "
      "masked MNIST, with the fewest bits, the same local computation as FedU and FedAvg, communities that follow "
      "the clients' label sets, and the fairest accuracy across clients.")

METHOD = "sfmtl-graph"
LABEL_SET = "configs/sfmtl/fashion_mnist_label_skew_cpu.yaml"
ROTATED = "configs/sfmtl/fashion_mnist_rotated_masked_tuned_cpu.yaml"
CIFAR10 = "configs/sfmtl/cifar10_label_skew.yaml"
MNIST = "configs/sfmtl/mnist_rotated_masked.yaml"
CIFAR10_FILES = ("data/cifar-10-batches-py",)
MNIST_FILES = ("data/mnist",)
FIVE_RUNS = (0, 1, 2, 3, 4)
GRAPH_MEMBERS = (METHOD, "sfmtl-random-graph")
# the same members on a few clients of the 8x8 digits (Fashion-MNIST takes over a second to load, per member), for
# 2 rounds (the FLOPs: 1): every member of an experiment in about 12 s
LABEL_SET_TINY = ("benchmark.source=digits", "benchmark.num_clients=6", "federation.num_clients=6")
ROTATED_TINY = ("benchmark.source=digits", "benchmark.num_clients=8", "federation.num_clients=8",
                "benchmark.clusters=2", "benchmark.max_train=400", "benchmark.max_test=200")
LABEL_SET_SMOKE = (*LABEL_SET_TINY, *TWO_ROUNDS)
ROTATED_SMOKE = (*ROTATED_TINY, *TWO_ROUNDS)
NUMBERS_LOST = ("The paper's extracted text lost every number of this {what}, so none stands beside ours.")


def mean_test_loss(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
    """The final test loss averaged over the clients' tasks (the loss curves of Fig. 2 at their last round)."""
    total, tasks = record.summary.get("total_test_loss"), record.summary.get("tasks") or {}
    return None if total is None or not tasks else float(total) / len(tasks)


def cumulative_mbit(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
    """Bits sent up and down over the whole run, in Mbit (Fig. 2(c, f) at their last round)."""
    sent = total_bytes(record)
    return None if sent is None else 8 * sent / 1e6


def mbit_per_round(record: RunRecord, runs: Mapping[str, RunRecord]) -> Value:
    rounds, total = record.summary.get("rounds"), cumulative_mbit(record, runs)
    return None if not rounds or total is None else float(total) / int(rounds)


def run_in_rounds_of(base: str) -> Measure:
    """Member `base`'s bits over its whole run divided by this member's bits in one round: below 1 where `base`
    sends less in all its rounds than this member does in one (the paper's claim for SFMTL-Graph); None for
    `base`, for members of `base`'s kind (the same bits per round) and for members that send nothing."""

    def measure(record: RunRecord, runs: Mapping[str, RunRecord]) -> Value:
        if base not in runs or record.summary.get("method") == runs[base].summary.get("method"):
            return None
        whole, one = cumulative_mbit(runs[base], runs), mbit_per_round(record, runs)
        return None if whole is None or not one else float(whole) / float(one)

    return measure


def last_communities(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
    found = community_summary(record)
    return None if found is None else float(found.communities)


def mean_communities(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
    counts = [row["fit"][COMMUNITIES] for row in record.metrics if COMMUNITIES in (row.get("fit") or {})]
    return sum(counts) / len(counts) if counts else None


def final_ari(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
    return community_ari(record)


def mean_ari(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
    found = community_summary(record)
    return None if found is None else found.mean_ari


def true_modularity(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
    """The true groups' modularity on the method's own graph, averaged over rounds: about 0 or below where the
    graph does not carry the groups, whatever finds the communities."""
    found = community_summary(record)
    return None if found is None else found.true_modularity


ACCURACY = Column("accuracy %", accuracy)
LOSS = Column("mean test loss", mean_test_loss, fmt="{:.3f}", lower_is_better=True)
CURVES = (ACCURACY, LOSS)
COMMUNICATION = (ACCURACY, Column("cumulative Mbit", cumulative_mbit, fmt="{:.3g}", lower_is_better=True),
                 Column("Mbit per round", mbit_per_round, fmt="{:.3g}", lower_is_better=True),
                 Column("sfmtl-graph's whole run in rounds of this", run_in_rounds_of(METHOD), fmt="{:.3g}"))
FAIRNESS = (Column("mean %", fairness("mean")), Column("worst 10 %", fairness("worst_10")),
            Column("worst 20 %", fairness("worst_20")),
            Column("std (points)", fairness("std"), lower_is_better=True))
LAST_COMMUNITIES = Column("communities at the last round", last_communities, fmt="{:.0f}")
FINAL_ARI = Column("ARI at the last round", final_ari, fmt="{:.2f}")
MEAN_ARI = Column("ARI, mean over rounds", mean_ari, fmt="{:.2f}")
# the offline analyses: fairness, what a round sends up, and the communities against the true clusters
STAND_IN = (*FAIRNESS, Column("Mbit up per round", upload_per_round(8e-6), fmt="{:.3g}", lower_is_better=True),
            Column("kbit per task per round", summary_key("bits_per_task_per_round", 1e-3), fmt="{:.3g}",
                   lower_is_better=True),
            LAST_COMMUNITIES, FINAL_ARI, MEAN_ARI)
FLOPS = (Column("local GFLOPs per client per round", local_gflops, fmt="{:.3g}", lower_is_better=True),
         Column("× FedAvg's", gflops_ratio("fedavg"), fmt="{:.2f}", lower_is_better=True))


def curves(dataset: str, scales: Mapping[str, Scale], note: str) -> PaperExperiment:
    panels = "(a, b)" if dataset == "cifar10" else "(d, e)"
    name = "heterogeneous CIFAR-10" if dataset == "cifar10" else "rotated & masked MNIST"
    return PaperExperiment(
        id=f"sfmtl/fig2-{'cifar10' if dataset == 'cifar10' else 'rotated-masked'}",
        title=f"Fig. 2{panels}: accuracy and loss on {name}",
        shows=f"the mean over clients of their own test accuracy and loss at the last round on {name}'s stand-in: "
              "SFMTL-Graph against FedU, pFedMe, FedAvg's one global model, Local and its random-graph control.",
        columns=CURVES, scales=scales, paper_note=note + " " + NUMBERS_LOST.format(what="figure"),
        runner="sfmtl-shared")


def flops(dataset: str, config: str, paper_config: str, needs: tuple[str, ...], tiny: tuple[str, ...],
          note: str) -> PaperExperiment:
    name = "heterogeneous CIFAR-10" if dataset == "cifar10" else "rotated & masked MNIST"
    return PaperExperiment(
        id=f"sfmtl/sec5c-flops-{dataset}",
        title=f"Section V-C: local computation per round ({name})",
        shows="the FLOPs one client computes in a round (matrix products and convolutions, forward and backward, "
              "counted by torch's FlopCounterMode over the first round): SFMTL-Graph as FedU and FedAvg, pFedMe "
              "several times more with its inner steps.",
        columns=FLOPS,
        scales={"smoke": Scale(config, (*tiny, "rounds=1")),
                "cpu": Scale(config, ("rounds=1",)),
                "paper": Scale(paper_config, ("rounds=1",), needs=needs)},
        paper_note=note + " One round of each member is run (a round's FLOPs do not depend on how many follow). "
                   + NUMBERS_LOST.format(what="comparison"),
        runner="sfmtl-flops")


LABEL_SET_NOTE = ("The paper: heterogeneous CIFAR-10, 30 clients with 2 classes each, a 3-conv CNN, 200 rounds of "
                  "E = 5, participation 0.5, 5 runs. Here: Fashion-MNIST with the same split, CNN and SGD, about "
                  "200 images per client, E = 1, 20 rounds, 3 seeds, every method untuned at lr 0.1.")
ROTATED_NOTE = ("The paper: rotated & masked MNIST, 40 clients in 4 rotation clusters with per-client masks, a "
                "2-conv CNN, 200 rounds, 5 runs. Here: Fashion-MNIST with the same clusters and masks, 200 images "
                "per client, E = 1, 20 rounds, 5 seeds, every method at the values `manytask tune` chose.")

DIGITS_ROTATED = "configs/sfmtl/rotated_masked_digits.yaml"
DIGITS_LABELS = "configs/sfmtl/label_skew_digits.yaml"
MNIST1D_LABELS = "configs/sfmtl/label_skew_mnist1d.yaml"
# the shipped members and pFedMe at its paper's λ = 15 with the run's lr 0.05 (the shipped λ 1, lr 0.5 is the best
# of a 3-point sweep on this benchmark)
WITH_PFEDME_DEFAULTS = ("method=[sfmtl-graph, fedu, {name: pfedme, lam: 1, train: {lr: 0.5}}, "
                        "{name: pfedme, label: pfedme-paper-defaults}, {name: fedavg, shared_head: true}, local]")
STAND_IN_NOTE = ("Ours, not the paper's: an offline stand-in on {data} (seed{s} {seeds}); the true groups are "
                 "{groups}. Fairness is over the clients' own test accuracy at the last round; bits up are summed "
                 "over the round's participants; the communities (SFMTL-Graph only) are Louvain's on its graph, "
                 "their ARI against the true groups.")


def stand_in(name: str, title: str, shows: str, config: str, tiny: tuple[str, ...], seeds: tuple[int, ...],
             overrides: tuple[str, ...], data: str, groups: str) -> PaperExperiment:
    return PaperExperiment(
        id=f"sfmtl/analysis-{name}", title=f"Analysis: {title}", shows=shows, columns=STAND_IN,
        scales={"smoke": Scale(config, (*overrides, *tiny, *TWO_ROUNDS)),
                "cpu": Scale(config, overrides, seeds=seeds)},
        paper_note=STAND_IN_NOTE.format(data=data, s="s" if len(seeds) > 1 else "",
                                        seeds=", ".join(map(str, seeds)), groups=groups))


STAND_INS = (
    stand_in("rotated-masked-digits", "rotated & masked 8×8 digits",
             "the clients' accuracy and its spread, the bits each method sends and SFMTL-Graph's communities on 40 "
             "clients in 4 rotation clusters with per-client masks, pFedMe as shipped and at its paper's defaults.",
             DIGITS_ROTATED, ("benchmark.num_clients=8", "federation.num_clients=8", "benchmark.clusters=2"),
             (0,), (WITH_PFEDME_DEFAULTS,), "the 8×8 digits, 40 clients, participation 0.5, 30 rounds",
             "the 4 rotation clusters"),
    stand_in("label-skew-digits", "label-skewed 8×8 digits",
             "the clients' accuracy and its spread, the bits each method sends and SFMTL-Graph's communities on 30 "
             "clients with 2 classes each.",
             DIGITS_LABELS, ("benchmark.num_clients=6", "federation.num_clients=6"), (0, 1, 2), (),
             "the 8×8 digits, 30 clients, participation 0.5, 40 rounds", "the clients' 5 class pairs"),
    stand_in("label-skew-mnist1d", "label-skewed MNIST-1D",
             "the clients' accuracy and its spread, the bits each method sends and SFMTL-Graph's communities on 30 "
             "clients with 2 classes each.",
             MNIST1D_LABELS, ("benchmark.num_samples=1000", "benchmark.num_clients=6", "federation.num_clients=6"),
             (0,), (), "MNIST-1D, 30 clients, participation 0.5, 40 rounds", "the clients' 5 class pairs"),
)

register(
    curves("cifar10", {"smoke": Scale(LABEL_SET, LABEL_SET_SMOKE),
                       "cpu": Scale(LABEL_SET, seeds=(0, 1, 2)),
                       "paper": Scale(CIFAR10, seeds=FIVE_RUNS, needs=CIFAR10_FILES)}, LABEL_SET_NOTE),
    curves("rotated-masked", {"smoke": Scale(ROTATED, ROTATED_SMOKE),
                              "cpu": Scale(ROTATED, seeds=FIVE_RUNS),
                              "paper": Scale(MNIST, seeds=FIVE_RUNS, needs=MNIST_FILES)}, ROTATED_NOTE),
    PaperExperiment(
        id="sfmtl/fig2c-communication",
        title="Fig. 2(c, f): cumulative bits against accuracy",
        shows="the bits each method sends over the run (up and down, anchors and heads against whole models) next "
              "to its accuracy, and SFMTL-Graph's whole run measured in rounds of each other method.",
        columns=COMMUNICATION,
        scales={"smoke": Scale(LABEL_SET, LABEL_SET_SMOKE),
                "cpu": Scale(LABEL_SET, seeds=(0, 1, 2)),
                "paper": Scale(CIFAR10, seeds=FIVE_RUNS, needs=CIFAR10_FILES)},
        paper_note=LABEL_SET_NOTE + " Fig. 2(f), on rotated & masked MNIST, sends the same anchors and heads. "
                   + NUMBERS_LOST.format(what="figure"),
        runner="sfmtl-shared"),
    flops("cifar10", LABEL_SET, CIFAR10, CIFAR10_FILES, LABEL_SET_TINY, LABEL_SET_NOTE),
    flops("rotated-masked", ROTATED, MNIST, MNIST_FILES, ROTATED_TINY, ROTATED_NOTE),
    PaperExperiment(
        id="sfmtl/table1-communities",
        title="Table I: communities of the task-similarity graph",
        shows="how many communities Louvain finds and how well they match the clients' label sets (adjusted Rand "
              "index, at the last round and over rounds), with the random-graph control beside the method.",
        columns=(LAST_COMMUNITIES, Column("communities, mean over rounds", mean_communities), FINAL_ARI, MEAN_ARI,
                 Column("true groups' modularity on its graph", true_modularity, fmt="{:.3f}")),
        scales={"smoke": Scale(LABEL_SET, LABEL_SET_SMOKE, members=GRAPH_MEMBERS),
                "cpu": Scale(LABEL_SET, seeds=(0, 1, 2), members=GRAPH_MEMBERS),
                "paper": Scale(CIFAR10, seeds=FIVE_RUNS, needs=CIFAR10_FILES, members=GRAPH_MEMBERS)},
        paper_note=LABEL_SET_NOTE + " The true groups are the 5 class pairs (6 clients each). "
                   + NUMBERS_LOST.format(what="table"),
        runner="sfmtl-shared"),
    PaperExperiment(
        id="sfmtl/fig4-anchors-tsne",
        title="Fig. 4: the clients' feature anchors (t-SNE)",
        shows="whether clients with the same label set hold nearby anchors: the t-SNE of every client's final "
              "anchors of its classes (drawn into each run's anchors_tsne.png), the share of points whose nearest "
              "neighbour there is of the same group, and the anchors' cosine within and across groups.",
        columns=(Column("t-SNE nearest neighbour in its group %", tsne_value("same_group_neighbour", 100)),
                 Column("anchor cosine, same class, same group", tsne_value("cosine_same_group"), fmt="{:.2f}"),
                 Column("anchor cosine, same class, other groups", tsne_value("cosine_other_groups"),
                        fmt="{:.2f}")),
        scales={"smoke": Scale(LABEL_SET, LABEL_SET_SMOKE, members=GRAPH_MEMBERS),
                "cpu": Scale(LABEL_SET, seeds=(0, 1, 2), members=GRAPH_MEMBERS),
                "paper": Scale(CIFAR10, seeds=FIVE_RUNS, needs=CIFAR10_FILES, members=GRAPH_MEMBERS)},
        paper_note=LABEL_SET_NOTE + " The anchors are those each client kept after its last round (the run's "
                   "final checkpoint). " + NUMBERS_LOST.format(what="figure"),
        runner="sfmtl-anchors"),
    PaperExperiment(
        id="sfmtl/table2-fairness",
        title="Table II: fairness across clients",
        shows="the mean, the mean of the worst 10 % and 20 % of clients and the standard deviation of the clients' "
              "own test accuracy at the last round.",
        columns=FAIRNESS,
        scales={"smoke": Scale(LABEL_SET, LABEL_SET_SMOKE),
                "cpu": Scale(LABEL_SET, seeds=(0, 1, 2)),
                "paper": Scale(CIFAR10, seeds=FIVE_RUNS, needs=CIFAR10_FILES)},
        paper_note=LABEL_SET_NOTE + " " + NUMBERS_LOST.format(what="table"),
        runner="sfmtl-shared"),
    *STAND_INS,
)
