"""Google ADK's arms of section 12 (issue 37): normandy-adk against ADK's own managers.

The section's session (OpenAI Chat Completions dicts) is converted once into
``google.genai`` ``Content`` objects, as ADK puts them in a request: a ``user`` content
per question (the system prompt folded into the first, as its first text part: ADK keeps
the system instruction in the request's config, and §12 counts it with the history), a
``model`` content per assistant message (text, then ``function_call`` parts), one
``user`` content holding a tool batch's ``function_response`` parts.

ADK builds every request anew from the session's events, handing over fresh copies of
the contents, so each subject is given the whole history each call:

* **normandy-adk** (``ContentsCompactor``, as ``NormandyPlugin`` runs it, one session):
  given fresh shallow copies of the history each call, as ADK hands them (the copy,
  about what ADK's request assembly costs, is inside the timer), continuing its last
  compaction. ``window_manager``, exact cl100k counter, no reserve.
* **ADK's** ``ContextFilterPlugin`` (its ``before_model_callback``), keeping the newest
  invocation (``num_invocations_to_keep=1``), on the same copies.
* **ADK's events compaction** (``EventsCompactionConfig`` with ``token_threshold`` at the
  window and ``event_retention_size``), with ``LlmEventSummarizer`` over a scripted model
  that returns the prompt's last 2,000 characters as its summary (a real model's summary
  would take seconds; here it takes none). Each call appends the new contents to an
  ``InMemorySessionService`` session as events and runs ADK's own request processors,
  compaction then contents (``google.adk.flows.llm_flows.compaction`` and ``.contents``),
  as ADK's flow does before a model call; the time includes that assembly.

Judged as section 12 judges: requests with a function response answering no call of
the content before it, or a call without its response (the adapter's tests' validator,
``plugins/normandy-adk/tests/adk_scripted.py``), and requests over the window by an
exact cl100k count of the original messages kept (a summary or marker is not counted).
``python -m benchmarks.adapters_adk [--quick]`` prints a second table
(:func:`kept_table`): per subject, requests holding the task and the current question,
and requests over the window when what the manager creates is counted too.
"""

from __future__ import annotations

import asyncio
import json
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # imported where used: benchmarks.adapters imports this module at its top
    from benchmarks.adapters import Converted, Message, Subject

__all__ = ["adk_problems", "adk_subjects", "to_adk"]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins/normandy-adk/tests"))

#: ``EventsCompactionConfig.event_retention_size`` of the events-compaction arm.
RETENTION = 8
#: The characters of the prompt the scripted summarizer returns as its summary.
SUMMARY_CHARS = 2_000


def to_adk(messages: Sequence[Message]) -> Converted:
    """The session as ADK request contents (see the module's docstring)."""
    from google.genai import types

    from benchmarks.adapters import Converted

    conv = Converted([], [])
    pending_system: list[int] = []
    for i, m in enumerate(messages):
        role = m["role"]
        if role == "system":
            pending_system.append(i)
        elif role == "tool":
            response = types.FunctionResponse(
                id=m["tool_call_id"],
                name=m.get("name") or "tool",
                response={"result": m["content"]},
            )
            part = types.Part(function_response=response)
            last = conv.objects[-1] if conv.objects else None
            if last is not None and last.parts[-1].function_response is not None:
                last.parts.append(part)
                conv.sources[-1].append(i)
            else:
                conv.objects.append(types.Content(role="user", parts=[part]))
                conv.sources.append([i])
        elif role == "user":
            texts = [messages[j]["content"] for j in pending_system] + [m["content"]]
            conv.objects.append(
                types.Content(role="user", parts=[types.Part(text=t) for t in texts])
            )
            conv.sources.append([*pending_system, i])
            pending_system = []
        else:
            conv.objects.append(types.Content(role="model", parts=_model_parts(m)))
            conv.sources.append([i])
        conv.count_at[i + 1] = len(conv.objects)
    _name_responses(conv.objects)
    return conv


def _model_parts(m: Message) -> list[Any]:
    from google.genai import types

    parts = [types.Part(text=m["content"])] if m.get("content") else []
    for c in m.get("tool_calls") or []:
        call = types.FunctionCall(
            id=c["id"], name=c["function"]["name"], args=json.loads(c["function"]["arguments"])
        )
        parts.append(types.Part(function_call=call))
    return parts


