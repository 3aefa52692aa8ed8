"""Make an archive as the version before stemming (main at ``ebcc5a8``) wrote it: an
index of the words as written, no ``stemmed`` mark; 30 generated entries and 3 written
for the test, all indexed but the last (run with that version's code on PYTHONPATH)."""

import os
import sys

from normandy_archive import Archive
from normandy_core import Entry
from normandy_core.app.workload import generate_session

path = os.path.join(sys.argv[1], "archive.sqlite3")
archive = Archive(path)
archive.record(list(generate_session(91, 30)), session_id="s1", at=1000.0)
words = [
    Entry(id="w1", role="user", content="The deployment retries failed twice."),
    Entry(id="w2", role="assistant", content="Connections are timing out in eu-west-1."),
]
archive.record(words, session_id="s1", at=1001.0)
late = [Entry(id="w3", role="user", content="Rebuilding the caches helped.")]
archive.record(late, session_id="s1", at=1002.0, index=False)
archive.close()
