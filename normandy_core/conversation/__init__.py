"""The conversation and its counting: entries and their blocks, the memory, token counters,
calibration, the model catalog, tool-pair structure, survival rules and prompt-cache cost.

It imports nothing else of Normandy's but :mod:`normandy_core.errors`; everything else is
built on it. Inside, the order is: vocabcache; encodings, entries, catalog; tokens, keys,
structure; memory; calibration, survival; cost.
"""
