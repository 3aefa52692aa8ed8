"""parse_options: validate_options memoised for the boundary, refusals never remembered."""

from __future__ import annotations

import pytest
from pydantic import Field

from normandy_core import CompactorOptions, OptionsError, parse_options


class Opts(CompactorOptions):
    keep: int = Field(default=3, ge=1)
    tags: list[str] = Field(default_factory=list)


def test_accepted_options_are_parsed_once():
    a = parse_options(Opts, {"keep": 5, "tags": ["x"]}, compactor="demo")
    b = parse_options(Opts, {"tags": ["x"], "keep": 5}, compactor="demo")
    assert a is b
    assert a.keep == 5


def test_refusals_are_raised_every_time_and_name_the_entry():
    for _ in range(2):
        with pytest.raises(OptionsError, match=r"^demo\.maybe_compact\(\): compactor 'demo'"):
            parse_options(Opts, {"keep": 0}, compactor="demo")
    with pytest.raises(OptionsError, match=r"(?s)^my entry: .*option 'nope'"):
        parse_options(Opts, {"nope": 1}, compactor="demo", entry="my entry")


def test_options_that_are_not_json_are_still_validated():
    class Odd:
        pass

    with pytest.raises(OptionsError, match="option 'tags'"):
        parse_options(Opts, {"tags": Odd()}, compactor="demo")
