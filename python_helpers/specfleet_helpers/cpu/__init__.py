"""The CPU profile's stand-ins for what only an NPU host has.

Tiny models, the hidden-states KV connector, the train entry (speculators.train over gloo).
"""
