"""pgmedallion: PostgreSQL tables into a Delta Lake medallion lakehouse."""

import os as _os

# delta-rs runs its work on a tokio runtime of one worker per CPU. Its writer pulls the rows of
# a write made in pieces (``core.delta_rs.append_pieces``) on one worker while a thread reads
# the next piece through delta-rs, which needs another: on one CPU the two waited for each
# other forever (measured under ``taskset -c 0``). Two workers at least, unless set.
_os.environ.setdefault("TOKIO_WORKER_THREADS", str(max(2, _os.cpu_count() or 1)))
