"""Normandy for Python: keep an LLM agent's conversation inside its model's context window.

The core defines the compactor contract as pluggy hookspecs
(:mod:`normandy_core.contract.hookspecs`), finds compactors and hook plugins by entry-point name
(:mod:`normandy_core.contract.plugins`), and holds the conversation model, token counting, the
model catalog and the boundary function.

Only the hook markers are imported eagerly; every other public name is imported on first
access, so ``import normandy_core`` stays cheap (no pydantic, no tiktoken).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from normandy_core.contract.hookspecs import (
    CompactorSpec,
    HookSpec,
    active_when,
    hookimpl,
    hookspec,
)

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    # memory
    "AgentMemory": "conversation.memory",
    "Entry": "conversation.memory",
    "Block": "conversation.memory",
    "Content": "conversation.memory",
    "TextBlock": "conversation.memory",
    "ThinkingBlock": "conversation.memory",
    "RedactedThinkingBlock": "conversation.memory",
    "ToolUseBlock": "conversation.memory",
    "ToolResultBlock": "conversation.memory",
    "ImageBlock": "conversation.memory",
    "DocumentBlock": "conversation.memory",
    "OpaqueBlock": "conversation.memory",
    "drop_thinking": "conversation.memory",
    "new_id": "conversation.memory",
    # structure
    "group_units": "conversation.structure",
    "pairing_problems": "conversation.structure",
    "tool_use_ids": "conversation.structure",
    "tool_result_ids": "conversation.structure",
    "carries_results": "conversation.structure",
    # tokens
    "TokenCounter": "conversation.tokens",
    "BaseCounter": "conversation.tokens",
    "EstimateCounter": "conversation.tokens",
    "TiktokenCounter": "conversation.tokens",
    "get_counter": "conversation.tokens",
    "default_counter_for": "conversation.tokens",
    "estimate_tokens": "conversation.tokens",
    # catalog
    "ModelCatalog": "conversation.catalog",
    "Prices": "conversation.catalog",
    "StaticCatalog": "conversation.catalog",
    "default_catalog": "conversation.catalog",
    # options
    "CompactorOptions": "contract.options",
    "CounterSpec": "contract.options",
    "validate_options": "contract.options",
    # survival rules
    "SurvivalRules": "conversation.survival",
    "SurvivalError": "conversation.survival",
    "first_user_entry": "conversation.survival",
    # config, the contract seam and the boundary
    "AgentConfig": "contract.config",
    "current_settings": "contract.settings",
    "reload_settings": "contract.settings",
    "Prepared": "contract.preparation",
    "prepare": "contract.preparation",
    "CompactionContext": "contract.check",
    "CompactionMeta": "contract.check",
    "CompactionResult": "contract.check",
    "ContractViolation": "contract.check",
    "build_context": "contract.check",
    "call_compactor": "contract.check",
    "check_compaction": "contract.check",
    "BoundaryInfo": "contract.boundary",
    "CompactionTimeoutError": "contract.boundary",
    "run_compaction": "contract.boundary",
    "run_on_boundary": "contract.boundary",
    "run_after_compact": "contract.boundary",
    "run_before_commit": "contract.boundary",
    "abandoned_threads": "contract.faults",
    "PluginFault": "contract.faults",
    # calibration
    "CalibratedCounter": "conversation.calibration",
    "Calibration": "conversation.calibration",
    # plugins
    "COMPACTOR_GROUP": "contract.plugins",
    "HOOK_GROUP": "contract.plugins",
    "Compactor": "contract.plugins",
    "PluginRow": "contract.plugins",
    "resolve_compactor": "contract.plugins",
    "register_compactor": "contract.plugins",
    "unregister_compactor": "contract.plugins",
    "register_hook": "contract.plugins",
    "unregister_hook": "contract.plugins",
    "list_plugins": "contract.plugins",
    "reload_plugins": "contract.plugins",
    "hook_manager": "contract.plugins",
    # the one-call facade and transcripts
    "compact": "transcripts.facade",
    "acompact": "transcripts.facade",
    "CompactResult": "transcripts.facade",
    "CompactionError": "transcripts.facade",
    "CannotFitError": "transcripts.facade",
    "TranscriptError": "transcripts.formats",
    # the recall tool (the module is not named recall: that is the function)
    "recall": "contract.recall",
    "recall_tool": "contract.recall",
    "RecallError": "contract.recall",
    "RecallHit": "contract.recall",
    "RecallResult": "contract.recall",
    "RecallSettings": "contract.recall",
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
    from normandy_core.contract.boundary import (
        BoundaryInfo,
        CompactionTimeoutError,
        run_after_compact,
        run_before_commit,
        run_compaction,
        run_on_boundary,
    )
    from normandy_core.contract.check import (
        CompactionContext,
        CompactionMeta,
        CompactionResult,
        ContractViolation,
        build_context,
        call_compactor,
        check_compaction,
    )
    from normandy_core.contract.config import AgentConfig
    from normandy_core.contract.faults import PluginFault, abandoned_threads
    from normandy_core.contract.options import (
        CompactorOptions,
        CounterSpec,
        validate_options,
    )
    from normandy_core.contract.plugins import (
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
    from normandy_core.contract.preparation import Prepared, prepare
    from normandy_core.contract.recall import (
        RecallError,
        RecallHit,
        RecallResult,
        RecallSettings,
        recall,
        recall_tool,
    )
    from normandy_core.contract.settings import current_settings, reload_settings
    from normandy_core.conversation.calibration import CalibratedCounter, Calibration
    from normandy_core.conversation.catalog import (
        ModelCatalog,
        Prices,
        StaticCatalog,
        default_catalog,
    )
    from normandy_core.conversation.memory import (
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
    from normandy_core.conversation.structure import (
        carries_results,
        group_units,
        pairing_problems,
        tool_result_ids,
        tool_use_ids,
    )
    from normandy_core.conversation.survival import SurvivalError, SurvivalRules, first_user_entry
    from normandy_core.conversation.tokens import (
        BaseCounter,
        EstimateCounter,
        TiktokenCounter,
        TokenCounter,
        default_counter_for,
        estimate_tokens,
        get_counter,
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
    from normandy_core.transcripts.facade import (
        CannotFitError,
        CompactionError,
        CompactResult,
        acompact,
        compact,
    )
    from normandy_core.transcripts.formats import TranscriptError
