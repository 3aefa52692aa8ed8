"""The options of ``anthropic_native`` and ``openai_native``, validated where a config is made."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field, PrivateAttr, field_validator, model_validator

from normandy_core import CompactorOptions, CounterSpec, OptionsError, prepare

if TYPE_CHECKING:
    from normandy_core import Prepared, SurvivalRules

__all__ = [
    "ANTHROPIC_MIN_TRIGGER",
    "DEFAULT_FALLBACK",
    "DEFAULT_FALLBACK_OPTS",
    "DEFAULT_TRIGGER_TOKENS",
    "AnthropicNativeOptions",
    "NativeOptions",
    "OpenAINativeOptions",
]

#: The smallest compaction trigger Anthropic documents (input tokens).
ANTHROPIC_MIN_TRIGGER = 50_000
#: The trigger both compactors use unless told otherwise (Anthropic's default).
DEFAULT_TRIGGER_TOKENS = 150_000
#: The portable compactor used when the provider cannot compact.
DEFAULT_FALLBACK = "window_manager"
#: The fallback's options when ``fallback`` is the default and ``fallback_opts`` unset.
DEFAULT_FALLBACK_OPTS: dict[str, Any] = {"strategy": "summarize"}


class NativeOptions(CompactorOptions):
    """What both provider-native compactors take; unknown options are refused.

    At the start of a turn the compactor acts when the conversation plus the system
    prompt and tool definitions is over ``trigger_tokens`` or over the usable window
    (``window - reserved_tokens``), whichever is smaller; at a mid-round boundary only
    over the usable window (the contract keeps the memory unchanged while it fits).
    """

    trigger_tokens: int = Field(default=DEFAULT_TRIGGER_TOKENS, gt=0)
    """Ask the provider to compact above this many tokens (the usable window caps it)."""
    reserved_tokens: int = Field(default=4096, ge=0)
    """Room kept free for the model's reply."""
    context_window: int | None = Field(default=None, gt=0)
    """Pins the window in tokens; otherwise the model catalog gives it."""
    counter: CounterSpec | None = None
    """``estimate``, ``conservative``, a tiktoken encoding or model name. Default: exact
    where tiktoken knows the model's encoding, else ``conservative``."""
    fallback: str | None = Field(default=DEFAULT_FALLBACK, min_length=1)
    """The installed compactor that compacts instead when the provider cannot (unreachable,
    refusing, not supporting the model, no suitable client); ``None``: report an error."""
    fallback_opts: dict[str, Any] | None = None
    """The fallback's options (validated by it); unset with the default fallback:
    ``{"strategy": "summarize"}`` with this compactor's ``reserved_tokens`` and
    ``counter``."""
    timeout: float = Field(default=120.0, gt=0)
    """Seconds to wait for the provider's compaction before falling back."""

    _fallback: Any = PrivateAttr(default=None)
    """The fallback prepared by ``validate_opts`` (a :class:`normandy_core.Prepared`)."""
    _unsupported: dict[str, str] = PrivateAttr(default_factory=dict)
    """Models the provider said it cannot compact for, with its answer (asked once)."""

    def check_window(self, window: int | None) -> None:
        """Refuse a window the reply's reserve fills (at config time)."""
        if window is not None and window <= self.reserved_tokens:
            raise OptionsError(
                f"option 'reserved_tokens': {self.reserved_tokens:,} tokens reserved for the "
                f"reply leave nothing of the {window:,}-token context window"
            )

    def prepare_fallback(
        self, name: str, entry: str, window: int | None, rules: SurvivalRules
    ) -> None:
        """Prepare the fallback of compactor ``name`` where the config is made (its
        options, and the config's survival rules, checked by it)."""
        if self.fallback is None:
            return
        if self.fallback == name:
            raise OptionsError(f"option 'fallback': {name!r} cannot be its own fallback")
        where = f"{entry} {name} fallback ({self.fallback!r})"
        try:
            self._fallback = prepare(
                self.fallback, self.fallback_options, entry=where, window=window, rules=rules
            )
        except OptionsError:
            raise
        except Exception as exc:
            raise OptionsError(f"{where}: cannot use this compactor: {exc}") from exc

    @property
    def prepared_fallback(self) -> Prepared | None:
        """The fallback :meth:`prepare_fallback` prepared (``None`` without a fallback)."""
        prepared: Prepared | None = self._fallback
        return prepared

    def unsupported_reason(self, model: str) -> str | None:
        """What the provider answered when it said it cannot compact for ``model``."""
        return self._unsupported.get(model)

    def remember_unsupported(self, model: str, reason: str) -> None:
        """Note that the provider cannot compact for ``model`` (it is not asked again)."""
        self._unsupported[model] = reason

    @property
    def fallback_options(self) -> dict[str, Any]:
        """``fallback_opts``; unset with the default fallback, ``{"strategy": "summarize"}``
        with this compactor's ``reserved_tokens`` (and ``counter`` when set), so both size
        the conversation alike."""
        if self.fallback_opts is not None:
            return dict(self.fallback_opts)
        if self.fallback != DEFAULT_FALLBACK:
            return {}
        out = {**DEFAULT_FALLBACK_OPTS, "reserved_tokens": self.reserved_tokens}
        if self.counter is not None:
            out["counter"] = self.counter
        return out

    @model_validator(mode="after")
    def _fallback_opts_need_a_fallback(self) -> NativeOptions:
        if self.fallback is None and self.fallback_opts is not None:
            raise ValueError("fallback_opts are given but fallback is None (no fallback)")
        return self


class AnthropicNativeOptions(NativeOptions):
    """Options of ``anthropic_native``: Anthropic's on-demand compaction."""

    trigger_tokens: int = Field(default=DEFAULT_TRIGGER_TOKENS, ge=ANTHROPIC_MIN_TRIGGER)
    """Ask for compaction above this many tokens (at least 50,000, Anthropic's minimum
    compaction trigger; the usable window caps it)."""
    instructions: str | None = Field(default=None, min_length=1, max_length=20_000)
    """Replace the API's summarization prompt for the compaction request (default: the
    config's survival rule ``summary_instructions``, when set)."""
    max_tokens: int = Field(default=4096, ge=1)
    """``max_tokens`` of the compaction request."""

    @field_validator("instructions")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("instructions must not be blank (leave them out instead)")
        return value


class OpenAINativeOptions(NativeOptions):
    """Options of ``openai_native``: OpenAI's ``POST /v1/responses/compact``."""
