"""The ``pipeline`` compactor: run other compactors by name, in order, until the conversation fits.

Select it by name::

    AgentConfig(model=..., compactor="pipeline", compactor_opts={"steps": [
        {"compactor": "clear_tool_results", "opts": {"trigger_tokens": 80_000}},
        {"compactor": "window_manager", "opts": {"trigger": 0.9}},
    ]})

Its options are :class:`~normandy_pipeline.options.PipelineOptions`.
"""

from __future__ import annotations

from normandy_pipeline.options import PipelineOptions, Step

__all__ = ["NAME", "PipelineOptions", "Step"]

#: The name this compactor is registered under.
NAME = "pipeline"
