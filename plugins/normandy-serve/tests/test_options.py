"""``normandy serve``'s options: each bad value is one line on stderr, exit status 2,
naming the option at fault; nothing is served."""

from __future__ import annotations

import pytest

from normandy_core.app.cli import main

BAD = [
    (["--upstream", "api.openai.com"], "--upstream must be an http:// or https:// URL"),
    (["--upstream", "https://api.openai.com/v1"], "--upstream is the API's origin without /v1"),
    (["--upstream", "http://x", "--opts", "[1]"], "--opts must be a JSON object, got list"),
    (["--upstream", "http://x", "--opts", "{bad"], "--opts must be a JSON object:"),
    (["--upstream", "http://x", "--opts", '{"nope": 1}'], "option 'nope': unknown option"),
    (["--upstream", "http://x", "--window", "0"], "--window must be a positive number"),
    (["--upstream", "http://x", "--port", "70000"], "--port must be from 0 to 65535"),
    (["--upstream", "http://x", "--token", " "], "--token must not be empty"),
    (
        ["--upstream", "http://x", "--max-conversations", "0"],
        "--max-conversations must be a positive number of conversations, got 0",
    ),
    (["--upstream", "http://x", "--workers", "0"], "--workers must be at least 1, got 0"),
    (["--upstream", "http://x", "--compactor", "no_such"], "unknown compactor 'no_such'"),
]


@pytest.mark.parametrize(("args", "said"), BAD, ids=[" ".join(a[2:]) or a[1] for a, _ in BAD])
def test_a_bad_option_is_named_and_nothing_is_served(args, said, capsys):
    assert main(["serve", *args]) == (3 if "--compactor" in args else 2)
    err = capsys.readouterr().err
    assert err.startswith("normandy serve: ")
    assert said in err
