"""Personalized methods: every client ends with a model of its own (FedPer, pFedMe, FedU)."""
