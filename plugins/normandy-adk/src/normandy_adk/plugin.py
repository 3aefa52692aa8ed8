"""``NormandyPlugin``: a Google ADK plugin that compacts every model request's contents.

Installed with one line, ``Runner(..., plugins=[NormandyPlugin("window_manager",
window=32_000)])`` (or ``App(plugins=[...])``), its ``before_model_callback`` runs before
every model call of every agent of the runner: the request's ``contents`` are compacted
by the named compactor, continuing the last compaction of the same session and agent,
and the request carries the compacted list. The session's events are never changed
(ADK builds each request from them anew); kept contents are the request's own objects;
dropped ones reach the ``after_compact`` hooks, once each.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Mapping
from typing import Any

from google.adk.agents.callback_context import CallbackContext
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.genai import types
from typing_extensions import Unpack

from normandy_adk.compaction import ADKCompaction, ContentsCompactor, Prompt
from normandy_core.contract.eventloop import bind_turn_loop
from normandy_core.transcripts.adapter import AdapterSeam, SeamOptions
from normandy_core.transcripts.formats import TranscriptError

__all__ = ["PLUGIN_ENTRY", "PLUGIN_NAME", "NormandyPlugin"]

logger = logging.getLogger("normandy_adk")

#: The entry point named in the option errors of :class:`NormandyPlugin`.
PLUGIN_ENTRY = "normandy_adk.NormandyPlugin()"
#: The plugin's default name in the runner's plugin manager.
PLUGIN_NAME = "normandy"


class _Plugin(BasePlugin):
    """``BasePlugin`` built without arguments, as :class:`AdapterSeam` builds its base;
    :class:`NormandyPlugin` names it afterwards."""

    def __init__(self) -> None:
        super().__init__(name=PLUGIN_NAME)


def session_key(context: CallbackContext) -> Hashable:
    """Which conversation a request belongs to: the session (app, user, id) and the agent
    (each agent of a session is shown the events its own way)."""
    session = context.session
    return (session.app_name, session.user_id, session.id, context.agent_name)


class NormandyPlugin(AdapterSeam[ADKCompaction], _Plugin):
    """Compact each model request's contents with a named compactor.

    ``compactor`` is the entry-point name (``window_manager`` when neither given nor
    configured), ``opts`` its options: both validated here, when the plugin is built, so
    a bad option raises :class:`~normandy_core.OptionsError` naming
    ``normandy_adk.NormandyPlugin()`` and the compactor. ``window`` pins the context window
    in tokens (or ``model`` names a model the catalog knows); ``timeout`` bounds the
    compactor's time; ``name`` is the plugin's name in the runner. The request's system
    instruction and tool declarations are counted beside its contents.

    ``on_compact`` is called with the :class:`~normandy_adk.ADKCompaction` of each
    compaction, which is also logged (logger ``normandy_adk``, INFO). A compactor error
    (the contents cannot fit) or contents whose tool pairs do not hold leave the request
    unchanged, logged as a warning; with ``raise_on_error=True`` they raise
    (:class:`~normandy_core.CannotFitError`, :class:`~normandy_core.TranscriptError`).
    The compactor runs in a worker thread bound to the running loop, so the event loop
    keeps serving while it counts, summarizes or archives.
    """

    compactor_class = ContentsCompactor
    entry = PLUGIN_ENTRY
    compactor: ContentsCompactor

    def __init__(
        self,
        compactor: str | None = None,
        opts: Mapping[str, Any] | None = None,
        *,
        name: str = PLUGIN_NAME,
        **options: Unpack[SeamOptions],
    ) -> None:
        super().__init__(compactor, opts, **options)
        self.name = name

    def _run(self, contents: list[types.Content], key: Hashable, prompt: Prompt) -> ADKCompaction:
        return self._checked(self.compactor.run(contents, session=key, prompt=prompt))

    async def before_model_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest
    ) -> LlmResponse | None:
        """Put the compacted contents in ``llm_request``; the model is always called."""
        contents = list(llm_request.contents)
        key = session_key(callback_context)
        prompt = Prompt.of(llm_request.config)
        try:
            with bind_turn_loop(asyncio.get_running_loop()):
                done = await asyncio.to_thread(self._run, contents, key, prompt)
        except TranscriptError as exc:
            if self.raise_on_error:
                raise
            logger.warning("%s left the request unchanged: %s", self.entry, exc)
            return None
        self._reported(done)
        # by identity: kept contents are the request's own objects (no deep comparison)
        if len(done.contents) != len(contents) or any(
            a is not b for a, b in zip(done.contents, contents, strict=True)
        ):
            llm_request.contents = done.contents
        return None
