"""What the clients over a provider's SDK share, written once.

:class:`SdkClient` imports the SDK, makes its sync and async clients on first use,
picks a request's model, reports SDK errors, and defines ``complete`` and ``acomplete``
around one exchange (:mod:`.exchange`). A provider's client writes each of its calls
once, as an exchange that builds the SDK requests and reads the responses
(``_completion``, and its compaction), and says how one SDK request is sent, blocking
(``_send``) and awaited (``_asend``): the sync and async forms differ only there.

A request made under a time limit of the library's (a summary under ``summary_timeout``,
a provider compaction under the native compactors' ``timeout``, anything a compactor
sends under ``compaction_timeout``: :func:`~normandy_core.contract.faults.time_left`) is
sent with the time left as its own ``timeout=`` and without the SDK's retries, which
would each wait that long again: the exchange retries it itself, as the SDK would
(connection errors, 408, 409, 429, 5xx, up to the client's ``max_retries``), only while
the pause before the retry leaves the retry as much time again. A provider that never
answers then ends the request at the limit, and the thread waiting for it ends too.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, ClassVar, Generic, NamedTuple, TypeVar

from normandy_core.clients.base import (
    CompactionFailure,
    ContextOverflow,
    ModelClientError,
    ModelReply,
    ProviderCompactionError,
    ToolChoice,
)
from normandy_core.clients.exchange import adrive, drive
from normandy_core.contract.edits import ContextManagement
from normandy_core.contract.faults import time_left
from normandy_core.conversation.entries import Entry

__all__ = [
    "CompletionRequest",
    "Pause",
    "SdkClient",
    "compaction_failure",
    "error_object",
    "retry_pause",
    "sdk_options",
]

RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")


class CompletionRequest(NamedTuple):
    """The arguments of one ``complete`` or ``acomplete`` call."""

    system: str
    messages: Sequence[Entry] | str
    tools: Sequence[Mapping[str, Any]] | None
    tool_choice: ToolChoice
    thinking: int | None
    max_tokens: int
    model: str | None
    context_management: ContextManagement | Mapping[str, Any] | None


class Pause(NamedTuple):
    """What an exchange yields to wait before it retries a request: ``seconds``."""

    seconds: float


#: The shortest ``timeout=`` a request under a deadline is sent with (the SDK's
#: transport takes 0 for "do not wait at all", and a deadline may have just passed).
MIN_REQUEST_TIMEOUT = 0.001
#: The statuses the SDKs retry (timeouts, conflicts, rate limits; 5xx besides).
_RETRIED_STATUSES = frozenset({408, 409, 429})


def retry_pause(sdk: Any, exc: Exception, attempt: int, retries: int) -> float | None:
    """The pause before retrying a request of a time-limited exchange that failed with
    ``exc`` (an SDK error) at its ``attempt``-th try, or ``None`` not to retry.

    Retried as the SDK retries (connection errors and timeouts; 408, 409, 429 and 5xx,
    unless the response's ``x-should-retry`` says otherwise), at most ``retries`` times,
    after the response's ``retry-after`` or 0.5 s doubling up to 8 s; and only while the
    pause is at most half the time left (:func:`time_left`), so the retry has as long
    again. Outside a time limit, ``None``: the SDK's own retries apply there.
    """
    left = time_left()
    if left is None or attempt >= retries:
        return None
    if isinstance(exc, sdk.APIStatusError):
        headers = exc.response.headers
        should = headers.get("x-should-retry")
        status = int(exc.status_code)
        if should == "false" or (
            should != "true" and status not in _RETRIED_STATUSES and status < 500
        ):
            return None
        pause = _retry_after(headers)
    elif isinstance(exc, sdk.APIConnectionError):
        pause = None
    else:
        return None
    if pause is None:
        pause = min(0.5 * 2**attempt, 8.0)
    return pause if pause <= left / 2 else None


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """The pause a response asks for, in seconds (``retry-after-ms`` or a number of
    seconds in ``retry-after``; up to a minute), else ``None``."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            pause = float(headers.get(name) or "") * scale
        except ValueError:
            continue
        if 0 <= pause <= 60:
            return pause
    return None


def sdk_options(
    *, api_key: str | None, base_url: str | None, max_retries: int, timeout: float | None
) -> dict[str, Any]:
    """The keyword arguments for a provider SDK's client: only the ones that were given."""
    options: dict[str, Any] = {"max_retries": max_retries}
    if api_key is not None:
        options["api_key"] = api_key
    if base_url is not None:
        options["base_url"] = base_url
    if timeout is not None:
        options["timeout"] = timeout
    return options


def error_object(exc: Any) -> dict[str, Any]:
    """The ``error`` object of an SDK status error's JSON body (``{}`` without one).

    The Anthropic SDK keeps the whole body (``{"type": "error", "error": {...}}``), the
    OpenAI SDK the ``error`` object alone: both are read here."""
    body = getattr(exc, "body", None)
    if not isinstance(body, dict):
        return {}
    inner = body.get("error")
    return dict(inner) if isinstance(inner, dict) else dict(body)


def compaction_failure(provider: str, sdk: Any, exc: Exception) -> ProviderCompactionError:
    """An SDK exception of a compaction request as a :class:`ProviderCompactionError`.

    Connection errors and timeouts, 5xx, 408 and 429 are ``unreachable``; 404 or a
    message saying the model does not support it ``unsupported``; other refusals
    ``refused``.
    """
    reason: CompactionFailure = "failed"
    if isinstance(exc, sdk.APIConnectionError):  # timeouts included
        reason = "unreachable"
    elif isinstance(exc, sdk.APIStatusError):
        status = int(getattr(exc, "status_code", 0) or 0)
        if status == 404 or "not support" in str(exc).lower():
            reason = "unsupported"
        elif status >= 500 or status in (408, 429):
            reason = "unreachable"
        else:
            reason = "refused"
    return ProviderCompactionError(
        f"{provider}: compaction {reason}: {type(exc).__name__}: {exc}", reason
    )


class SdkClient(ABC, Generic[RequestT, ResponseT]):
    """The shared body of :class:`~normandy_core.clients.AnthropicClient` and
    :class:`~normandy_core.clients.OpenAIClient`.

    ``RequestT`` is what one SDK request is described by, ``ResponseT`` what sending it
    returns.
    """

    #: The provider: the SDK's module, the extra that installs it, and the prefix of
    #: every error message.
    provider: ClassVar[str]
    #: The SDK's sync and async client classes, by name.
    _sdk_classes: ClassVar[tuple[str, str]]

    def __init__(
        self, model: str | None, options: dict[str, Any], *, client: Any, async_client: Any
    ) -> None:
        """``options`` go to the SDK clients when they are made (:func:`sdk_options`);
        ``client`` and ``async_client`` are ready ones."""
        self._sdk = self._import_sdk()
        self.model = model
        self._options = options
        self._client = client
        self._async_client = async_client

    @property
    def endpoint(self) -> str:
        """Where this client's requests go, as calibration tells providers apart:
        ``"<provider>:<base URL>"``, the URL given, else a ready SDK client's, else the
        SDK's default (its ``<PROVIDER>_BASE_URL`` variable, or ``default``)."""
        url = self._options.get("base_url")
        if url is None and self._client is not None:
            url = getattr(self._client, "base_url", None)
        if url is None:
            url = os.environ.get(f"{self.provider.upper()}_BASE_URL") or "default"
        return f"{self.provider}:{str(url).rstrip('/')}"

    def _import_sdk(self) -> Any:
        try:
            return importlib.import_module(self.provider)
        except ImportError as exc:  # pragma: no cover - the extras are installed in tests
            raise ModelClientError(
                f"{type(self).__name__} needs the {self.provider} SDK: "
                f"pip install 'normandy-core[{self.provider}]'"
            ) from exc

    def _model(self, model: str | None) -> str:
        name = model or self.model
        if not name:
            raise ModelClientError(
                f"{self.provider}: no model given ({type(self).__name__}(model=...))"
            )
        return name

    def _sync(self) -> Any:
        if self._client is None:
            self._client = getattr(self._sdk, self._sdk_classes[0])(**self._options)
        return self._client

    def _async(self) -> Any:
        if self._async_client is None:
            self._async_client = getattr(self._sdk, self._sdk_classes[1])(**self._options)
        return self._async_client

    def _within_limit(self, sdk_client: Any) -> Any:
        """The SDK client to send one request with: under a time limit (:func:`time_left`),
        a copy that waits only the time left and does not retry (:func:`retry_pause`
        does, in the exchange); otherwise ``sdk_client`` itself."""
        left = time_left()
        with_options = getattr(sdk_client, "with_options", None)
        if left is None or with_options is None:
            return sdk_client
        return with_options(timeout=max(left, MIN_REQUEST_TIMEOUT), max_retries=0)

    def _ask(
        self, request: RequestT, failure: Callable[[Exception], Exception] | None = None
    ) -> Generator[RequestT | Pause, Any, ResponseT]:
        """One SDK request of an exchange: its response, or its SDK error raised as
        ``failure(exc)`` (by default a :class:`ModelClientError` naming the provider).
        Under a time limit a failed request is retried while time is left
        (:func:`retry_pause`)."""
        retries = int(self._options.get("max_retries", 0))
        attempt = 0
        while True:
            try:
                response: ResponseT = yield request
                return response
            except self._sdk.APIError as exc:
                pause = retry_pause(self._sdk, exc, attempt, retries)
                if pause is None:
                    raise (failure or self._error)(exc) from exc
            attempt += 1
            yield Pause(pause)

    def _perform(self, request: RequestT | Pause) -> Any:
        """Answer one request of an exchange, blocking: send it, or wait out a pause."""
        if isinstance(request, Pause):
            time.sleep(request.seconds)
            return None
        return self._send(request)

    async def _aperform(self, request: RequestT | Pause) -> Any:
        """Answer one request of an exchange without blocking the event loop."""
        if isinstance(request, Pause):
            await asyncio.sleep(request.seconds)
            return None
        return await self._asend(request)

    def _error(self, exc: Exception) -> ModelClientError:
        overflow = self._overflow(exc)
        if overflow is not None:
            return overflow
        return ModelClientError(f"{self.provider}: {type(exc).__name__}: {exc}")

    def _overflow(self, exc: Exception) -> ContextOverflow | None:
        """``exc`` as a :class:`ContextOverflow` when it is the provider's refusal of a
        request too long for the context window, else ``None`` (each provider says how)."""
        return None

    def _compaction_failure(self, exc: Exception) -> ProviderCompactionError:
        return compaction_failure(self.provider, self._sdk, exc)

    @abstractmethod
    def _completion(
        self, request: CompletionRequest, entry: str
    ) -> Generator[RequestT | Pause, Any, ModelReply]:
        """One ``complete`` call as an exchange (``entry`` names the call in errors)."""

    @abstractmethod
    def _send(self, request: RequestT) -> ResponseT:
        """Send one SDK request, blocking."""

    @abstractmethod
    async def _asend(self, request: RequestT) -> ResponseT:
        """Send one SDK request without blocking the event loop."""

    def complete(
        self,
        system: str,
        messages: Sequence[Entry] | str,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: ToolChoice = "auto",
        thinking: int | None = None,
        max_tokens: int = 4096,
        model: str | None = None,
        context_management: ContextManagement | Mapping[str, Any] | None = None,
    ) -> ModelReply:
        """Send one request and return the reply.

        ``thinking`` is used where the provider has it (not on OpenAI's APIs).
        ``context_management`` is this request's server-side edits, instead of the
        client's (what a client can send is its ``server_edits``).
        """
        request = CompletionRequest(
            system, messages, tools, tool_choice, thinking, max_tokens, model, context_management
        )
        return drive(self._completion(request, f"{type(self).__name__}.complete()"), self._perform)

    async def acomplete(
        self,
        system: str,
        messages: Sequence[Entry] | str,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: ToolChoice = "auto",
        thinking: int | None = None,
        max_tokens: int = 4096,
        model: str | None = None,
        context_management: ContextManagement | Mapping[str, Any] | None = None,
    ) -> ModelReply:
        """:meth:`complete` without blocking the event loop."""
        request = CompletionRequest(
            system, messages, tools, tool_choice, thinking, max_tokens, model, context_management
        )
        entry = f"{type(self).__name__}.acomplete()"
        return await adrive(self._completion(request, entry), self._aperform)
