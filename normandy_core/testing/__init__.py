"""Testing helpers for Normandy and its plugin authors (the ``testing`` extra).

``normandy_core.testing.strategies`` holds hypothesis strategies for tool-using
conversations.
"""
