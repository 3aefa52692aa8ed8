"""``NormandyMemory``: a LlamaIndex chat memory whose history is compacted by a named
Normandy compactor.

LlamaIndex's agents (``FunctionAgent``, ``ReActAgent``, ``AgentWorkflow``) read the chat
history from their memory before each step (``aget``) and write a run's messages back to
it when the run ends. ``NormandyMemory.from_compactor("window_manager", window=32_000)``
stores every message put in it (in a LlamaIndex chat store) and, on each ``get``/``aget``,
compacts the stored history with the named compactor: the compacted list is what the
agent receives and what the memory keeps, so the next read continues from it and each
dropped message reaches the ``after_compact`` hooks once. Kept messages are the stored
objects themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.memory.types import DEFAULT_CHAT_STORE_KEY, BaseChatStoreMemory
from llama_index.core.storage.chat_store import BaseChatStore, SimpleChatStore

from normandy_core.contract.eventloop import bind_turn_loop
from normandy_core.transcripts.adapter import AdapterSeam
from normandy_llamaindex.compaction import ChatCompactor, LlamaIndexCompaction

__all__ = ["MEMORY_ENTRY", "NormandyMemory"]

#: The entry point named in the option errors of :class:`NormandyMemory`.
MEMORY_ENTRY = "normandy_llamaindex.NormandyMemory.from_compactor()"


class _MemorySeam(AdapterSeam[LlamaIndexCompaction]):
    """The compactor a :class:`NormandyMemory` holds, and how it reports."""

    compactor_class = ChatCompactor
    entry = MEMORY_ENTRY
    compactor: ChatCompactor

    def process(self, messages: list[ChatMessage]) -> LlamaIndexCompaction:
        """``messages`` compacted once, checked and reported."""
        return self._reported(self._checked(self.compactor.run(messages)))


class NormandyMemory(BaseChatStoreMemory):
    """A LlamaIndex memory that hands the agent its history compacted by a named compactor.

    Build it with :meth:`from_compactor` (or :meth:`from_defaults`, LlamaIndex's usual
    constructor, which takes the window from ``llm``). ``put``/``aput``, ``set``,
    ``get_all`` and ``reset`` are those of LlamaIndex's chat-store memories;
    ``get``/``aget`` return the stored history compacted when it no longer fits, and
    store the compacted list in place of the history (dropped messages go to the
    ``after_compact`` hooks: the archive keeps them, recallable).
    """

    _seam: _MemorySeam = PrivateAttr()

    @classmethod
    def class_name(cls) -> str:
        """LlamaIndex's name for this component."""
        return "NormandyMemory"

    @classmethod
    def from_compactor(
        cls,
        compactor: str | None = None,
        opts: Mapping[str, Any] | None = None,
        *,
        window: int | None = None,
        model: str | None = None,
        timeout: float | None = None,
        client: Any = None,
        raise_on_error: bool = False,
        on_compact: Callable[[LlamaIndexCompaction], None] | None = None,
        chat_history: list[ChatMessage] | None = None,
        chat_store: BaseChatStore | None = None,
        chat_store_key: str = DEFAULT_CHAT_STORE_KEY,
    ) -> NormandyMemory:
        """A memory compacting with the compactor named ``compactor`` (``window_manager``
        when neither given nor configured) and its options ``opts``, both validated here:
        a bad name or option raises naming ``NormandyMemory.from_compactor()`` and the
        compactor. ``window`` pins the context window in tokens (or ``model`` names a
        model the catalog knows); ``timeout`` bounds the compactor's time; ``client`` is a
        Normandy model client for a compactor that asks a model. ``on_compact`` receives
        each :class:`~normandy_llamaindex.LlamaIndexCompaction`; a compactor error leaves
        the history unchanged (logged by the core), or raises with ``raise_on_error``.
        ``chat_history`` seeds the store (a ``SimpleChatStore`` unless ``chat_store``)."""
        memory = cls(chat_store=chat_store or SimpleChatStore(), chat_store_key=chat_store_key)
        memory._seam = _MemorySeam(
            compactor,
            opts,
            raise_on_error=raise_on_error,
            on_compact=on_compact,
            window=window,
            model=model,
            timeout=timeout,
            client=client,
        )
        if chat_history:
            memory.set(chat_history)
        return memory

    @classmethod
    def from_defaults(
        cls,
        chat_history: list[ChatMessage] | None = None,
        llm: Any = None,
        **kwargs: Any,
    ) -> NormandyMemory:
        """:meth:`from_compactor` with LlamaIndex's usual arguments: without ``window``
        or ``model``, the window is ``llm``'s context window (``llm.metadata``)."""
        if llm is not None and kwargs.get("window") is None and kwargs.get("model") is None:
            kwargs["window"] = llm.metadata.context_window
        return cls.from_compactor(chat_history=chat_history, **kwargs)

    @property
    def compactor(self) -> ChatCompactor:
        """The prepared compactor (its name, config and entry)."""
        return self._seam.compactor

    def get(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        """The history the agent receives: the stored messages, compacted when needed
        (then stored in their place). ``input`` and ``kwargs`` are LlamaIndex's and unused."""
        messages = self.chat_store.get_messages(self.chat_store_key)
        done = self._seam.process(messages)
        if not done.compacted:
            return messages
        self.chat_store.set_messages(self.chat_store_key, done.messages)
        return done.messages

    async def aget(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        """:meth:`get` in a worker thread bound to the running loop, so the loop keeps
        serving while the compactor counts, summarizes or archives."""
        with bind_turn_loop(asyncio.get_running_loop()):
            return await asyncio.to_thread(self.get, input, **kwargs)
