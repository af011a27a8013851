"""Parse the ranks on a Dask distributed cluster: ``--scheduler ADDRESS`` / ``FSDPVIZ_SCHEDULER``.

Each trace file becomes one Dask task running the same per-file work as a local parser process
(``parse_task.parse_file``: parse, write the Parquet cache beside the trace when it can, return
the rank's columns). Workers read the traces from a path they all see (a shared file system), so
only the parsed columns travel back. Inside a worker the work runs in the worker's own process:
Dask's worker processes are daemonic and cannot start children. A task whose worker dies is run
again on another worker (``RETRIES``); a file that cannot be parsed fails as it does locally, with
one clear line.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from fsdpviz.errors import FsdpvizError, UsageError
from fsdpviz.trace.parse_task import ParsedRank, PerRank, parse_file, unwrap

ENV_SCHEDULER: Final = "FSDPVIZ_SCHEDULER"
CONNECT_TIMEOUT_S: Final = 5
RETRIES: Final = 2  # a rank whose worker died is tried on another worker this many more times
PROGRESS_EVERY_S: Final = 2.0


def connect(address: str) -> object:
    """A ``distributed.Client`` for ``address``; one clear error when Dask is missing or the
    scheduler cannot be reached within a few seconds."""
    try:
        from distributed import Client
    except ImportError:
        raise UsageError("--scheduler needs Dask's distributed package: pip install 'fsdpviz[dask]'") from None
    try:
        return Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise UsageError(f"--scheduler {address}: cannot reach the Dask scheduler within "
                         f"{CONNECT_TIMEOUT_S} s ({type(exc).__name__}: {exc})") from None
    except ValueError as exc:  # a malformed address
        raise UsageError(f"--scheduler {address}: not a Dask scheduler address ({exc}); "
                         "use e.g. tcp://host:8786") from None


def parse_on_cluster(files: Sequence[Path], address: str, *, cache: bool, progress: bool | None,
                     skippable: frozenset[Path], per_rank: PerRank | None = None,
                     ) -> list[list[ParsedRank] | None]:
    """Tables for every file, in order, parsed by the cluster's workers (see ``workers.parse_all``;
    with ``per_rank``, each rank is reduced on its worker and only the result travels)."""
    from distributed import as_completed
    from distributed.client import FutureCancelledError
    from distributed.scheduler import KilledWorker


    client = connect(address)
    run = uuid.uuid4().hex[:8]
    results: list[list[ParsedRank] | None] = [None] * len(files)
    started = last = time.monotonic()
    loud = progress if progress is not None else sys.stderr.isatty()
    try:
        futures = client.map(parse_file,  # type: ignore[attr-defined]
                             [str(f) for f in files], [cache] * len(files), [per_rank] * len(files),
                             key=[f"fsdpviz-parse-{run}-{i}" for i in range(len(files))], retries=RETRIES)
        index = {f.key: i for i, f in enumerate(futures)}
        completed = as_completed(futures, with_results=True, loop=client.loop)  # type: ignore[attr-defined]
        for done, (future, result) in enumerate(completed, 1):
            i = index[future.key]
            results[i] = unwrap(result, files[i] in skippable)
            now = time.monotonic()
            if loud and (now - last >= PROGRESS_EVERY_S or done == len(files)):
                last = now
                rate = done / max(now - started, 1e-9)
                print(f"fsdpviz: parsed {done}/{len(files)} trace files on {address} ({rate:.1f} files/s)",
                      file=sys.stderr, flush=True)
    except KilledWorker as exc:
        raise FsdpvizError(f"--scheduler {address}: Dask workers died {RETRIES + 1} times parsing one trace "
                           f"file ({exc}); a worker may lack the memory for one rank") from None
    except (FutureCancelledError, OSError) as exc:
        raise FsdpvizError(f"--scheduler {address}: lost the cluster while parsing ({type(exc).__name__}: "
                           f"{exc})") from None
    finally:
        client.close()  # type: ignore[attr-defined]
    return results
