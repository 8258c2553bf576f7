"""xgrad.autograd.profile: one event per node run, tables, Chrome traces, spans."""

import json
import threading
import time

import jax
import pytest

import xgrad
from xgrad import profiler
from xgrad.engine import engine


def _graph():
    x = xgrad.tensor([1.0, 2.0, 3.0], dtype="float64", requires_grad=True)
    w = xgrad.tensor([0.5, -1.0, 2.0], dtype="float64", requires_grad=True)
    return x, w, ((x * w).tanh() + x.exp()).sum()


def test_one_event_per_node_in_engine_order():
    x, w, loss = _graph()
    order = [n.name() for n in xgrad.autograd.get_execution_order(loss)]
    with xgrad.autograd.profile() as prof:
        loss.backward()
    assert engine.profile_node is None  # uninstalled on exit
    assert [e.name for e in prof.events] == order
    assert all(e.end >= e.start and e.thread_id == threading.get_native_id() for e in prof.events)
    assert x.grad is not None and w.grad is not None  # profiling changed nothing else
    rows = {r.name: r for r in prof.key_averages()}
    assert rows["AccumulateGrad"].calls == 2
    assert sum(r.calls for r in rows.values()) == len(order)
    assert rows["MulBackward"].total == pytest.approx(sum(e.duration for e in prof.events if e.name == "MulBackward"))


def test_grads_equal_unprofiled():
    x, w, loss = _graph()
    loss.backward()
    with xgrad.autograd.profile(sync=False) as prof:
        x2, w2, loss2 = _graph()
        loss2.backward()
    assert (x2.grad.tolist(), w2.grad.tolist()) == (x.grad.tolist(), w.grad.tolist())
    assert len(prof.events) == len(xgrad.autograd.get_execution_order(_graph()[2]))


def test_table_sorting_and_errors():
    _, _, loss = _graph()
    with xgrad.autograd.profile() as prof:
        loss.backward()
    lines = prof.table(sort_by="total").splitlines()
    assert lines[0].split()[:2] == ["Name", "Calls"]
    totals = [float(line.split()[2]) for line in lines[2:]]
    assert totals == sorted(totals, reverse=True)
    by_calls = prof.table(sort_by="calls").splitlines()[2:]
    assert by_calls[0].split()[:2] == ["AccumulateGrad", "2"]
    assert len(prof.table(row_limit=2).splitlines()) == 4
    names = [line.split()[0] for line in prof.table(sort_by="name").splitlines()[2:]]
    assert names == sorted(names)
    percents = [float(line.split()[-1].rstrip("%")) for line in lines[2:]]
    assert sum(percents) == pytest.approx(100, abs=0.5)
    with pytest.raises(ValueError, match="sort_by must be one of total, calls, mean, max, name; got 'cuda_time'"):
        prof.table(sort_by="cuda_time")


def test_chrome_trace_has_one_track_per_worker_thread(tmp_path):
    cpu0, cpu1 = jax.devices("cpu")[:2]
    x = xgrad.tensor([1.0, 2.0], device=cpu1, requires_grad=True)
    loss = (x.exp().to(cpu0) * 2).sum()  # ExpBackward runs on cpu:1's worker, the rest on this thread
    with xgrad.autograd.profile() as prof:
        loss.backward()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(path)
    trace = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in trace if e["ph"] == "X"]
    tracks = {e["tid"]: e["args"]["name"] for e in trace if e["name"] == "thread_name"}
    assert len(tracks) == 2 and threading.current_thread().name in tracks.values()
    by_name = {e["name"]: e for e in spans}
    exp_span = by_name["ExpBackward"]
    assert tracks[exp_span["tid"]].startswith("xgrad-autograd-") and exp_span["args"]["device"] == str(cpu1)
    assert by_name["SumBackward"]["tid"] == threading.get_native_id()
    # Perfetto reads tids as 32-bit numbers: larger ones fold threads onto one track.
    assert all(0 < tid < 2**31 for tid in tracks)
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    assert len(spans) == len(prof.events)


