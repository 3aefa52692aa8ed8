"""The turn loop: a pure state-machine core (:mod:`.core`), the one effect driver that runs
it (:mod:`.driver`), and the sync and async shells that answer its I/O (:mod:`.shell`).

:func:`run_turn` and :func:`arun_turn` run one agent turn with a model client and a
tool registry, resolving every boundary through :func:`normandy_core.run_compaction`.
It may import every other subpackage but :mod:`normandy_core.app` and
:mod:`normandy_core.testing`. Inside, the order is: core, tools; result; driver; shell.
Each public name is stated once, in the ``__all__`` of the module that defines it.
"""

from __future__ import annotations

from normandy_core.turn import core, result, shell, tools
from normandy_core.turn.core import *  # noqa: F403
from normandy_core.turn.result import *  # noqa: F403
from normandy_core.turn.shell import *  # noqa: F403
from normandy_core.turn.tools import *  # noqa: F403

__all__: list[str] = []
__all__ += core.__all__
__all__ += result.__all__
__all__ += shell.__all__
__all__ += tools.__all__
