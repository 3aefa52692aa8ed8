"""Normandy for Python: keep an LLM agent's conversation inside its model's context window.

The core defines the compactor contract as pluggy hookspecs
(:mod:`normandy_core.contract.hookspecs`), finds compactors and hook plugins by
entry-point name (:mod:`normandy_core.contract.plugins`), and holds the conversation
model, token counting, the model catalog and the boundary function. Its subpackages,
each importing only those below it: ``app`` (the command line and the demo) and
``testing`` (the conformance kit), ``turn``, ``clients``, ``transcripts``, ``contract``,
``conversation``, and the shared ``errors``.

Only the hook markers are imported eagerly; every other public name is imported on first
access, so ``import normandy_core`` stays cheap (no pydantic, no tiktoken).
"""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from normandy_core.contract.hookspecs import (
    CompactorSpec as CompactorSpec,
    HookSpec as HookSpec,
    active_when as active_when,
    hookimpl as hookimpl,
    hookspec as hookspec,
)

__version__ = "0.1.0"

# The one list of the lazy public names: type checkers read these imports, and
# ``__getattr__`` reads them from this file the first time a name is asked for (the
# lazy-loading pattern of Scientific Python's SPEC 1), so no name is written twice.
if TYPE_CHECKING:
    from normandy_core.contract.boundary import (
        run_compaction as run_compaction,
    )
    from normandy_core.contract.check import (
        CompactionResult as CompactionResult,
        build_context as build_context,
        call_compactor as call_compactor,
        check_compaction as check_compaction,
    )
    from normandy_core.contract.compact_tool_settings import (
        CompactToolSettings as CompactToolSettings,
    )
    from normandy_core.contract.compactor import Compactor as Compactor
    from normandy_core.contract.config import (
        AgentConfig as AgentConfig,
    )
    from normandy_core.contract.faults import (
        PluginFault as PluginFault,
        abandoned_threads as abandoned_threads,
    )
    from normandy_core.contract.hooks import (
        run_after_compact as run_after_compact,
        run_before_commit as run_before_commit,
        run_on_boundary as run_on_boundary,
    )
    from normandy_core.contract.options import (
        CompactorOptions as CompactorOptions,
        CounterSpec as CounterSpec,
        validate_options as validate_options,
    )
    from normandy_core.contract.plugins import (
        PluginRow as PluginRow,
        hook_manager as hook_manager,
        list_plugins as list_plugins,
        register_compactor as register_compactor,
        register_hook as register_hook,
        reload_plugins as reload_plugins,
        resolve_compactor as resolve_compactor,
        unregister_compactor as unregister_compactor,
        unregister_hook as unregister_hook,
    )
    from normandy_core.contract.preparation import (
        Prepared as Prepared,
        prepare as prepare,
    )
    from normandy_core.contract.recall import (
        RecallResult as RecallResult,
        recall as recall,
    )
    from normandy_core.contract.recall_settings import (
        RecallError as RecallError,
        RecallSettings as RecallSettings,
        recall_tool as recall_tool,
    )
    from normandy_core.contract.registration import (
        COMPACTOR_GROUP as COMPACTOR_GROUP,
        HOOK_GROUP as HOOK_GROUP,
    )
    from normandy_core.contract.settings import (
        current_settings as current_settings,
        reload_settings as reload_settings,
    )
    from normandy_core.contract.types import (
        BoundaryInfo as BoundaryInfo,
        CompactionContext as CompactionContext,
        CompactionMeta as CompactionMeta,
        CompactionTimeoutError as CompactionTimeoutError,
        ContractViolation as ContractViolation,
        RecallHit as RecallHit,
    )
    from normandy_core.conversation.calibration import (
        CalibratedCounter as CalibratedCounter,
        Calibration as Calibration,
    )
    from normandy_core.conversation.catalog import (
        ModelCatalog as ModelCatalog,
        Prices as Prices,
        StaticCatalog as StaticCatalog,
        default_catalog as default_catalog,
    )
    from normandy_core.conversation.entries import (
        Block as Block,
        Content as Content,
        DocumentBlock as DocumentBlock,
        Entry as Entry,
        FrozenDict as FrozenDict,
        FrozenList as FrozenList,
        ImageBlock as ImageBlock,
        OpaqueBlock as OpaqueBlock,
        RedactedThinkingBlock as RedactedThinkingBlock,
        TextBlock as TextBlock,
        ThinkingBlock as ThinkingBlock,
        ToolResultBlock as ToolResultBlock,
        ToolUseBlock as ToolUseBlock,
        freeze as freeze,
        new_id as new_id,
    )
    from normandy_core.conversation.memory import (
        AgentMemory as AgentMemory,
        drop_thinking as drop_thinking,
    )
    from normandy_core.conversation.structure import (
        carries_results as carries_results,
        group_units as group_units,
        pairing_problems as pairing_problems,
        tool_result_ids as tool_result_ids,
        tool_use_ids as tool_use_ids,
    )
    from normandy_core.conversation.survival import (
        SurvivalError as SurvivalError,
        SurvivalRules as SurvivalRules,
        current_request_entry as current_request_entry,
        first_user_entry as first_user_entry,
    )
    from normandy_core.conversation.tokens import (
        BaseCounter as BaseCounter,
        EstimateCounter as EstimateCounter,
        TiktokenCounter as TiktokenCounter,
        TokenCounter as TokenCounter,
        default_counter_for as default_counter_for,
        estimate_tokens as estimate_tokens,
        get_counter as get_counter,
    )
    from normandy_core.errors import (
        NormandyError as NormandyError,
        OptionsError as OptionsError,
        PluginConflictError as PluginConflictError,
        PluginDisabledError as PluginDisabledError,
        PluginError as PluginError,
        PluginLoadError as PluginLoadError,
        SettingsError as SettingsError,
        UnknownCompactorError as UnknownCompactorError,
        WindowUnknownError as WindowUnknownError,
    )
    from normandy_core.transcripts.continuation import ContinuationMemo as ContinuationMemo
    from normandy_core.transcripts.facade import acompact as acompact, compact as compact
    from normandy_core.transcripts.formats import TranscriptError as TranscriptError
    from normandy_core.transcripts.result import (
        CannotFitError as CannotFitError,
        CompactionError as CompactionError,
        CompactResult as CompactResult,
    )


@functools.cache
def _lazy() -> dict[str, str]:
    """Each public name imported in this file, by its module: the lazy ones of the block
    above, and the hook markers imported eagerly."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
    )
    imports = [n for n in (*tree.body, *block.body) if isinstance(n, ast.ImportFrom)]
    return {
        alias.name: str(node.module)
        for node in imports
        if str(node.module).startswith("normandy_core.")
        for alias in node.names
    }


def __getattr__(name: str) -> Any:
    if name == "__all__":
        return __dir__()
    module = _lazy().get(name)
    if module is None:
        raise AttributeError(f"module 'normandy_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*_lazy(), "__version__"])
