"""Units nested in units (FSDP2's ``fully_shard`` on ``blocks.4.moe.experts`` before ``blocks.4``): read,
regrouped, simulated and written as code, on a step built here so that every answer is known.

The model is the one tests/integration/record_scripts/nested_moe_train.py trains: six blocks, the last
two holding their experts as units of their own. The real recording and the written code recorded
again are tests/integration/test_whatif_nested_roundtrip.py; here the code runs under torch's own
FSDP2 on torch's fake process group, which refuses a parent sharded before its child.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from helpers.fakegroup import fake_process_group, run_shard_code, unit_params

from fsdpviz.naming import ROOT_UNIT, clean_fqn, unit_modules
from fsdpviz.replay import program as prog
from fsdpviz.replay.comm import CommModel, Line
from fsdpviz.replay.recorded import Gather, MicroBatch, Pass, Recording, Reduce, Segment, StepProgram
from fsdpviz.replay.recording import _pass_frames, _Window
from fsdpviz.replay.settings import GIVEN, Settings, Wrap
from fsdpviz.replay.simulate import run
from fsdpviz.vocabulary import ALL_GATHER, BACKWARD, FORWARD, FSDP2, REDUCE_SCATTER
from fsdpviz.whatif.apply import apply_code

SCRIPT = Path(__file__).parents[1] / "integration" / "record_scripts" / "nested_moe_train.py"
BLOCKS = [f"blocks.{i}" for i in range(6)]
E4, E5 = "blocks.4.moe.experts", "blocks.5.moe.experts"
UNITS = [ROOT_UNIT, *BLOCKS[:5], E4, BLOCKS[5], E5]  # forward order, as FSDP2 opens them
NESTED_IN = {E4: BLOCKS[4], E5: BLOCKS[5]}
UNIT_BYTES = {ROOT_UNIT: 33_024, **{b: 83_472 for b in BLOCKS[:4]}, BLOCKS[4]: 17_936, BLOCKS[5]: 17_936,
              E4: 65_536, E5: 65_536}


def test_windows_nested_at_any_depth_are_parts_around_their_children() -> None:
    """A window holding others is part a before its first child and part b after its last, at every
    depth: the experts' window inside block 4's inside the root's is a pass of its own, and so is a
    window nested one level deeper still."""
    wins = [_Window(u, FORWARD, 0, s, e) for u, s, e in (
        (ROOT_UNIT, 0, 100), ("blocks.0", 10, 20), ("blocks.4", 30, 70), (E4, 40, 60), ("deep", 45, 50),
        ("blocks.5", 75, 95))]
    assert list(_pass_frames(wins)) == [
        (ROOT_UNIT, "a", 0, 10, 0), ("blocks.0", "", 10, 20, 10),
        ("blocks.4", "a", 30, 40, 20), (E4, "a", 40, 45, 40), ("deep", "", 45, 50, 45), (E4, "b", 50, 60, 50),
        ("blocks.4", "b", 60, 70, 60), ("blocks.5", "", 75, 95, 70), (ROOT_UNIT, "b", 95, 100, 95)]


def _recording(modules: dict[str, list[str]] | None = None, units: list[str] | None = None) -> Recording:
    """The nested model's recording, one rank and step on CPU: every pass and collective written out."""
    units = units or UNITS
    forward = [(ROOT_UNIT, "a"), *((b, "") for b in BLOCKS[:4]), (BLOCKS[4], "a"), (E4, ""), (BLOCKS[4], "b"),
               (BLOCKS[5], "a"), (E5, ""), (BLOCKS[5], "b"), (ROOT_UNIT, "b")]
    # backward: the post-forward order reversed (a block's pre-backward runs before its experts')
    backward = [(ROOT_UNIT, "a"), (BLOCKS[5], "a"), (E5, ""), (BLOCKS[5], "b"), (BLOCKS[4], "a"), (E4, ""),
                (BLOCKS[4], "b"), *((b, "") for b in reversed(BLOCKS[:4])), (ROOT_UNIT, "b")]

    def passes(phase: str, order: list[tuple[str, str]]) -> list[Pass]:
        # a distinct compute per pass (microseconds), so that a lost or doubled one shows in any sum
        # the pre time is FSDP's hooks (a pass's own code before its first op is none here)
        return [Pass(unit=u, phase=phase, micro=0, part=part, gap_ns=1_000.0, pre_ns=2_000.0, pre_framework_ns=2_000.0,
                     compute_ns=(10_000.0 + 1_000.0 * i) * (2 if phase == BACKWARD else 1), post_ns=3_000.0,
                     post_framework_ns=1_000.0) for i, (u, part) in enumerate(order)]

    def opening(order: list[tuple[str, str]], unit: str) -> tuple[str, str]:
        return next((u, p) for u, p in order if u == unit)

    gathers = [Gather(unit=u, phase=phase, micro=0, bytes=UNIT_BYTES[u], host_ns=500.0, copy_in_ns=0.0,
                      comm_ns=UNIT_BYTES[u] * 0.1, copy_out_host_ns=400.0, copy_out_ns=0.0,
                      issued_in=(u, phase, opening(order, u)[1]))
               for phase, order in ((FORWARD, forward), (BACKWARD, backward)) for u in units
               if phase == FORWARD or u != ROOT_UNIT]  # the root keeps its parameters for backward
    reduces = [Reduce(unit=u, micro=0, bytes=UNIT_BYTES[u], comm_ns=UNIT_BYTES[u] * 0.1) for u in units]
    step = StepProgram(rank=0, step=2, step_ns=10**7, micro=[MicroBatch(
        pre=Segment(busy_ns=5_000.0), forward=passes(FORWARD, forward), mid=Segment(busy_ns=5_000.0),
        backward=passes(BACKWARD, backward))], post=Segment(busy_ns=5_000.0), gathers=gathers, reduces=reduces)
    return Recording(framework=FSDP2, device="cpu", world_size=2, units=list(units), unit_bytes=dict(UNIT_BYTES),
                     modules=modules or {u: [u] for u in units},
                     reshard_after_forward={u: u != ROOT_UNIT for u in units}, prefetch="implicit",
                     steps=[step], ranks_per_host=2, cpu_count=0, prefetch_depths=(0, 0))


