"""Make an archive as the version before issue 31 left it when killed: journal rows and a
spool file with frames not moved (run with that version's code on PYTHONPATH)."""

import json
import os
import signal
import sys

from normandy_archive import Archive
from normandy_core.app.workload import generate_session

out = sys.argv[1]
path = os.path.join(out, "archive.sqlite3")
entries = list(generate_session(91, 30))
archive = Archive(path)
done = []
# two compactions as journal rows (the spool's bound at 0), then three spooled frames;
# the fourth drops content of the first again, under another session
batches = [("s1", 0, 4), ("s1", 4, 8), ("s2", 8, 12), ("s2", 0, 2), ("s3", 12, 16)]
Archive.SPOOL_MAX_BYTES = 0
for n, (session, a, b) in enumerate(batches):
    if n == 2:
        Archive.SPOOL_MAX_BYTES = 16 * 1024 * 1024
    cid = archive.record(entries[a:b], session_id=session, index=False, at=1000.0 + n)
    done.append([str(cid), session, a, b, cid.entries])
with open(os.path.join(out, "expected.json"), "w") as f:
    json.dump(done, f)
os.kill(os.getpid(), signal.SIGKILL)
