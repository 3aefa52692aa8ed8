"""Normandy for Python: keep an LLM agent's conversation inside its model's context window.

The core defines the compactor contract as pluggy hookspecs (:mod:`normandy_core.hookspecs`),
finds compactors and hook plugins by entry-point name (:mod:`normandy_core.plugins`), and
holds the conversation model, token counting, the model catalog and the boundary function.

Only the hook markers are imported eagerly; every other public name is imported on first
access, so ``import normandy_core`` stays cheap (no pydantic, no tiktoken).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from normandy_core.hookspecs import CompactorSpec, HookSpec, active_when, hookimpl, hookspec

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    # memory
    "AgentMemory": "memory",
    "Entry": "memory",
    "Block": "memory",
    "Content": "memory",
    "TextBlock": "memory",
    "ThinkingBlock": "memory",
    "RedactedThinkingBlock": "memory",
    "ToolUseBlock": "memory",
    "ToolResultBlock": "memory",
    "ImageBlock": "memory",
    "DocumentBlock": "memory",
    "OpaqueBlock": "memory",
    "drop_thinking": "memory",
    "new_id": "memory",
    # structure
    "group_units": "structure",
    "pairing_problems": "structure",
    "tool_use_ids": "structure",
    "tool_result_ids": "structure",
    "carries_results": "structure",
    # tokens
    "TokenCounter": "tokens",
    "BaseCounter": "tokens",
    "EstimateCounter": "tokens",
    "TiktokenCounter": "tokens",
    "get_counter": "tokens",
    "default_counter_for": "tokens",
    "estimate_tokens": "tokens",
    # catalog
    "ModelCatalog": "catalog",
    "Prices": "catalog",
    "StaticCatalog": "catalog",
    "default_catalog": "catalog",
    # options
    "CompactorOptions": "options",
    "CounterSpec": "options",
    "validate_options": "options",
    # survival rules
    "SurvivalRules": "survival",
    "SurvivalError": "survival",
    "first_user_entry": "survival",
    # config, the contract seam and the boundary
    "AgentConfig": "config",
    "current_settings": "settings",
    "reload_settings": "settings",
    "Prepared": "preparation",
    "prepare": "preparation",
    "CompactionContext": "contract",
    "CompactionMeta": "contract",
    "CompactionResult": "contract",
    "ContractViolation": "contract",
    "build_context": "contract",
    "call_compactor": "contract",
    "check_compaction": "contract",
    "BoundaryInfo": "boundary",
    "CompactionTimeoutError": "boundary",
    "run_compaction": "boundary",
    "run_on_boundary": "boundary",
    "run_after_compact": "boundary",
    "run_before_commit": "boundary",
    "abandoned_threads": "faults",
    "PluginFault": "faults",
    # calibration
    "CalibratedCounter": "calibration",
    "Calibration": "calibration",
    # plugins
    "COMPACTOR_GROUP": "plugins",
    "HOOK_GROUP": "plugins",
    "Compactor": "plugins",
    "PluginRow": "plugins",
    "resolve_compactor": "plugins",
    "register_compactor": "plugins",
    "unregister_compactor": "plugins",
    "register_hook": "plugins",
    "unregister_hook": "plugins",
    "list_plugins": "plugins",
    "reload_plugins": "plugins",
    "hook_manager": "plugins",
    # the one-call facade and transcripts
    "compact": "facade",
    "acompact": "facade",
    "CompactResult": "facade",
    "CompactionError": "facade",
    "CannotFitError": "facade",
    "TranscriptError": "formats",
    # the recall tool (the module is not named recall: that is the function)
    "recall": "retrieval",
    "recall_tool": "retrieval",
    "RecallError": "retrieval",
    "RecallHit": "retrieval",
    "RecallResult": "retrieval",
    "RecallSettings": "retrieval",
    # errors
    "NormandyError": "errors",
    "PluginError": "errors",
    "PluginLoadError": "errors",
    "PluginConflictError": "errors",
    "PluginDisabledError": "errors",
    "UnknownCompactorError": "errors",
    "OptionsError": "errors",
    "SettingsError": "errors",
    "WindowUnknownError": "errors",
}

__all__ = [
    "AgentConfig",
    "AgentMemory",
    "BaseCounter",
    "Block",
    "BoundaryInfo",
    "COMPACTOR_GROUP",
    "CalibratedCounter",
    "Calibration",
    "CannotFitError",
    "CompactResult",
    "CompactionContext",
    "CompactionError",
    "CompactionMeta",
    "CompactionResult",
    "CompactionTimeoutError",
    "Compactor",
    "CompactorOptions",
    "CompactorSpec",
    "Content",
    "ContractViolation",
    "CounterSpec",
    "DocumentBlock",
    "OpaqueBlock",
    "Entry",
    "EstimateCounter",
    "HOOK_GROUP",
    "HookSpec",
    "ImageBlock",
    "ModelCatalog",
    "Prices",
    "NormandyError",
    "OptionsError",
    "PluginConflictError",
    "PluginDisabledError",
    "PluginError",
    "PluginFault",
    "PluginLoadError",
    "PluginRow",
    "Prepared",
    "RecallError",
    "RecallHit",
    "RecallResult",
    "RecallSettings",
    "RedactedThinkingBlock",
    "SettingsError",
    "StaticCatalog",
    "SurvivalError",
    "SurvivalRules",
    "TextBlock",
    "ThinkingBlock",
    "TiktokenCounter",
    "TokenCounter",
    "ToolResultBlock",
    "ToolUseBlock",
    "TranscriptError",
    "UnknownCompactorError",
    "WindowUnknownError",
    "__version__",
    "abandoned_threads",
    "active_when",
    "build_context",
    "call_compactor",
    "carries_results",
    "check_compaction",
    "acompact",
    "compact",
    "current_settings",
    "default_catalog",
    "default_counter_for",
    "drop_thinking",
    "estimate_tokens",
    "first_user_entry",
    "get_counter",
    "group_units",
    "hook_manager",
    "hookimpl",
    "hookspec",
    "list_plugins",
    "new_id",
    "pairing_problems",
    "prepare",
    "recall",
    "recall_tool",
    "register_compactor",
    "register_hook",
    "reload_plugins",
    "reload_settings",
    "resolve_compactor",
    "run_after_compact",
    "run_before_commit",
    "run_compaction",
    "run_on_boundary",
    "tool_result_ids",
    "tool_use_ids",
    "unregister_compactor",
    "unregister_hook",
    "validate_options",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'normandy_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"normandy_core.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from normandy_core.boundary import (
        BoundaryInfo,
        CompactionTimeoutError,
        run_after_compact,
        run_before_commit,
        run_compaction,
        run_on_boundary,
    )
    from normandy_core.calibration import CalibratedCounter, Calibration
    from normandy_core.catalog import ModelCatalog, Prices, StaticCatalog, default_catalog
    from normandy_core.config import AgentConfig
    from normandy_core.contract import (
        CompactionContext,
        CompactionMeta,
        CompactionResult,
        ContractViolation,
        build_context,
        call_compactor,
        check_compaction,
    )
    from normandy_core.errors import (
        NormandyError,
        OptionsError,
        PluginConflictError,
        PluginDisabledError,
        PluginError,
        PluginLoadError,
        SettingsError,
        UnknownCompactorError,
        WindowUnknownError,
    )
    from normandy_core.facade import (
        CannotFitError,
        CompactionError,
        CompactResult,
        acompact,
        compact,
    )
    from normandy_core.faults import PluginFault, abandoned_threads
    from normandy_core.formats import TranscriptError
    from normandy_core.memory import (
        AgentMemory,
        Block,
        Content,
        DocumentBlock,
        Entry,
        ImageBlock,
        OpaqueBlock,
        RedactedThinkingBlock,
        TextBlock,
        ThinkingBlock,
        ToolResultBlock,
        ToolUseBlock,
        drop_thinking,
        new_id,
    )
    from normandy_core.options import (
        CompactorOptions,
        CounterSpec,
        validate_options,
    )
    from normandy_core.plugins import (
        COMPACTOR_GROUP,
        HOOK_GROUP,
        Compactor,
        PluginRow,
        hook_manager,
        list_plugins,
        register_compactor,
        register_hook,
        reload_plugins,
        resolve_compactor,
        unregister_compactor,
        unregister_hook,
    )
    from normandy_core.preparation import Prepared, prepare
    from normandy_core.retrieval import (
        RecallError,
        RecallHit,
        RecallResult,
        RecallSettings,
        recall,
        recall_tool,
    )
    from normandy_core.settings import current_settings, reload_settings
    from normandy_core.structure import (
        carries_results,
        group_units,
        pairing_problems,
        tool_result_ids,
        tool_use_ids,
    )
    from normandy_core.survival import SurvivalError, SurvivalRules, first_user_entry
    from normandy_core.tokens import (
        BaseCounter,
        EstimateCounter,
        TiktokenCounter,
        TokenCounter,
        default_counter_for,
        estimate_tokens,
        get_counter,
    )
