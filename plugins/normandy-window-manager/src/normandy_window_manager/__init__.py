"""The ``window_manager`` compactor: sizes the conversation against the model's window.

Select it by name: ``AgentConfig(model=..., compactor="window_manager", compactor_opts={...})``.
Its options are :class:`~normandy_window_manager.options.WindowManagerOptions`.
"""

from __future__ import annotations

from normandy_window_manager.options import WindowManagerOptions

__all__ = ["WindowManagerOptions"]