def _name_responses(contents: list[Any]) -> None:
    """Give each function response its call's name (Chat tool messages may carry none)."""
    names: dict[str, str] = {}
    for c in contents:
        for p in c.parts:
            if p.function_call is not None:
                names[p.function_call.id] = p.function_call.name
            elif p.function_response is not None:
                p.function_response.name = names.get(p.function_response.id, "tool")


def adk_problems(out: list[Any]) -> list[str]:
    """The adapter's tests' pairing validator on one request's contents."""
    from adk_scripted import pairing_problems

    return list(pairing_problems(out))


# -- the subjects ------------------------------------------------------------------------------


def _payload(part: Any) -> int:
    """What a shallow copy of a part shares with the original: its payload object."""
    for value in (part.text, part.function_call, part.function_response):
        if value is not None:
            return id(value)
    return id(part)


class _Originals:
    """Leads ADK's copies of contents back to the session's own objects (so the judge
    counts what each request keeps), by the payloads a shallow copy shares."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[int, ...], Any] = {}

    def note(self, contents: Sequence[Any]) -> None:
        for c in contents:
            self.by_key.setdefault(tuple(_payload(p) for p in c.parts or []), c)

    def of(self, contents: Sequence[Any]) -> list[Any]:
        return [self.by_key.get(tuple(_payload(p) for p in c.parts or []), c) for c in contents]


def _shallow(contents: Sequence[Any]) -> list[Any]:
    """Fresh copies of ``contents`` as ADK hands them to a plugin (content and parts
    copied, payloads shared)."""
    return [
        c.model_copy(update={"parts": [p.model_copy() for p in c.parts or []]}) for c in contents
    ]


#: A subject's step: the whole history and what is new since the last call -> the input.
Step = Callable[[list[Any], list[Any]], list[Any]]


def given_copies(step: Callable[[list[Any]], list[Any]]) -> Step:
    """A plugin given fresh copies of the whole history each call; its output led back
    to the originals for the judge."""
    originals = _Originals()

    def run(history: list[Any], new: list[Any]) -> list[Any]:
        originals.note(new)
        return originals.of(step(_shallow(history)))

    return run


def _scripted_llm() -> Any:
    """The summarizer's model: an ADK ``BaseLlm`` returning the prompt's last
    :data:`SUMMARY_CHARS` characters as its summary."""
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_response import LlmResponse
    from google.genai import types

    class Scripted(BaseLlm):
        model: str = "scripted-summarizer"

        async def generate_content_async(self, llm_request: Any, stream: bool = False) -> Any:
            text = llm_request.contents[0].parts[0].text or ""
            part = types.Part(text="Summary: " + text[-SUMMARY_CHARS:])
            yield LlmResponse(content=types.Content(role="model", parts=[part]))

    return Scripted()


def events_compaction(loop: asyncio.AbstractEventLoop, window: int) -> Step:
    """ADK's events compaction over a session holding the history as events."""
    from google.adk.agents import LlmAgent
    from google.adk.agents.invocation_context import InvocationContext
    from google.adk.apps.app import EventsCompactionConfig
    from google.adk.apps.llm_event_summarizer import LlmEventSummarizer
    from google.adk.events import Event
    from google.adk.flows.llm_flows import compaction, contents
    from google.adk.models.llm_request import LlmRequest
    from google.adk.sessions import InMemorySessionService

    with warnings.catch_warnings():  # ADK marks the feature experimental
        warnings.simplefilter("ignore")
        config = EventsCompactionConfig(
            summarizer=LlmEventSummarizer(llm=_scripted_llm()),
            token_threshold=window,
            event_retention_size=RETENTION,
        )
    service = InMemorySessionService()
    session = loop.run_until_complete(service.create_session(app_name="bench", user_id="u"))
    agent = LlmAgent(name="bench", model=_scripted_llm())
    ctx = InvocationContext(
        session_service=service,
        invocation_id="bench",
        agent=agent,
        session=session,
        events_compaction_config=config,
    )
    originals = _Originals()
    clock = [0.0]

    async def request(new: list[Any]) -> list[Any]:
        for c in new:
            clock[0] += 1.0
            author = "bench" if c.role == "model" else "user"
            event = Event(author=author, content=c, invocation_id="bench", timestamp=clock[0])
            await service.append_event(session=session, event=event)
        req = LlmRequest()
        for processor in (compaction.request_processor, contents.request_processor):
            async for _ in processor.run_async(ctx, req):
                pass
        return req.contents

    def run(history: list[Any], new: list[Any]) -> list[Any]:
        originals.note(new)
        return originals.of(loop.run_until_complete(request(new)))

    return run


