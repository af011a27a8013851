"""The loader on every real GPU trace, checked against an independent reading of the same JSON.

The reference side uses ``orjson`` and plain Python over the raw events (no fsdpviz code), so a
mistake in the typed decoding, the category mapping, the lanes or the clock shows up as a mismatch.
"""

from __future__ import annotations

import gzip
import re
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest

from fsdpviz.trace import TraceSet

KINDS = {
    "cpu_op": "cpu_op", "user_annotation": "annotation", "gpu_user_annotation": "gpu_annotation",
    "kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset",
    "cuda_runtime": "runtime", "cuda_driver": "runtime",
}
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
COLLECTIVE_IN_NAME = {
    "AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
    "Broadcast": "broadcast", "SendRecv": "send_recv",
}
COLLECTIVE_ARG = {"allreduce": "all_reduce", "broadcast": "broadcast", "_allgather_base": "all_gather"}
GIB = 1 << 30


def _all_traces(gpu_real_dir: Path) -> list[Path]:
    return sorted(gpu_real_dir.rglob("*.json.gz"))


@pytest.fixture(scope="module")
def loaded(gpu_real_dir: Path, load_real: Callable[[Path], TraceSet]) -> dict[str, tuple[TraceSet, dict[str, Any]]]:
    out = {}
    for path in _all_traces(gpu_real_dir):
        raw = orjson.loads(gzip.decompress(path.read_bytes()))
        out[str(path.relative_to(gpu_real_dir))] = (load_real(path), raw)
    assert len(out) == 8, sorted(out)
    return out


def test_every_usable_event_is_tabled_with_its_kind(loaded: dict) -> None:
    for name, (traces, raw) in loaded.items():
        expected = Counter(KINDS[e["cat"]] for e in raw["traceEvents"] if e.get("ph") == "X" and e.get("cat") in KINDS)
        got = traces.events["kind"].value_counts()
        assert {k: int(v) for k, v in got.items() if v} == dict(expected), name
        assert int(traces.ranks["n_skipped"].iloc[0]) == 0, name


def test_rank_world_size_and_clock(loaded: dict) -> None:
    for name, (traces, raw) in loaded.items():
        info = raw["distributedInfo"]
        row = traces.ranks.iloc[0]
        assert (row["rank"], row["world_size"], row["rank_source"]) == (info["rank"], info["world_size"], "distributedInfo")
        # Clock: the first kernel's start is base + ts * 1000 exactly, from the JSON text's digits.
        base = int(raw.get("baseTimeNanoseconds", 0))
        kernel = next(e for e in raw["traceEvents"] if e.get("cat") == "kernel")
        expected_ns = base + int((Decimal(repr(kernel["ts"])) * 1000).to_integral_value())
        ours = traces.events[(traces.events["kind"] == "kernel") & (traces.events["name"] == kernel["name"])]
        assert expected_ns in set(ours["start_ns"]), name


def test_lanes_are_the_threads_and_streams_of_the_trace(loaded: dict) -> None:
    for name, (traces, raw) in loaded.items():
        xs = [e for e in raw["traceEvents"] if e.get("ph") == "X" and e.get("cat") in KINDS]
        streams = {(e["args"]["device"], e["args"]["stream"]) for e in xs if e["cat"] in GPU_CATS}
        threads = {e["tid"] for e in xs if e["cat"] not in GPU_CATS and e["cat"] != "gpu_user_annotation"}
        lanes = traces.lanes
        gpu = lanes[lanes["lane_kind"] == "gpu_stream"]
        assert set(zip(gpu["device"], gpu["tid"])) >= streams, name
        cpu = lanes[lanes["lane_kind"] != "gpu_stream"]
        assert set(cpu["tid"]) == threads, name
        assert lanes["lane"].is_unique and (lanes["lane_kind"] == "cpu_main").sum() == 1, name
        steps_tid = {e["tid"] for e in xs if e["name"].startswith("ProfilerStep#") and e["cat"] == "user_annotation"}
        if steps_tid:
            assert set(cpu.loc[cpu["lane_kind"] == "cpu_main", "tid"]) == steps_tid, name
        assert int(lanes["n_events"].sum()) == len(traces.events), name


def test_nccl_kernels_are_communication_with_their_collective(loaded: dict) -> None:
    n_checked = 0
    for name, (traces, raw) in loaded.items():
        ev = traces.events[traces.events["kind"] == "kernel"]
        comm_by_name = ev.groupby("name", observed=True)["comm"].agg(lambda s: set(s.astype(str)))
        for e in raw["traceEvents"]:
            if e.get("cat") != "kernel":
                continue
            got = comm_by_name[e["name"]]
            if not re.match(r"^nccl.*Kernel", e["name"]):
                assert got == {""}, (name, e["name"])
                continue
            arg = e["args"].get("Collective name")
            token = re.match(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)", e["name"]).group(1)
            expected = COLLECTIVE_ARG[arg] if arg else COLLECTIVE_IN_NAME.get(token, "other")
            assert expected in got, (name, e["name"], got)
            n_checked += 1
    assert n_checked > 100


