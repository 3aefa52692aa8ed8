"""The options of the ``pipeline`` compactor; each step's options are checked by that step."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, field_validator

from normandy_core import CompactorOptions, CounterSpec

if TYPE_CHECKING:
    from normandy_core import Prepared

__all__ = ["STEP_SHAPE", "PipelineOptions", "Step"]

#: The shape of one step, as a refusal of a malformed one shows it.
STEP_SHAPE = '{"compactor": "<name>", "opts": {...}} ("opts" may be left out)'


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

    @field_validator("steps", mode="before")
    @classmethod
    def _step_shapes(cls, steps: Any) -> Any:
        """One refusal naming every malformed step and the shape a step takes, instead of
        one error per step and pydantic's count of the steps left."""
        if isinstance(steps, (str, bytes, Mapping)) or not isinstance(steps, Sequence):
            raise ValueError(
                f"steps must be a list of steps, each {STEP_SHAPE}; got {type(steps).__name__}"
            )
        if not steps:
            raise ValueError(f"steps must hold at least one step, each {STEP_SHAPE}")
        parsed: list[Step] = []
        bad: list[str] = []
        for i, step in enumerate(steps):
            try:
                parsed.append(_parse_step(step))
            except ValueError as exc:
                bad.append(f"steps[{i}] {step!r}: {exc}")
        if not bad:
            return tuple(parsed)
        fix = ""
        if all(isinstance(step, str) for step in steps):
            listed = ", ".join(f'{{"compactor": {json.dumps(step)}}}' for step in steps)
            fix = f", such as steps=[{listed}]"
        raise ValueError(f"{'; '.join(bad)}; a step is {STEP_SHAPE}{fix}")

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


def _parse_step(step: Any) -> Step:
    """``step`` as a :class:`Step`; ``ValueError`` saying what is wrong with its shape."""
    if isinstance(step, Step):
        return step
    if not isinstance(step, Mapping):
        raise ValueError(f"a {type(step).__name__}, not a mapping")
    try:
        return Step.model_validate(dict(step))
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        if first["type"] == "extra_forbidden":
            raise ValueError(f"unknown key {key!r}") from None
        if first["type"] == "missing":
            raise ValueError(f"no key {key!r}") from None
        raise ValueError(f"key {key!r}: {first['msg']}") from None