def adk_subjects() -> list[Subject]:
    """normandy-adk, ADK's ContextFilterPlugin and ADK's events compaction."""
    from google.adk.models.llm_request import LlmRequest
    from google.adk.plugins.context_filter_plugin import ContextFilterPlugin

    from benchmarks.adapters import OPTS, WINDOW, Subject
    from normandy_adk import ContentsCompactor

    loop = asyncio.new_event_loop()
    ours = ContentsCompactor("window_manager", OPTS, window=WINDOW)
    keep_one = ContextFilterPlugin(num_invocations_to_keep=1)

    def filtered(contents: list[Any]) -> list[Any]:
        req = LlmRequest(contents=contents)
        loop.run_until_complete(
            keep_one.before_model_callback(callback_context=None, llm_request=req)
        )  # type: ignore[arg-type]
        return req.contents

    return [
        Subject(
            "normandy-adk (ContentsCompactor, as the plugin)",
            given_copies(lambda c: ours.run(c, session="bench").contents),
        ),
        Subject("ContextFilterPlugin(num_invocations_to_keep=1)", given_copies(filtered)),
        Subject(
            f"EventsCompactionConfig(token_threshold={WINDOW:,}, event_retention_size="
            f"{RETENTION}), scripted summarizer",
            events_compaction(loop, WINDOW),
        ),
    ]


# -- what each request keeps (the section's extra table) -----------------------------------


def _is_question(content: Any) -> bool:
    return content.role == "user" and bool(content.parts[0].text)


def kept_table(quick: bool = False) -> str:
    """Per ADK subject, over the section's calls: requests holding the task (the first
    question) and the current question, and requests over the window when what the
    manager creates (a marker, a summary) is counted too (cl100k of its text)."""
    from benchmarks.adapters import SEED, WINDOW, _boundaries, _exact_tokens
    from benchmarks.common import raw_encoding
    from normandy_core.app.workload import generate_session
    from normandy_core.transcripts.chat import to_openai

    messages = to_openai(generate_session(SEED, 300 if quick else 1_000, end_mid_round=True))
    tokens = _exact_tokens(messages)
    bounds = [b for b in _boundaries(messages) if sum(tokens[:b]) > WINDOW // 2]
    conv = to_adk(messages)
    index = {id(o): k for k, o in enumerate(conv.objects)}
    enc = raw_encoding()
    lines = [
        "| subject | requests with the task | with the current question "
        "| over the window, created text counted | created tokens (median) |",
        "|---|---|---|---|---|",
    ]
    for s in adk_subjects():
        prev = task = current = over = 0
        made: list[int] = []
        for b in bounds:
            upto = conv.count_at[b]
            out = s.step(conv.objects[:upto], conv.objects[prev:upto])
            prev = upto
            question = max(k for k in range(upto) if _is_question(conv.objects[k]))
            task += any(o is conv.objects[0] for o in out)
            current += any(o is conv.objects[question] for o in out)
            kept = sum(tokens[j] for o in out if id(o) in index for j in conv.sources[index[id(o)]])
            new = sum(
                len(enc.encode_ordinary(p.text or "")) + 4
                for o in out
                if id(o) not in index
                for p in o.parts or []
            )
            made.append(new)
            over += kept + new > WINDOW
        n = len(bounds)
        lines.append(
            f"| {s.name} | {task} / {n} | {current} / {n} | {over} / {n} | {sorted(made)[n // 2]} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import os

    os.environ["NORMANDY_ARCHIVE_PATH"] = "off"  # as ``python -m benchmarks.adapters`` runs
    print(kept_table(quick="--quick" in sys.argv))
