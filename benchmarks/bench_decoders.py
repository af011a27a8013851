"""JSON libraries side by side on Kineto traces: what decoding costs with each, and what it yields.

For each trace (the real GPU traces of ``../shared/traces/gpu-real`` by default, the largest file of
each folder), each decoder runs in a fresh process (``run_measured``: peak RSS of that process) that
reports its import time, the gunzip time (``isal`` when present, as fsdpviz reads) and the decode
time, best of ``--repeat`` decodes; its peak RSS is sampled every 20 ms (``wait4``'s maximum would
start from this process's own size at the fork):

- ``json``: the standard library, to Python objects;
- ``orjson``: ``orjson.loads``, to Python objects (the "floor" of bench_load);
- ``msgspec``: ``msgspec.json.decode`` untyped, to Python objects;
- ``msgspec typed``: fsdpviz's own ``KinetoTrace`` struct (only the fields the analysis reads);
- ``simdjson``: pysimdjson ``Parser.parse`` then every event's fields read (it parses lazily: a
  document nobody reads costs nothing, so the events are walked as the tables would need);
- ``polars``: ``polars.read_json`` of the trace (one row, ``traceEvents`` a list of structs), then the
  events exploded into rows;
- ``pyarrow``: ``pyarrow.json.read_json``, which reads newline-delimited JSON: the whole trace is one
  such record;
- ``fsdpviz``: ``parse_trace_ranks``, the whole parser (streamed batches, typed decode, numpy
  columns, lanes, steps): what the others would still have to be followed by.

A decoder that fails on a trace is listed with its error. Missing libraries are skipped
(``pip install pysimdjson polars`` for those two).

    python benchmarks/bench_decoders.py [FILE_OR_FOLDER...] [--repeat 3]

Results: docs/performance.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

from harness import describe_machine, run_measured, versions

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
REAL = ROOT.parent / "shared" / "traces" / "gpu-real"
DECODERS = ("json", "orjson", "msgspec", "msgspec typed", "simdjson", "polars", "pyarrow", "fsdpviz")


def _gunzip(data: bytes) -> bytes:
    if data[:2] != b"\x1f\x8b":
        return data
    try:
        from isal import igzip as gz
    except ImportError:
        import gzip as gz  # type: ignore[no-redef]
    return gz.decompress(data)


def _simdjson(text: bytes) -> int:
    import simdjson

    doc = simdjson.Parser().parse(text)
    n = 0
    for event in doc["traceEvents"]:  # the fields the tables need, as the tables would read them
        event.get("ph"), event.get("name"), event.get("ts"), event.get("dur"), event.get("cat")
        args = event.get("args")
        if args is not None:
            args.get("correlation"), args.get("External id")
        n += 1
    return n


def _polars(text: bytes) -> int:
    import io

    import polars as pl

    frame = pl.read_json(io.BytesIO(text), infer_schema_length=None)
    return frame.select(pl.col("traceEvents").explode()).height


def _pyarrow(text: bytes) -> int:
    import io

    import pyarrow.json as pj

    table = pj.read_json(io.BytesIO(text), read_options=pj.ReadOptions(block_size=max(len(text) + 1, 1 << 20)))
    return len(table.column("traceEvents")[0])


def one(decoder: str, path: Path, repeat: int) -> dict:
    """In this (fresh) process: import, gunzip, decode ``repeat`` times; the best decode."""
    started = time.perf_counter()
    if decoder == "orjson":
        import orjson

        decode = lambda t: len(orjson.loads(t)["traceEvents"])
    elif decoder == "json":
        decode = lambda t: len(json.loads(t)["traceEvents"])
    elif decoder == "msgspec":
        import msgspec

        decode = lambda t: len(msgspec.json.decode(t)["traceEvents"])
    elif decoder == "msgspec typed":
        import msgspec

        from fsdpviz.trace.decode import KinetoTrace

        typed = msgspec.json.Decoder(KinetoTrace)
        decode = lambda t: len(typed.decode(t).traceEvents or [])
    elif decoder == "simdjson":
        import simdjson  # noqa: F401

        decode = _simdjson
    elif decoder == "polars":
        import polars  # noqa: F401

        decode = _polars
    elif decoder == "pyarrow":
        import pyarrow.json  # noqa: F401

        decode = _pyarrow
    elif decoder == "fsdpviz":
        from fsdpviz.trace.kineto import parse_trace_ranks

        import_s = time.perf_counter() - started
        best = best_cpu = float("inf")
        n = 0
        for _ in range(repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            n = sum(r.n_events for r in parse_trace_ranks(path))
            best, best_cpu = min(best, time.perf_counter() - t0), min(best_cpu, time.process_time() - c0)
        return {"import_s": import_s, "gunzip_s": 0.0, "decode_s": best, "decode_cpu_s": best_cpu, "n": n,
                "note": "gunzip included; n = events tabled"}
    else:
        raise SystemExit(f"unknown decoder {decoder}")
    import_s = time.perf_counter() - started
    data = path.read_bytes()
    t0 = time.perf_counter()
    text = _gunzip(data)
    gunzip_s = time.perf_counter() - t0
    best = best_cpu = float("inf")
    n = 0
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        n = decode(text)
        best, best_cpu = min(best, time.perf_counter() - t0), min(best_cpu, time.process_time() - c0)
    return {"import_s": import_s, "gunzip_s": gunzip_s, "decode_s": best, "decode_cpu_s": best_cpu, "n": n, "note": ""}


def _inputs(paths: list[str]) -> list[Path]:
    if not paths:
        paths = [str(p) for p in sorted(REAL.rglob("*")) if p.is_dir()]
    out = []
    for raw in paths:
        p = Path(raw)
        files = [p] if p.is_file() else [f for f in p.iterdir() if f.name.endswith((".json", ".json.gz"))]
        if files:
            out.append(max(files, key=lambda f: f.stat().st_size))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="*", help="trace files or folders (default: the real GPU traces)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # DECODER FILE, in a child
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], Path(args.one[1]), args.repeat)))
        return
    print(f"# machine: {describe_machine()}")
    print(f"# {versions('orjson', 'msgspec', 'simdjson', 'polars', 'pyarrow', 'isal')}; best of {args.repeat} "
          "decodes in a fresh process per decoder and trace")
    print("| trace | JSON MB | decoder | import s | gunzip s | decode s (CPU) | events | peak RSS MB (sampled) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|", flush=True)
    for path in _inputs(args.inputs):
        size = len(_gunzip(path.read_bytes())) / 1e6  # (freed before the children start)
        name = f"{path.parent.name}/{path.name}"
        for decoder in DECODERS:
            module = {"simdjson": "simdjson", "polars": "polars"}.get(decoder)
            if module is not None and importlib.util.find_spec(module) is None:
                print(f"| {name} | {size:.0f} | {decoder} | - | - | not installed | - | - |", flush=True)
                continue
            m = run_measured([sys.executable, str(HERE), "--one", decoder, str(path), "--repeat", str(args.repeat)])
            if m.returncode != 0:
                why = (m.stderr.strip().splitlines() or ["?"])[-1][:90]
                print(f"| {name} | {size:.0f} | {decoder} | - | - | fails: {why} | - | {m.tree_rss_mb:.0f} |", flush=True)
                continue
            r = json.loads(m.stdout.strip().splitlines()[-1])
            print(f"| {name} | {size:.0f} | {decoder} | {r['import_s']:.3f} | {r['gunzip_s']:.3f} "
                  f"| {r['decode_s']:.3f} ({r['decode_cpu_s']:.3f}) | {r['n']:,} | {m.tree_rss_mb:.0f} |", flush=True)


if __name__ == "__main__":
    main()
