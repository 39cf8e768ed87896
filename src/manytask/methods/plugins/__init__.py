"""Plug-ins: programs that wrap any host's client and server programs (the strategy-wrapping-a-strategy idiom)."""
