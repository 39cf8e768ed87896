"""Pieces every family of methods shares: wire names, aggregation math, the update convention, phases, and the
state of personalized methods."""
