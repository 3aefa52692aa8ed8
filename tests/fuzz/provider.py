"""The provider at the edge of a fuzz case: an in-process stand-in for Anthropic's
on-demand compaction and OpenAI's ``/responses/compact``, as the native compactors call
them through a client's ``compact_conversation``.

It behaves as the providers document, or fails the ways they fail: it refuses, says the
model is unsupported, cannot be reached, returns something that is not a compaction, or
raises an unexpected error; the native compactors must then fall back (or report an
error when they have no fallback), never lose a message.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any

from normandy_core import Entry
from normandy_core.clients.base import (
    ModelReply,
    ProviderCompaction,
    ProviderCompactionError,
    Usage,
)
from normandy_core.clients.openai import responses_input
from normandy_core.conversation.entries import TextBlock

__all__ = ["BEHAVIOURS", "NATIVE", "FuzzProvider"]

#: The native compactors, with the provider and the wire format each one compacts.
NATIVE = {"anthropic_native": ("anthropic", "anthropic"), "openai_native": ("openai", "responses")}
#: What the provider does when asked, with its weight.
BEHAVIOURS = {
    "ok": 60,
    "refused": 8,
    "unsupported": 8,
    "unreachable": 8,
    "garbage": 8,
    "raises": 8,
}


class FuzzProvider:
    """A client whose only model call is the provider's compaction (see the module)."""

    api = "responses"  # what openai_native asks of an OpenAI client

    def __init__(self, provider: str, behaviour: str) -> None:
        self.provider = provider
        self.behaviour = behaviour
        self.calls: list[list[Entry]] = []

    @classmethod
    def draw(cls, rng: random.Random, provider: str) -> FuzzProvider:
        """A provider whose behaviour is drawn from :data:`BEHAVIOURS`."""
        behaviour = rng.choices(list(BEHAVIOURS), weights=list(BEHAVIOURS.values()))[0]
        return cls(provider, behaviour)

    def complete(self, system: str, messages: Sequence[Entry] | str, **kwargs: Any) -> ModelReply:
        """A model call: the fallback's ``summarize`` asks the model for a summary (the
        provider answers it whatever its compaction does; an unreachable provider's
        fallback is run without the client)."""
        text = messages if isinstance(messages, str) else "\n".join(e.text() for e in messages)
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        return ModelReply(content=(TextBlock(text=f"The model's summary ({digest})."),))

    def compact_conversation(
        self, system: str, messages: Sequence[Entry], **kwargs: Any
    ) -> ProviderCompaction | str:
        """The provider's compaction of ``messages`` (or its failure)."""
        self.calls.append(list(messages))
        b = self.behaviour
        if b in ("refused", "unsupported", "unreachable"):
            raise ProviderCompactionError(f"{self.provider}: fuzz provider {b}", b)  # type: ignore[arg-type]
        if b == "garbage":
            return "not a compaction"
        if b == "raises":
            raise RuntimeError("fuzz provider: connection reset by peer")
        digest = hashlib.sha256(
            "\x1e".join(f"{e.role}:{e.text()}" for e in messages).encode()
        ).hexdigest()[:16]
        size = sum(len(e.text()) for e in messages)
        usage = Usage(input_tokens=size // 4 + 1, output_tokens=60)
        if self.provider == "anthropic":
            summary = f"Summary of {len(messages)} messages ({digest})."
            return ProviderCompaction(
                "anthropic", {"type": "compaction", "content": summary}, (), usage
            )
        users = tuple(
            item
            for item in responses_input([e for e in messages if e.role == "user"])
            if item.get("role") == "user"
        )
        item = {"type": "compaction", "id": f"cmp_{digest}", "encrypted_content": f"gAAAA{digest}"}
        return ProviderCompaction("openai", item, users, usage)
