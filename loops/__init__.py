"""The control plane: patterns, durable runs, their state machine, the worker and the reaper."""
