"""manytask: federated many-task learning."""

__version__ = "0.2.0"
