"""Whether an exception from a provider's SDK is its refusal of a request as too long.

For code that calls a provider's SDK itself, or through a framework (the adapters'
middleware), rather than through Normandy's clients, which raise
:class:`~normandy_core.clients.ContextOverflow` already.
"""

from __future__ import annotations

import importlib

from normandy_core.clients.base import ContextOverflow

__all__ = ["context_overflow"]

#: The SDKs whose errors are read, by top-level module, and the module that reads them.
_READERS = {"anthropic": "anthropic", "openai": "openai"}


def context_overflow(exc: BaseException) -> ContextOverflow | None:
    """``exc`` as a :class:`~normandy_core.clients.ContextOverflow` when it, or an
    exception it was raised from (``__cause__``, ``__context__``), is a provider SDK's
    refusal of a request as too long (read as Normandy's clients read it: the SDK's error
    type, status and code), else ``None``. The SDK is imported only when the exception
    comes from it."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ContextOverflow):
            return current
        found = _read(current)
        if found is not None:
            return found
        current = current.__cause__ or current.__context__
    return None


def _read(exc: BaseException) -> ContextOverflow | None:
    """``exc`` read by the reader of the SDK it comes from, if any."""
    for kind in type(exc).__mro__:
        provider = _READERS.get(kind.__module__.partition(".")[0])
        if provider is None or not isinstance(exc, Exception):
            continue
        sdk = importlib.import_module(provider)
        reader = importlib.import_module(f"normandy_core.clients.{provider}")
        found: ContextOverflow | None = getattr(reader, f"{provider}_overflow")(sdk, exc)
        return found
    return None
