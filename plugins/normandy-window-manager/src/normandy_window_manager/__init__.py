"""The ``window_manager`` compactor: sizes the conversation against the model's window."""
