"""``import normandy_core`` stays cheap, and its lazy attributes are all there."""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys

import pytest

import normandy_core

HEAVY = (
    "tiktoken",
    "tiktoken_ext",
    "pydantic",
    "normandy_core.contract.noop",
    "normandy_window_manager",
)


def _fresh(code: str) -> object:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_import_normandy_core_imports_neither_tiktoken_nor_pydantic():
    loaded = _fresh(
        "import json, sys, normandy_core\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    assert loaded == []


@pytest.mark.slow
def test_a_noop_turn_never_pays_for_tiktoken():
    loaded = _fresh(
        "import json, sys\n"
        "from normandy_core import AgentConfig, run_compaction\n"
        "acc = AgentConfig(model='gpt-4o')\n"
        "acc.memory.add_message('user', 'hi')\n"
        "run_compaction(acc, mid_round=False)\n"
        "print(json.dumps([m for m in ('tiktoken', 'tiktoken_ext') if m in sys.modules]))"
    )
    assert loaded == []


def test_every_name_in_all_is_exposed_as_the_object_its_module_defines():
    exported = normandy_core.__all__
    assert len(set(exported)) == len(exported)
    assert dir(normandy_core) == sorted(exported)
    assert len(exported) > 90
    for name in exported:
        value = getattr(normandy_core, name)
        module = getattr(value, "__module__", None)
        if isinstance(value, type) or inspect.isfunction(value):
            # the object itself, from where it is defined (not a copy or a wrapper)
            assert module is not None and module.startswith("normandy_core."), name
            assert getattr(importlib.import_module(module), name, value) is value, name


def test_star_import_gives_every_public_name():
    namespace: dict[str, object] = {}
    exec("from normandy_core import *", namespace)
    assert set(normandy_core.__all__) <= set(namespace)


@pytest.mark.slow
def test_every_lazy_name_resolves_in_a_fresh_interpreter():
    missing = _fresh(
        "import json, normandy_core\n"
        "bad = []\n"
        "for name in normandy_core.__all__:\n"
        "    try:\n"
        "        getattr(normandy_core, name)\n"
        "    except AttributeError:\n"
        "        bad.append(name)\n"
        "print(json.dumps(bad))"
    )
    assert missing == []


def test_an_unknown_attribute_raises_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        normandy_core.nothing_here  # noqa: B018
    assert not hasattr(normandy_core, "maybe_compact")
