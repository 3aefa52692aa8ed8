"""The compactor contract: its hook specifications and the values they exchange, loading
plugins, preparing a config, the one check of a compactor's result, and the boundary.

It imports only :mod:`normandy_core.conversation` and :mod:`normandy_core.errors`. Inside,
the order is: faults, edits, eventloop, recall_settings, options; types; hookspecs;
plugins; settings, preparation; config; hooks, check; boundary, recall, noop.
"""
