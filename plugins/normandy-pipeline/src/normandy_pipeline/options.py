"""The options of the ``pipeline`` compactor; each step's options are checked by that step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, PrivateAttr

from normandy_core import CompactorOptions, CounterSpec

if TYPE_CHECKING:
    from normandy_core import Prepared

__all__ = ["PipelineOptions", "Step"]


class Step(CompactorOptions):
    """One step: the compactor's registered name and its options."""

    compactor: str = Field(min_length=1)
    """The name of an installed compactor (an entry point of ``normandy_core.compactors``)."""
    opts: dict[str, Any] = Field(default_factory=dict)
    """The step's options, validated by the step's own ``validate_opts``."""


class PipelineOptions(CompactorOptions):
    """Options of ``pipeline``; unknown options and bad values are refused at config time."""

    steps: tuple[Step, ...] = Field(min_length=1)
    """The compactors to run, in order."""
    context_window: int | None = Field(default=None, gt=0)
    """Pins the window given to steps that need one and pin none; otherwise the catalog's."""
    counter: CounterSpec | None = None
    """Counter of the pipeline's mid-round check (and of the token figures the boundary
    reports). Default: exact where tiktoken knows the model's encoding, else
    ``conservative``."""

    schedule: Literal["threshold", "cost"] | None = None
    """``cost`` gives ``schedule="cost"`` to every step whose compactor has a ``schedule``
    option and sets none (``window_manager``, ``clear_tool_results``); ``None`` or
    ``threshold`` leaves the steps' own options as they are."""

    _prepared: tuple[Any, ...] = PrivateAttr(default=())
    """The steps prepared by ``validate_opts`` (the core's prepare step, once per config)."""

    @property
    def prepared_steps(self) -> tuple[Prepared, ...]:
        """The steps as ``validate_opts`` prepared them, in order (empty before)."""
        return self._prepared

    def keep_prepared_steps(self, steps: Sequence[Prepared]) -> None:
        """Keep the steps ``validate_opts`` prepared, so no step is validated again at a
        boundary."""
        self._prepared = tuple(steps)
