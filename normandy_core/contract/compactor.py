"""A resolved compactor: where it comes from, and a typed facade to its hooks.

The plugin is registered in a plugin manager of its own that knows only the compactor
hookspecs, so ``maybe_compact`` is called on the selected compactor only.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import pluggy

from normandy_core.contract import hookspecs
from normandy_core.contract.faults import PluginFault, call_plugin
from normandy_core.contract.registration import (
    COMPACTOR_GROUP,
    instantiate,
    new_manager,
    register_checked,
)
from normandy_core.errors import OptionsError, PluginLoadError

if TYPE_CHECKING:
    from normandy_core.contract.types import AgentConfigView, CompactionContext

__all__ = ["Compactor"]

# A compactor's faults are reported on the logger of the plugin loading, as before.
log = logging.getLogger("normandy_core.plugins")


@dataclass
class Compactor:
    """A resolved compactor: its name, where it comes from, and a typed facade to its hooks.

    The plugin is registered in a plugin manager of its own that knows only the compactor
    hookspecs, so ``maybe_compact`` is called on the selected compactor only, with
    pluggy's calling conventions.
    """

    name: str
    distribution: str
    version: str
    plugin: Any
    module: str
    group: str = COMPACTOR_GROUP
    _pm: pluggy.PluginManager = field(
        repr=False, default_factory=lambda: new_manager(hookspecs.CompactorSpec)
    )
    _model: Any = field(repr=False, default=None)
    _impl: Any = field(repr=False, default=None)

    def describe(self) -> str:
        """``compactor 'x' (group normandy_core.compactors) from normandy-x 1.0``."""
        return (
            f"compactor {self.name!r} (group {self.group}) from {self.distribution} {self.version}"
        )

    @property
    def has_validate_opts(self) -> bool:
        """Whether the compactor implements ``validate_opts``."""
        return bool(self._pm.hook.validate_opts.get_hookimpls())

    @property
    def has_needs_window(self) -> bool:
        """Whether the compactor implements ``needs_window``."""
        return bool(self._pm.hook.needs_window.get_hookimpls())

    @property
    def options_model(self) -> Any:
        """The compactor's options model (its ``options_model`` hook), or ``None``."""
        return self._model

    def maybe_compact(self, acc: AgentConfigView, ctx: CompactionContext, opts: Any) -> Any:
        """Call the compactor's ``maybe_compact``; the result is checked by the caller
        (:func:`normandy_core.call_compactor`).

        Its manager holds this one plugin, so the implementation pluggy validated at load
        is called directly, with the arguments it names (pluggy's convention): the hot
        path of every boundary does not pay for a hook dispatch it cannot need.
        """
        impl = self._impl
        if impl is None:
            return self._pm.hook.maybe_compact(acc=acc, ctx=ctx, opts=opts)
        fn, names = impl
        if names == ("acc", "ctx", "opts"):
            return fn(acc, ctx, opts)
        given = {"acc": acc, "ctx": ctx, "opts": opts}
        return fn(*[given[n] for n in names])

    def parse_options(self, raw: Mapping[str, Any], entry: str) -> Any:
        """The options ``maybe_compact`` receives: parsed with the options model, or
        ``raw`` as a read-only mapping when the compactor declares none.

        :raises OptionsError: beginning with ``entry``, naming the compactor and option.
        """
        if self._model is None:
            return raw if isinstance(raw, MappingProxyType) else MappingProxyType(dict(raw))
        from normandy_core.contract.options import validate_options

        return validate_options(self._model, raw, entry=entry, compactor=self.name)

    def needs_window(self, opts: Any) -> bool:
        """The compactor's ``needs_window(opts)``; ``True`` when it does not implement it
        or it fails (a failure is logged)."""
        if not self.has_needs_window:
            return True
        if self._model is not None and not isinstance(opts, self._model):
            try:
                opts = self.parse_options(opts, f"{self.name}.needs_window()")
            except OptionsError:
                return True  # refused where the config is made
        try:
            result = call_plugin(self._pm.hook.needs_window, opts=opts)
        except Exception as exc:
            log.error("needs_window of %s raised %s: %s", self.describe(), type(exc).__name__, exc)
            return True
        return True if result is None else bool(result)

    def requires_client(self, opts: Any) -> str | None:
        """The compactor's ``requires_client(opts)``: what in ``opts`` needs the config's
        model client, or ``None`` (it does not implement the hook, returned ``None``, or
        failed: a failure is logged naming the compactor)."""
        caller = self._pm.hook.requires_client
        if not caller.get_hookimpls():
            return None
        try:
            reason = call_plugin(caller, opts=opts)
        except Exception as exc:
            cause = exc.__cause__ if isinstance(exc, PluginFault) and exc.__cause__ else exc
            log.error(
                "requires_client of %s raised %s: %s",
                self.describe(),
                type(cause).__name__,
                cause,
            )
            return None
        return None if reason is None else str(reason)

    def compaction_threshold(self, opts: Any, window: int | None, mid_round: bool) -> int | None:
        """The compactor's ``compaction_threshold(opts, window, mid_round)``: the token level
        at or below which it promises the plain skip, or ``None`` (it does not implement
        the hook, returned ``None``, raised, or returned something that is not an ``int``;
        a failure is logged naming the compactor)."""
        caller = self._pm.hook.compaction_threshold
        if not caller.get_hookimpls():
            return None
        kind = "mid-round" if mid_round else "turn-start"
        try:
            level = call_plugin(caller, opts=opts, window=window, mid_round=mid_round)
        except Exception as exc:
            cause = exc.__cause__ if isinstance(exc, PluginFault) and exc.__cause__ else exc
            log.error(
                "compaction_threshold of %s raised %s: %s; every %s boundary calls its "
                "maybe_compact",
                self.describe(),
                type(cause).__name__,
                cause,
                kind,
            )
            return None
        if level is None:
            return None
        if isinstance(level, bool) or not isinstance(level, int):
            log.error(
                "compaction_threshold of %s returned %r, not an int or None; every %s "
                "boundary calls its maybe_compact",
                self.describe(),
                level,
                kind,
            )
            return None
        return int(level)

    def validate_opts(
        self, opts: Any, entry: str, window: int | None = None, rules: Any = None
    ) -> None:
        """Call the compactor's ``validate_opts`` when it has one (``rules``: the config's
        :class:`~normandy_core.SurvivalRules`, the defaults when ``None``).

        Any refusal surfaces as :class:`~normandy_core.OptionsError` beginning with
        ``entry`` and naming the compactor: an implementation that raises something else
        (``SystemExit`` included), or an ``OptionsError`` that does not begin with
        ``entry``, is wrapped (the original exception is chained), so every bad option
        names the call that made the config.
        """
        if not self.has_validate_opts:
            return
        if rules is None:
            from normandy_core.conversation.survival import DEFAULT_RULES

            rules = DEFAULT_RULES
        try:
            call_plugin(
                self._pm.hook.validate_opts, opts=opts, entry=entry, window=window, rules=rules
            )
        except OptionsError as exc:
            if str(exc).startswith(entry):
                raise
            raise OptionsError(
                f"{entry}: compactor {self.name!r} refused its options: {exc}"
            ) from exc
        except Exception as exc:
            cause = exc.__cause__ if isinstance(exc, PluginFault) else exc
            raise OptionsError(
                f"{entry}: compactor {self.name!r} refused its options: "
                f"{type(cause).__name__}: {cause}"
            ) from cause

    @classmethod
    def load(
        cls, name: str, plugin: Any, dist: str, version: str, module: str, what: str
    ) -> Compactor:
        """The compactor ``plugin`` (a module, class or instance) registered and checked:
        its hooks match the compactor hookspecs, it implements ``maybe_compact``, and its
        ``options_model`` (if any) gives a pydantic model. ``what`` describes it in errors.

        :raises PluginLoadError: naming the compactor and what is wrong.
        """
        obj = instantiate(plugin, what)
        comp = cls(name=name, distribution=dist, version=version, plugin=obj, module=module)
        register_checked(comp._pm, obj, f"{COMPACTOR_GROUP}:{name}", what, COMPACTOR_GROUP)
        impls = comp._pm.hook.maybe_compact.get_hookimpls()
        if len(impls) == 1:
            comp._impl = (impls[0].function, tuple(impls[0].argnames))
        if not impls:
            hint = ""
            if inspect.isroutine(obj):
                hint = (
                    f"; it is a function ({getattr(obj, '__name__', '?')}), and a plugin is a "
                    "module or class (or instance) holding functions decorated with "
                    "@normandy_core.hookimpl: name the module or class instead"
                )
            raise PluginLoadError(
                f"{what} does not implement the required hook 'maybe_compact'{hint}"
            )
        if comp._pm.hook.options_model.get_hookimpls():
            try:
                model = call_plugin(comp._pm.hook.options_model)
            except Exception as exc:
                raise PluginLoadError(
                    f"{what}: options_model raised {type(exc).__name__}: {exc}"
                ) from exc
            from pydantic import BaseModel

            if not (inspect.isclass(model) and issubclass(model, BaseModel)):
                raise PluginLoadError(
                    f"{what}: options_model returned {model!r}, not a pydantic model class"
                )
            comp._model = model
        return comp
