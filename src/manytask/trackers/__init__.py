"""Experiment trackers (`loggers: [tensorboard, mlflow]`): every round's metrics by step, the resolved config, the
summary, and the report with its plots, through the round observer. A resumed run continues the same tracker runs."""

from manytask.trackers.session import LOGGERS, tracking

__all__ = ["LOGGERS", "tracking"]
