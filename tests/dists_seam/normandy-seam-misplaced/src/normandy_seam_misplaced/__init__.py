"""Plugins with a hook of the other kind: each must be refused at load time."""
