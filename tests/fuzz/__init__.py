"""The project's own fuzz campaign (issue 12): generators, independent validators, a runner.

``python scripts/fuzz.py --seed 1 --duration 60`` (or ``make fuzz``) runs it for a while;
``tests/fuzz/test_fuzz_campaign.py`` runs a bounded deterministic slice under pytest.
"""
