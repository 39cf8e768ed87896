"""MaTU's experiments ("Many-Task Federated Fine-Tuning via Unified Task Vectors"): Tables 1-2, Figs. 2-6."""

from __future__ import annotations

from manytask.experiments.measures import accuracy, summary_key
from manytask.experiments.spec import Column, PaperExperiment, Scale, paper, register

paper("matu", "MaTU: many-task federated fine-tuning via unified task vectors",
      "MaTU's claim: one unified task vector per client, with per-task masks and rescalers and sign-based task "
      "similarity, beats FedAvg, FedProx, NTK-FedAvg, FedPer and MaT-FL on single-task and multi-task clients, "
      "at a fraction of their upload.")

SMOKE = ("rounds=2", "eval_every=2", "federation.num_clients=4")
ACCURACY = Column("accuracy %", accuracy)
BITS = Column("bits per task per round", summary_key("bits_per_task_per_round", 1e-6), fmt="{:.3f} M")

register(
    PaperExperiment(
        id="matu/table2-multi-task",
        title="Table 2: multi-task clients",
        shows="average test accuracy with multi-task clients (Dirichlet task allocation, ζ = 0.5), MaTU against "
              "one FedAvg model per task, MaT-FL and individual training.",
        columns=(ACCURACY, BITS),
        scales={"smoke": Scale("configs/matu/digits_multi_task.yaml", SMOKE),
                "cpu": Scale("configs/matu/digits_multi_task.yaml", seeds=(0, 1, 2, 3, 4))},
        paper_numbers={"matu": {"accuracy %": 79.47, "bits per task per round": 8.04},
                       "fedavg-per-task": {"accuracy %": 51.63, "bits per task per round": 20.43},
                       "matfl": {"accuracy %": 67.60}, "individual": {"accuracy %": 90.21},
                       "fedprox": {"accuracy %": 56.32}, "ntk-fedavg": {"accuracy %": 56.06},
                       "fedper": {"accuracy %": 48.37}},
        paper_note="The paper: ViT-B/32 with LoRA r = 16 on 8 vision datasets, N = 30 clients, R = 100 rounds of "
                   "E = 1 step, ξ = 0.2. Here: the offline `digits-tasks` stand-in (6 tasks), an MLP backbone "
                   "pretrained on held-out digits with LoRA r = 8, 10 clients, 20 rounds.",
    ),
)
