"""The engine under threads: worker threads, many callers at once, errors, fork and exit.

Reference values are closed forms of simple graphs (the gradient of ``(w * c).sum()``
is ``c``; sums of integers are exact in float64) or ``jax.grad`` of the same function.
"""

import textwrap
import threading
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _scripts import run_json, run_script

import xgrad
from xgrad.autograd import is_multithreading_enabled, set_multithreading_enabled


def thread_name():
    return threading.current_thread().name


def test_graph_on_second_device_runs_on_its_worker_thread():
    dev1 = jax.devices()[1]
    x0 = np.array([0.5, -1.0, 2.0])
    x = xgrad.tensor(x0, device=dev1, requires_grad=True)
    y = x.sin()
    ran = []
    y.register_hook(lambda g: ran.append(("sin", thread_name())))
    x.register_post_accumulate_grad_hook(lambda t: ran.append(("acc", thread_name())))
    (y * x).sum().backward()
    assert ran == [("sin", f"xgrad-autograd-cpu:{dev1.id}"), ("acc", f"xgrad-autograd-cpu:{dev1.id}")]
    assert x.grad.device == dev1
    np.testing.assert_allclose(x.grad.numpy(), jax.grad(lambda a: jnp.sum(jnp.sin(a) * a))(x0), rtol=1e-12)


def test_set_multithreading_enabled_as_context_manager_and_as_call():
    x = xgrad.tensor([1.0, 2.0], device=jax.devices()[1], requires_grad=True)
    ran = []
    x.register_post_accumulate_grad_hook(lambda t: ran.append(thread_name()))
    with set_multithreading_enabled(False):
        assert not is_multithreading_enabled()
        (x * x).sum().backward()
    assert is_multithreading_enabled()
    set_multithreading_enabled(False)
    try:
        (x * x).sum().backward()
    finally:
        set_multithreading_enabled(True)
    (x * x).sum().backward()
    assert ran == ["MainThread", "MainThread", f"xgrad-autograd-cpu:{jax.devices()[1].id}"]
    assert x.grad.tolist() == [6.0, 12.0]


def test_multithreading_setting_is_per_thread():
    seen = []
    with set_multithreading_enabled(False):
        other = threading.Thread(target=lambda: seen.append(is_multithreading_enabled()))
        other.start()
        other.join()
    assert seen == [True]


def run_threads(target, n):
    """Run ``target(i)`` on ``n`` threads released together; re-raise the first failure."""
    barrier = threading.Barrier(n)
    failures = []

    def main(i):
        barrier.wait()
        try:
            target(i)
        except BaseException as exc:  # reported to the test below
            failures.append(exc)

    threads = [threading.Thread(target=main, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a backward thread hung"
    if failures:
        raise failures[0]


def test_concurrent_backwards_on_shared_leaves_accumulate_exactly():
    n_threads, n_steps = 16, 50
    w_cpu = xgrad.tensor(np.zeros(3), requires_grad=True)
    w_dev = xgrad.tensor(np.zeros(3), device=jax.devices()[1], requires_grad=True)
    seen_by_hooks = [[] for _ in range(n_threads)]

    def steps(i):
        c = np.array([1.0, 2.0, 3.0]) * (i + 1)
        for _ in range(n_steps):
            y = w_dev * xgrad.tensor(c, device=jax.devices()[1])
            y.register_hook(lambda g, i=i: seen_by_hooks[i].append(g.detach().numpy()))
            loss = (w_cpu * c).sum() + y.sum().to(jax.devices()[0])
            loss.backward()

    run_threads(steps, n_threads)
    expected = n_steps * np.array([1.0, 2.0, 3.0]) * sum(range(1, n_threads + 1))
    np.testing.assert_array_equal(w_cpu.grad.numpy(), expected)
    np.testing.assert_array_equal(w_dev.grad.numpy(), expected)
    assert w_dev.grad.device == jax.devices()[1]
    for grads in seen_by_hooks:  # each hook saw its own graph's gradient
        assert len(grads) == n_steps
        np.testing.assert_array_equal(np.array(grads), np.ones((n_steps, 3)))


def test_post_accumulate_hooks_see_whole_sums_under_concurrency():
    w = xgrad.tensor(np.zeros(2), requires_grad=True)
    seen = []
    w.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.numpy()))

    def steps(i):
        for _ in range(20):
            (w * 1.0).sum().backward()

    run_threads(steps, 8)
    assert len(seen) == 160
    for value in seen:  # a sum of whole backwards, never a torn or lost update
        assert value[0] == value[1] and value[0] == int(value[0]) and 1 <= value[0] <= 160
    assert w.grad.tolist() == [160.0, 160.0]


class HookFailure(Exception):
    pass


def test_errors_in_one_threads_backward_stay_in_that_thread():
    outcomes = {}

    def one(i):
        x = xgrad.tensor([float(i)], device=jax.devices()[i % 2], requires_grad=True)
        y = x * 2.0
        if i % 2:
            y.register_hook(lambda g: (_ for _ in ()).throw(HookFailure(f"thread {i}")))
        for _ in range(5):
            try:
                y.sum().backward(retain_graph=True)
                outcomes.setdefault(i, []).append(x.grad.item())
            except HookFailure as exc:
                outcomes.setdefault(i, []).append(str(exc))

    run_threads(one, 8)
    for i in range(8):
        assert outcomes[i] == ([f"thread {i}"] * 5 if i % 2 else [2.0, 4.0, 6.0, 8.0, 10.0])