def test_percent_of_total_does_not_count_nested_spans_twice():
    x, w, loss = _graph()
    with xgrad.autograd.profile() as prof:
        with profiler.span("train step"):
            loss.backward()
    rows = {line.split()[0]: float(line.split()[-1].rstrip("%")) for line in prof.table().splitlines()[2:]}
    assert rows["train"] == pytest.approx(100, abs=0.1)  # the span encloses every node
    node_rows = [p for name, p in rows.items() if name != "train"]
    assert sum(node_rows) == pytest.approx(100 * sum(e.duration for e in prof.events[:-1]) / prof.events[-1].duration, abs=0.5)


def test_nodes_show_in_a_jax_profiler_trace(tmp_path):
    x, w, loss = _graph()
    with jax.profiler.trace(str(tmp_path)):
        with xgrad.autograd.profile():
            with profiler.span("xgrad-step-span"):
                loss.backward()
    (trace_file,) = tmp_path.rglob("*.xplane.pb")
    data = trace_file.read_bytes()
    assert b"TanhBackward" in data and b"AccumulateGrad" in data and b"xgrad-step-span" in data


def test_record_and_span_api_and_nesting():
    profiler.record("ignored", 0.0, 1.0)  # no profiler open: dropped
    assert not profiler.is_active()
    with xgrad.autograd.profile() as outer:
        with xgrad.autograd.profile() as inner:
            assert profiler.is_active()
            with profiler.span("CompiledBackward", phase="compile", nodes=3):
                time.sleep(0.002)
            xgrad.tensor([1.0], requires_grad=True).sum().backward()
        t0 = time.perf_counter()
        profiler.record("after inner", t0, t0 + 1e-3, k=1)
    assert engine.profile_node is None
    assert [e.name for e in inner.events] == ["CompiledBackward", "SumBackward", "AccumulateGrad"]
    assert [e.name for e in outer.events] == ["CompiledBackward", "SumBackward", "AccumulateGrad", "after inner"]
    span = inner.events[0]
    assert span.args == {"phase": "compile", "nodes": 3} and span.duration >= 0.002


def test_error_in_backward_still_recorded_and_next_backward_works():
    x = xgrad.tensor([1.0], requires_grad=True)
    y = x * 2

    def bad_hook(grad):
        raise ValueError("hook failed")

    y.register_hook(bad_hook)
    with xgrad.autograd.profile() as prof:
        with pytest.raises(ValueError, match="hook failed"):
            y.sum().backward()
    assert "MulBackward" in [e.name for e in prof.events]
    assert engine.profile_node is None
    (x * 3).sum().backward()
    assert x.grad.tolist() == [3.0]


def test_compiled_backward_is_one_span_with_compile_and_run_split():
    # Contract with xgrad/engine/compiled/run.py: each compiled backward calls
    # profiler.record("CompiledBackward", start, end, cache="miss"|"hit", compile_seconds=...)
    # instead of falling back to eager while a profiler is open.
    from xgrad.autograd import compiled

    compiled.reset()
    x, w, loss = _graph()
    loss.backward(retain_graph=True)
    expected = (x.grad.tolist(), w.grad.tolist())
    x.grad = w.grad = None
    with xgrad.autograd.profile() as prof:
        loss.backward(compiled=True, retain_graph=True)
        first = (x.grad.tolist(), w.grad.tolist())
        x.grad = w.grad = None
        loss.backward(compiled=True)
    # float64 rounding may differ between XLA's fused program and eager's op-by-op order.
    for got in (first, (x.grad.tolist(), w.grad.tolist())):
        assert got[0] == pytest.approx(expected[0], rel=1e-12) and got[1] == pytest.approx(expected[1], rel=1e-12)
    spans = [e for e in prof.events if e.name == "CompiledBackward"]
    assert [e.args["cache"] for e in spans] == ["miss", "hit"]
    assert 0 < spans[0].args["compile_seconds"] <= spans[0].duration
    assert spans[1].args["compile_seconds"] == 0
    assert not [e for e in prof.events if e.name.endswith("Backward") and e.name != "CompiledBackward"]  # no eager nodes ran
    assert compiled.stats()["fallbacks"] == {}
