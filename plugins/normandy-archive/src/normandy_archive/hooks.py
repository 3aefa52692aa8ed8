"""The ``archive`` hook plugin (entry point in ``normandy_core.hooks``): archive what was dropped.

Loaded automatically once the distribution is installed; exclude it with
``NORMANDY_DISABLE_PLUGINS=archive``. Each compaction is written in one transaction to
:func:`~normandy_archive.archive_path`, or to the PostgreSQL database of
``NORMANDY_ARCHIVE_URL`` when it is set (:mod:`normandy_archive.select`). A failure to
write raises, so the boundary records it in ``meta["hook_errors"]`` and logs it: an
archive that could not be written is never silent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from normandy_archive import select
from normandy_core import hookimpl

if TYPE_CHECKING:
    from normandy_core import AgentConfig, CompactionContext

__all__ = ["after_compact"]


def _archive() -> select.AnyArchive:
    return select.current()


@hookimpl
def after_compact(acc: AgentConfig, ctx: CompactionContext, meta: dict[str, Any]) -> None:
    """Write every entry of ``meta["dropped"]`` to the archive, in one transaction."""
    dropped = meta.get("dropped")
    if not dropped:
        return
    strategy = meta.get("strategy")
    _archive().record(
        dropped,
        session_id=acc.session_id,
        compactor=acc.compactor,
        strategy=strategy if isinstance(strategy, str) else None,
        model=ctx.model,
        mid_round=ctx.mid_round,
        meta=meta,
    )