COMM = CommModel(world_size=2, ranks_per_host=2, lines={ALL_GATHER: Line(1_000.0, 0.1),
                                                         REDUCE_SCATTER: Line(1_000.0, 0.1)})
SETTINGS = {
    "recorded": Settings(prefetch="recorded"),
    "reshard false": Settings(prefetch="recorded", reshard_after_forward=False),
    "prefetch 1": Settings(prefetch="1"),
    "prefetch none": Settings(prefetch="none"),
    "merge:2": Settings(wrap=Wrap("merge", k=2), prefetch="recorded"),
    "merge:3": Settings(wrap=Wrap("merge", k=3), prefetch="recorded"),
    "root": Settings(wrap=Wrap("root"), prefetch="recorded"),
    "match:experts$": Settings(wrap=Wrap("match", pattern="experts$"), prefetch="recorded"),
}
KEPT = {  # the units each setting keeps, in forward order
    **dict.fromkeys(("recorded", "reshard false", "prefetch 1", "prefetch none"), UNITS),
    "merge:2": [ROOT_UNIT, "[blocks.0, blocks.1]", "[blocks.2, blocks.3]", "[blocks.4, blocks.5]", E4, E5],
    "merge:3": [ROOT_UNIT, "[blocks.0, blocks.1, blocks.2]", "[blocks.3, blocks.4, blocks.5]", E4, E5],
    "root": [ROOT_UNIT],
    # the experts match and stay units; the blocks, matched by nothing, go to the root
    "match:experts$": [ROOT_UNIT, E4, E5],
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_every_setting_simulates_every_unit_it_keeps_with_all_their_work(name: str) -> None:
    """Each kept unit -- the nested experts included -- computes exactly its members' passes, every
    parameter is gathered once per forward, and again in backward only where its unit reshards."""
    rec, settings = _recording(), SETTINGS[name]
    step = rec.steps[0]
    group, new_units, _ = prog.regrouped(rec, settings)
    assert new_units == KEPT[name]
    program = prog.build(rec, step, settings, COMM, {})
    totals = run(program, gpu=False).unit_totals()
    assert set(totals) == set(KEPT[name])
    for phase, passes in ((FORWARD, step.micro[0].forward), (BACKWARD, step.micro[0].backward)):
        for unit in KEPT[name]:
            want = sum(p.compute_ns for p in passes if group[p.unit] == unit)
            assert totals[unit][phase] == pytest.approx(want, rel=1e-12), (unit, phase)
    gathered = {phase: sum(g.bytes for g in program.gathers if g.phase == phase) for phase in (FORWARD, BACKWARD)}
    assert gathered[FORWARD] == sum(UNIT_BYTES.values())
    # the root keeps its parameters after forward (FSDP2's root); so does every unit under reshard false
    # (under match:experts$ the root holds the blocks too)
    kept_after_forward = sum(UNIT_BYTES.values()) if name in ("reshard false", "root") else sum(
        UNIT_BYTES[u] for u in UNITS if group[u] == ROOT_UNIT)
    assert gathered[BACKWARD] == sum(UNIT_BYTES.values()) - kept_after_forward
    assert sorted(r.unit for r in program.reduces) == sorted(KEPT[name])  # one reduction per unit


def test_merge_joins_siblings_never_a_unit_and_one_nested_in_it() -> None:
    """merge:2 on a tree with siblings at two levels: the blocks pair up under the root, the two units
    nested in block 5 pair up inside it, and block 4's experts -- a sibling of nothing -- stay alone."""
    shared = "blocks.5.moe.shared"
    units = [*UNITS, shared]
    rec = Recording(framework=FSDP2, device="cpu", world_size=2, units=units, unit_bytes={}, modules={},
                    reshard_after_forward={}, prefetch="implicit", steps=[], ranks_per_host=2, cpu_count=0)
    assert prog.unit_parents(rec) == {**{b: ROOT_UNIT for b in BLOCKS}, E4: BLOCKS[4], E5: BLOCKS[5],
                                      shared: BLOCKS[5]}
    group = prog.group_units(rec, Settings(wrap=Wrap("merge", k=2)))
    assert group == {ROOT_UNIT: ROOT_UNIT, "blocks.0": "[blocks.0, blocks.1]", "blocks.1": "[blocks.0, blocks.1]",
                     "blocks.2": "[blocks.2, blocks.3]", "blocks.3": "[blocks.2, blocks.3]",
                     "blocks.4": "[blocks.4, blocks.5]", "blocks.5": "[blocks.4, blocks.5]", E4: E4,
                     E5: f"[{E5}, {shared}]", shared: f"[{E5}, {shared}]"}
    for new in set(group.values()):
        members = [u for u, g in group.items() if g == new]
        assert not any(m.startswith(f"{o}.") for m in members for o in members)


def test_match_keeps_a_matched_nested_unit_and_refuses_a_module_inside_a_unit() -> None:
    """match:experts$ names the two nested units: they stay units, their blocks go to the root. A
    pattern matching a module inside a recorded unit that is no unit itself (blocks.4.moe, which holds
    the router beside the experts) would split blocks.4's parameters: refused, one line."""
    from fsdpviz.errors import UsageError

    rec = _recording()
    group = prog.group_units(rec, Settings(wrap=Wrap("match", pattern="experts$")))
    assert group == {ROOT_UNIT: ROOT_UNIT, **dict.fromkeys(BLOCKS, ROOT_UNIT), E4: E4, E5: E5}
    with pytest.raises(UsageError, match=r"makes units inside recorded units \(blocks.4.moe, blocks.5.moe\)"):
        prog.group_units(rec, Settings(wrap=Wrap("match", pattern=r"moe$")))


def _nested_model() -> torch.nn.Module:
    spec = importlib.util.spec_from_file_location("nested_moe_train", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    return module.Model(6, 32)


def _params(model: torch.nn.Module) -> dict[str, list[str]]:
    return unit_params(model, UNITS)


@pytest.fixture(scope="module")
def fake_group() -> Iterator[None]:
    """torch's fake process group (rank 0 of 2): FSDP2 shards for real, no collective runs."""
    yield from fake_process_group(2)


# filled in as predict fills a setting in (what the user gave, the rest as recorded)
CODE_SETTINGS = {
    "reshard false": Settings(reshard_after_forward=False, sources={"reshard_after_forward": GIVEN}),
    "merge:2": Settings(wrap=Wrap("merge", k=2), sources={"wrap": GIVEN}),
    "root": Settings(wrap=Wrap("root"), sources={"wrap": GIVEN}),
    "prefetch 2": Settings(prefetch="2", sources={"prefetch": GIVEN}),
    "match:experts$": Settings(wrap=Wrap("match", pattern="experts$"), sources={"wrap": GIVEN}),
}


def _sharded_modules(code: str) -> list[str]:
    """The modules of each ``fully_shard`` call of ``code``, in call order (``(root)`` for the model)."""
    out = []
    for call in ast.walk(ast.parse(code)):
        if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "fully_shard":
            target = call.args[0]
            refs = target.elts if isinstance(target, ast.List) else [target]
            out += [ast.literal_eval(r.args[0]) if isinstance(r, ast.Call) else ROOT_UNIT for r in refs]
    return out


def _run_code(code: str, model: torch.nn.Module, names: dict[torch.nn.Module, str]
              ) -> tuple[torch.nn.Module, dict[str, list[str]]]:
    return run_shard_code(code, model, names)


@pytest.mark.parametrize("name", list(CODE_SETTINGS))
def test_the_code_shards_children_first_and_fsdp2_builds_the_predicted_units(name: str, fake_group: None) -> None:
    """The written ``shard_model`` runs under FSDP2 (which fails in ``_init_sharding_spec`` on a parent
    sharded before its child) and leaves exactly the predicted units, each holding its members' own
    parameters; a forward and backward run through them, explicit prefetch lists included."""

    model = _nested_model()
    names = {module: fqn for fqn, module in model.named_modules()}
    params = _params(model)
    rec, settings = _recording(), CODE_SETTINGS[name]
    apply = apply_code(rec, params, settings, name)
    assert apply.code is not None, apply.note
    sharded, got = _run_code(apply.code, model, names)
    _, new_units, members = prog.regrouped(rec, settings)
    want = {unit_modules(n)[0]: sorted(p for u in members[n] for p in params.get(u, [])) for n in new_units}
    assert got == want
    tokens = torch.randint(128, (2, 16))
    sharded(tokens).sum().backward()
    order = _sharded_modules(apply.code)
    for i, module in enumerate(order):  # no module sharded before one inside it
        assert not any(inner.startswith(f"{module}.") for inner in order[i + 1:]), order


def _fsdp_states(model: torch.nn.Module) -> dict[str, object]:
    """FSDP2's state of each unit, by the unit's module (``(root)`` for the model)."""
    from torch.distributed.fsdp import FSDPModule

    return {fqn or ROOT_UNIT: m._get_fsdp_state() for fqn, m in model.named_modules() if isinstance(m, FSDPModule)}


def test_recorded_fsdp2_prefetch_depths_are_written_back_per_pass(fake_group: None) -> None:
    """A recording with backward-only explicit prefetch two units deep, asked for no resharding (which
    keeps the prefetch): FSDP2's own state after the code holds backward lists of two units in
    FSDP2's backward order (a block before its experts) and no forward lists."""
    import dataclasses

    model = _nested_model()
    rec = dataclasses.replace(_recording(), prefetch_depths=(0, 2))
    apply = apply_code(rec, _params(model), CODE_SETTINGS["reshard false"], "reshard false")
    assert apply.code is not None
    namespace: dict = {}
    exec(compile(apply.code, "depths", "exec"), namespace)  # noqa: S102 - the code under test
    states = _fsdp_states(namespace["shard_model"](model))
    name_of = {id(s): u for u, s in states.items()}
    backward = {u: [name_of[id(t)] for t in s._states_to_backward_prefetch] for u, s in states.items()}
    assert all(not s._states_to_forward_prefetch for s in states.values())
    assert backward[ROOT_UNIT] == [BLOCKS[5], E5]
    assert backward[BLOCKS[5]] == [E5, BLOCKS[4]] and backward[E5] == [BLOCKS[4], E4]
    assert backward[E4] == [BLOCKS[3], BLOCKS[2]] and backward[BLOCKS[0]] == []


def test_a_recorded_fsdp1_backward_post_is_written_back_as_post(fake_group: None) -> None:
    """FSDP1 recorded with ``backward_prefetch=BACKWARD_POST``: a setting that keeps the prefetch (one
    root unit) and one that adds forward prefetch both write POST, read back from torch's own FSDP1
    modules; no prefetch writes None."""
    import dataclasses

    from torch.distributed.fsdp import BackwardPrefetch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    rec = dataclasses.replace(_recording(), framework="fsdp1", prefetch_depths=None,
                              prefetch_args={"forward_prefetch": False, "backward_prefetch": "BACKWARD_POST"})
    cases = {"root": (CODE_SETTINGS["root"], BackwardPrefetch.BACKWARD_POST, False),
             "prefetch 1": (Settings(prefetch="1", sources={"prefetch": GIVEN}), BackwardPrefetch.BACKWARD_POST, True),
             "prefetch none": (Settings(prefetch="none", sources={"prefetch": GIVEN}), None, False)}
    for name, (settings, backward, forward) in cases.items():
        model = _nested_model()
        apply = apply_code(rec, _params(model), settings, name)
        assert apply.code is not None, apply.note
        namespace: dict = {}
        exec(compile(apply.code, name, "exec"), namespace)  # noqa: S102 - the code under test
        wrapped = namespace["shard_model"](model, device_id=torch.device("cpu"))
        units = FSDP.fsdp_modules(wrapped)
        assert len(units) == (1 if name == "root" else len(UNITS))
        assert {(u.backward_prefetch, u.forward_prefetch) for u in units} == {(backward, forward)}, name


def test_the_code_finds_the_recorded_paths_on_a_wrapped_model(fake_group: None) -> None:
    """Module paths are the user's (naming.clean_fqn drops wrapper segments): the written code finds them
    on a model whose blocks activation checkpointing wrapped and whose last experts torch.compile
    wrapped, shards the outermost module at each path (the wrapper, as torchtitan shards its
    checkpointed blocks), and FSDP2 then holds the predicted units with their parameters; a forward
    and backward run through the checkpointed blocks."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import FSDPModule

    model = _nested_model()
    params = _params(model)  # the recording's names: no wrapper segment
    blocks = model.blocks
    for i in range(len(blocks)):
        blocks[i] = checkpoint_wrapper(blocks[i])
    moe = blocks[5]._checkpoint_wrapped_module.moe
    moe.experts = torch.compile(moe.experts, backend="eager")
    assert any("_orig_mod" in n for n, _ in model.named_modules())
    names = {module: clean_fqn(fqn) for fqn, module in model.named_modules()}
    rec, settings = _recording(), CODE_SETTINGS["merge:2"]
    apply = apply_code(rec, params, settings, "merge:2")
    assert apply.code is not None, apply.note
    sharded, got = _run_code(apply.code, model, names)
    # the outermost module at each path holds the unit: never a wrapper's inner module
    assert not any(fqn.endswith(("_checkpoint_wrapped_module", "_orig_mod"))
                   for fqn, module in sharded.named_modules() if isinstance(module, FSDPModule))
    _, new_units, members = prog.regrouped(rec, settings)
    want = {unit_modules(n)[0]: sorted(p for u in members[n] for p in params.get(u, [])) for n in new_units}
    assert got == want
    sharded(torch.randint(128, (2, 16))).sum().backward()


def test_a_recorded_hsdp_reshard_size_is_written_back() -> None:
    """FSDP2's ``reshard_after_forward=<int>`` (run.json ``reshard_after_forward_size``): code for a
    setting that leaves resharding as recorded writes the int back for the units that had it; one that
    changes resharding, or a merged unit, writes the predicted bool."""
    import dataclasses

    model = _nested_model()
    rec = dataclasses.replace(_recording(), reshard_sizes={"blocks.0": 2, "blocks.1": 2})
    kept = apply_code(rec, _params(model), CODE_SETTINGS["prefetch 2"], "prefetch 2")
    assert kept.code is not None, kept.note
    assert 'fully_shard(m("blocks.0"), reshard_after_forward=2, **fsdp_kwargs)' in kept.lines
    assert 'fully_shard(m("blocks.1"), reshard_after_forward=2, **fsdp_kwargs)' in kept.lines
    assert 'fully_shard(m("blocks.2"), reshard_after_forward=True, **fsdp_kwargs)' in kept.lines
    changed = apply_code(rec, _params(model), CODE_SETTINGS["reshard false"], "reshard false")
    assert 'fully_shard(m("blocks.0"), reshard_after_forward=False, **fsdp_kwargs)' in (changed.lines or [])
    merged = apply_code(rec, _params(model), CODE_SETTINGS["merge:2"], "merge:2")
    assert 'fully_shard([m("blocks.0"), m("blocks.1")], reshard_after_forward=True, **fsdp_kwargs)' in (
        merged.lines or [])