def failing_hook(g):
    raise HookFailure("raised on the worker")


def test_worker_error_reaches_caller_with_type_message_and_traceback():
    dev1 = jax.devices()[1]
    x = xgrad.tensor([1.0, 2.0], device=dev1, requires_grad=True)
    y = x.exp()
    y.register_hook(failing_hook)
    downstream = []
    x.register_hook(lambda g: downstream.append(thread_name()))
    z = (y * 3.0).sum()
    with pytest.raises(HookFailure, match="raised on the worker") as info:
        z.backward()
    frames = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert "failing_hook" in frames and "thread_main" in frames
    assert downstream == []  # nodes after the failing one never ran
    # The engine and the worker are healthy: the next backward runs on the same worker.
    x2 = xgrad.tensor([1.0, 2.0], dtype=jnp.float64, device=dev1, requires_grad=True)
    x2.register_hook(lambda g: downstream.append(thread_name()))
    (x2.exp() * 3.0).sum().backward()
    np.testing.assert_allclose(x2.grad.numpy(), 3.0 * np.exp([1.0, 2.0]), rtol=1e-12)
    assert downstream == [f"xgrad-autograd-cpu:{dev1.id}"]


def test_error_on_worker_while_caller_waits_on_other_branch():
    # One branch fails on the worker while the other runs on the caller: the call
    # raises once, after both sides stop, and the other branch's leaf gets no grad.
    dev0, dev1 = jax.devices()[:2]
    a = xgrad.tensor([1.0], requires_grad=True)
    b = xgrad.tensor([1.0], device=dev1, requires_grad=True)
    yb = b * 2.0
    yb.register_hook(failing_hook)
    loss = (a * 2.0).sum() * 0.0 + yb.sum().to(dev0)
    with pytest.raises(HookFailure):
        loss.backward()
    assert b.grad is None


FORK_SCRIPT = """
import json, multiprocessing, warnings
import xgrad

warnings.filterwarnings("ignore", message="os.fork")  # JAX's own warning about forking
ctx = multiprocessing.get_context("fork")


def in_child(target, *args):
    parent_end, child_end = ctx.Pipe()
    process = ctx.Process(target=target, args=(child_end, *args))
    process.start()
    answer = parent_end.recv() if parent_end.poll(20) else "no answer"
    process.join(5)
    if process.is_alive():  # a hung child must not outlive the test
        process.kill()
        process.join()
    return answer, process.exitcode


def fresh_backward(conn):
    x = xgrad.tensor([1.0, 2.0], device=jax.devices()[1], requires_grad=True)
    (x * x).sum().backward()
    conn.send(x.grad.tolist())


def reuse_backward(conn, loss, grad):
    # The graph and its root grad come from the parent: the child runs no JAX op
    # (JAX itself cannot run in a child forked after it started its own threads).
    try:
        loss.backward(grad)
        conn.send("no error")
    except RuntimeError as exc:
        conn.send(str(exc))


before = in_child(fresh_backward)  # no worker thread yet
x = xgrad.tensor([1.0, 2.0], device=jax.devices()[1], requires_grad=True)
loss = (x * x).sum()
grad = xgrad.ones_like(loss)
loss.backward(grad, retain_graph=True)  # starts the worker threads
after = in_child(reuse_backward, loss, grad)
loss.backward(grad)  # the parent is unaffected
print(json.dumps({"before": before, "after": after, "parent_grad": x.grad.tolist()}))
"""


def test_fork_before_worker_threads_is_fine_and_after_raises_in_the_child():
    # The forks happen in a script: the test process itself never forks with threads.
    result = run_json(FORK_SCRIPT, devices=2)
    assert result["before"] == [[2.0, 4.0], 0]
    message, exitcode = result["after"]
    assert message.startswith("Unable to handle autograd's threading in combination with fork-based multiprocessing")
    assert "forked after xgrad's autograd worker threads started" in message
    assert exitcode == 0
    assert result["parent_grad"] == [4.0, 8.0]


EXIT_SCRIPT = """
import threading, time
import xgrad

x = xgrad.tensor([1.0], device=jax.devices()[1], requires_grad=True)
(x * x).sum().backward()  # the workers are running
{extra}
"""

BUSY_WORKER = """
started = threading.Event()
def slow_hook(g):
    started.set()
    time.sleep(60)
y = x * 3.0
y.register_hook(slow_hook)
threading.Thread(target=lambda: y.sum().backward(), daemon=True).start()
started.wait()
"""


def test_interpreter_exits_cleanly_with_idle_workers():
    start = time.monotonic()
    result = run_script(EXIT_SCRIPT.format(extra=""), devices=4)
    assert result.stderr == ""
    assert time.monotonic() - start < 30


def test_interpreter_exit_waits_for_a_busy_worker_only_up_to_the_limit():
    start = time.monotonic()
    result = run_script(
        EXIT_SCRIPT.format(extra=textwrap.dedent(BUSY_WORKER)),
        devices=2,
        env={"XGRAD_AUTOGRAD_SHUTDOWN_WAIT_LIMIT": "0.5"},
    )
    assert time.monotonic() - start < 30  # not the hook's 60 s
    assert "Traceback" not in result.stderr
    assert "still busy at exit" in result.stderr
