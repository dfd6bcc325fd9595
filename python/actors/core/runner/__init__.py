"""The model runner: flattens a StepPlan, runs the model over the paged KV cache, samples."""

from actors.core.runner.model_runner import ModelRunner, kv_bytes_per_block

__all__ = ["ModelRunner", "kv_bytes_per_block"]
