"""The transcripts at the edge: provider message lists read into a conversation and written
back as given, and ``compact()`` on them. May import contract, conversation and errors.

Each module imports only those listed before it:

1. ``formats``: the format names, :class:`~normandy_core.TranscriptError`, the values no
   message may hold, the tags of inserted entries; beside it ``jsonio``, the transcript
   file reader (JSON or JSON Lines);
2. ``staging``: messages staged as entries, where each came from, the pairing checks;
3. ``anthropic``, then ``chat`` (Chat Completions; it reads Anthropic thinking parts),
   and ``responses``: one wire format each, reader and writer;
4. ``detection``: which format a list is in;
5. ``transcript``: read and write any format;
6. ``result``: what ``compact()`` returns, and its errors;
7. ``continuation``: a growing list compacted as the continuation of the last call;
8. ``facade``: ``compact()`` and ``acompact()``;
9. ``adapter``: what every framework adapter shares.
"""
