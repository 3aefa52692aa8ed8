"""Entry metadata keys and text tags that the core and the compactors share.

A compactor marks what it inserts or changes with a metadata key, so every other part of
the framework can recognise it: survival rules never take a marker for the task, recall
never returns a summary, the cost model measures growth on untouched entries only. Wire
formats carry no metadata, so each mark also has a text form a reader recognises: the
``[normandy:…]`` tags opening inserted messages, and :data:`CLEARED_TAG` opening the
placeholder of a cleared tool result.
"""

from __future__ import annotations

from normandy_core.conversation.entries import Entry, ToolResultBlock

__all__ = [
    "CLEARED_KEY",
    "CLEARED_TAG",
    "COMPACTED_KEYS",
    "INSERTED_KEYS",
    "MARKER_KEY",
    "OFFLOADED_KEY",
    "OFFLOADED_TAG",
    "PROVIDER_COMPACTION_KEY",
    "PROVIDER_REBUILT_KEY",
    "SHORTENED_MARK",
    "SUMMARY_KEY",
    "cleared_ids",
    "is_compacted",
    "offloaded_ids",
]

#: A note a compactor inserted where it cut the history (text tag ``[normandy:marker]``).
MARKER_KEY = "normandy.compaction_marker"
#: A summary a compactor inserted in place of what it dropped (tag ``[normandy:summary]``).
SUMMARY_KEY = "normandy.summary"
#: The tool-use ids whose results (or inputs) a compactor cleared in this entry: a list.
CLEARED_KEY = "normandy.cleared_tool_uses"
#: The opening of every placeholder the bundled compactors put in a cleared tool result
#: (``clear_tool_results``' defaults and ``window_manager``'s): a result whose text opens
#: with it is recognised as cleared in any format, its metadata lost or not.
CLEARED_TAG = "[tool result cleared"
#: The tool-use ids whose results were offloaded at arrival in this entry (a list): the
#: original archived, a preview in its place (``clear_tool_results``' ``offload_tokens``).
OFFLOADED_KEY = "normandy.offloaded_tool_uses"
#: The opening of an offloaded result's preview, recognised in any format (as
#: :data:`CLEARED_TAG`): such a result is never offloaded again.
OFFLOADED_TAG = "[tool result offloaded"
#: Words of every note ``window_manager`` leaves inside a tool result it shortened to fit
#: the window (its text cut around the note, or an image or document removed): such a
#: result is recognised in any format, and is never offloaded (a compaction changed it).
SHORTENED_MARK = "by normandy window_manager to fit the"
#: The entry holding a provider's compaction (a summary the provider made).
PROVIDER_COMPACTION_KEY = "normandy.provider_compaction"
#: A user message a provider's compaction returned and a compactor put back in the
#: history as a new entry (OpenAI's ``/responses/compact``): a copy, never the task.
PROVIDER_REBUILT_KEY = "normandy.provider_rebuilt"

#: Keys of the entries a compactor inserts (a marker, a summary, a provider's copy).
INSERTED_KEYS = (MARKER_KEY, SUMMARY_KEY, PROVIDER_REBUILT_KEY)
#: Keys of the entries a compaction made or changed.
COMPACTED_KEYS = (*INSERTED_KEYS, CLEARED_KEY, OFFLOADED_KEY, PROVIDER_COMPACTION_KEY)


def cleared_ids(entry: Entry) -> list[str]:
    """The tool-use ids :data:`CLEARED_KEY` lists on ``entry`` (none when absent)."""
    value = entry.metadata.get(CLEARED_KEY)
    return [str(v) for v in value] if isinstance(value, list) else []


def offloaded_ids(entry: Entry) -> list[str]:
    """The tool-use ids :data:`OFFLOADED_KEY` lists on ``entry`` (none when absent)."""
    value = entry.metadata.get(OFFLOADED_KEY)
    return [str(v) for v in value] if isinstance(value, list) else []


def is_compacted(entry: Entry) -> bool:
    """Whether a compaction made or changed ``entry``: a key of :data:`COMPACTED_KEYS` in
    its metadata, or a tool result opening with :data:`CLEARED_TAG` (metadata lost in a
    wire format)."""
    meta = entry.metadata
    if meta and any(key in meta for key in COMPACTED_KEYS):
        return True
    content = entry.content
    if isinstance(content, str):
        return False
    return any(isinstance(b, ToolResultBlock) and b.text().startswith(CLEARED_TAG) for b in content)
