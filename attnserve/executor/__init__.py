"""Executors: who runs the ModelRunner(s) for the engine: in process, spawned processes, or Ray actors."""