def test_message_sizes_from_record_param_comms_args(loaded: dict) -> None:
    traces, raw = loaded["nccl_parser_config/nccl_data.json.gz"]
    kernels = [e for e in raw["traceEvents"] if e.get("cat") == "kernel" and "In msg nelems" in e["args"]]
    sizes = {"Float": 4, "Byte": 1, "Char": 1, "Long": 8, "Int": 4}
    expected = sorted(max(e["args"]["In msg nelems"], e["args"]["Out msg nelems"]) * sizes[e["args"]["dtype"]] for e in kernels)
    ev = traces.events
    ours = sorted(ev.loc[(ev["kind"] == "kernel") & (ev["comm"] != ""), "comm_bytes"].tolist())
    assert ours == expected and len(ours) == 21
    # The B200 all-gather: Out msg nelems 201088 bf16 = the unsharded (gathered) size.
    traces, _ = loaded["tracelens_b200_eager/eager_trace.json.gz"]
    ev = traces.events
    assert ev.loc[(ev["kind"] == "kernel") & (ev["comm"] == "all_gather"), "comm_bytes"].tolist() == [201088 * 2]


def test_rccl_generic_kernels_are_comm_other_unless_named(loaded: dict) -> None:
    traces, raw = loaded["tracelens_resnet_act_checkpoint/resnet_act_checkpoint.json.gz"]
    generic = [e for e in raw["traceEvents"] if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel_Generic")]
    ev = traces.events
    ours = ev[(ev["kind"] == "kernel") & ev["name"].astype(str).str.startswith("ncclDevKernel_Generic")]
    assert len(ours) == len(generic) > 0
    unnamed = sum(1 for e in generic if "Collective name" not in e["args"])
    assert (ours["comm"] == "other").sum() == unnamed
    # ROCm kernels carry no External id: it comes from the launching hipLaunchKernel (when the
    # launch was traced; the first kernels were queued before tracing began).
    launched = ours["correlation"].isin(ev.loc[ev["kind"] == "runtime", "correlation"])
    assert launched.sum() > 0 and (ours.loc[launched, "external_id"] >= 0).all()
    assert (ours.loc[~launched, "external_id"] == -1).all()


def test_steps_are_the_cpu_profiler_steps(loaded: dict) -> None:
    for name, (traces, raw) in loaded.items():
        expected = sorted(
            int(e["name"].split("#")[1]) for e in raw["traceEvents"]
            if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
        )
        assert traces.steps["step"].tolist() == expected, name
    assert loaded["tracelens_resnet_act_checkpoint/resnet_act_checkpoint.json.gz"][0].steps["step"].tolist() == [15, 16, 17]


def test_memory_samples_of_df_index_resolver(loaded: dict) -> None:
    traces, raw = loaded["df_index_resolver/df_index_resolver.json.gz"]
    samples = [e for e in raw["traceEvents"] if e.get("name") == "[memory]"]
    assert len(traces.memory) == len(samples) == 28010
    gpu = traces.memory[traces.memory["device"] == "cuda:1"]
    raw_gpu = [e["args"]["Total Allocated"] for e in samples if e["args"]["Device Type"] == 1]
    assert len(gpu) == len(raw_gpu)
    assert gpu["allocated_bytes"].min() == min(raw_gpu) and gpu["allocated_bytes"].max() == max(raw_gpu)
    assert 3.7 < gpu["allocated_bytes"].min() / GIB < 3.9 and 6.1 < gpu["allocated_bytes"].max() / GIB < 6.3
    assert gpu["t_ns"].is_monotonic_increasing


def test_kernels_are_tied_to_their_launch(loaded: dict) -> None:
    traces, _ = loaded["nccl_parser_config/nccl_data.json.gz"]
    ev = traces.events
    kernels = ev[ev["kind"] == "kernel"]
    launches = ev[ev["kind"] == "runtime"]
    tied = kernels.merge(launches[["correlation", "external_id", "step"]], on="correlation", suffixes=("", "_launch"))
    assert len(tied) == len(kernels)
    assert (tied["external_id"] == tied["external_id_launch"]).all()
    assert (tied["step"] == tied["step_launch"]).all()
    cpu_ops = set(ev.loc[ev["kind"] == "cpu_op", "external_id"])
    assert kernels["external_id"].isin(cpu_ops).mean() > 0.95
