"""The ``noop`` compactor: the default-off principle. It changes nothing and spends nothing.

It ships with ``normandy-core`` and registers through the same entry-point group as every
other compactor (``noop = "normandy_core.contract.noop"`` in ``normandy_core.compactors``), so
``pip install normandy-core`` then ``AgentConfig()`` works.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from normandy_core.contract.hookspecs import hookimpl

if TYPE_CHECKING:
    from normandy_core.contract.config import AgentConfig
    from normandy_core.contract.types import CompactionContext

__all__ = ["maybe_compact", "needs_window", "validate_opts"]


@hookimpl
def needs_window(opts: Mapping[str, Any]) -> bool:
    """The noop compactor never sizes against a window."""
    return False


@hookimpl
def validate_opts(opts: Mapping[str, Any], entry: str) -> None:
    """Refuse any option: noop takes none."""
    if opts:
        from normandy_core.errors import OptionsError

        raise OptionsError(
            f"{entry}: compactor 'noop' takes no options, got: {', '.join(sorted(opts))}"
        )


@hookimpl
def maybe_compact(
    acc: AgentConfig, ctx: CompactionContext, opts: Mapping[str, Any]
) -> tuple[AgentConfig, dict[str, Any]]:
    """Return the same ``acc`` and ``{"compacted": False}`` (with ``declined`` on a forced
    boundary: noop compacts on request no more than otherwise)."""
    if ctx.force:
        return acc, {"compacted": False, "declined": "compactor 'noop' never compacts"}
    return acc, {"compacted": False}
