"""FedDEA's public entry point (federated decoupled aggregation): the `dea` function and the `dea` plug-in that
applies it over any host optimizer, re-exported from where they live (`methods.plugins.dea`), so
`from manytask.methods.feddea import dea` stays valid whatever the layout. Importing it registers the plug-in."""

from manytask.methods.plugins.dea import DeaClient, DeaParams, DeaServer, dea

__all__ = ["DeaClient", "DeaParams", "DeaServer", "dea"]
