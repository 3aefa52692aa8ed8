"""The ``noop`` compactor: the default-off principle. It changes nothing and spends nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from normandy_core import hookimpl

if TYPE_CHECKING:
    from normandy_core import AgentConfig, CompactionContext

__all__ = ["maybe_compact", "needs_window", "validate_opts"]


@hookimpl
def needs_window(opts: dict[str, Any]) -> bool:
    """The noop compactor never sizes against a window."""
    return False


@hookimpl
def validate_opts(opts: dict[str, Any], entry: str) -> None:
    """Refuse any option: noop takes none."""
    if opts:
        from normandy_core import OptionsError

        raise OptionsError(
            f"{entry}: compactor 'noop' takes no options, got: {', '.join(sorted(opts))}"
        )


@hookimpl
def maybe_compact(
    acc: AgentConfig, ctx: CompactionContext, opts: dict[str, Any]
) -> tuple[AgentConfig, dict[str, Any]]:
    """Return the same ``acc`` and ``{"compacted": False}``."""
    return acc, {"compacted": False}
