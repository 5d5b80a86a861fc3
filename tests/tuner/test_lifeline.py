"""Children end with the tuning process and not before: the kernel ties a child's parent-death
signal to the thread that started it, so every compile-pool process and GPU worker is started
from the process's one lasting thread, whichever thread asks (a workload's loop, a measuring
thread, both of which end long before the process)."""
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from fakes import abort_on_block_m_32
from test_reliability import _alive
from tritune.schedules.config import Config
from tritune.tuner.builder import Builder
from tritune.tuner.worker.lifeline import start_lasting

TESTS = Path(__file__).parents[1]


class AbortingBuilder(Builder):
    build = staticmethod(abort_on_block_m_32)


def in_thread_that_ends(fn):
    """Run fn in a thread and return once the kernel is done with that thread (its children's
    parent-death signals, if any, are sent by then)."""
    thread = threading.Thread(target=fn)
    thread.start()
    task = Path(f"/proc/self/task/{thread.native_id}")
    thread.join()
    for _ in range(1000):  # the kernel reaps an ended thread within moments of its last Python line
        if not task.exists():
            return
        time.sleep(0.01)
    raise AssertionError(f"thread {thread.native_id} still known to the kernel")


def test_a_pool_replaced_after_a_compiler_crash_outlives_the_threads_that_replaced_and_filled_it():
    builder = AbortingBuilder(target=None, workers=1)
    try:
        def measuring():  # a measuring thread finds the pool dead and replaces it
            configs = [Config.of(BLOCK_M=m) for m in (32, 64)]
            [builder.result(f, c) for c, f in zip(configs, builder.submit("expr", "problem", configs))]

        def looping():  # the tuning loop's next round starts the new pool's process
            again = Config.of(BLOCK_M=16)
            assert builder.result(builder.submit("expr", "problem", [again])[0], again).status is None

        broken = builder._pool
        in_thread_that_ends(measuring)
        in_thread_that_ends(looping)
        assert builder._pool is not broken
        pids = set(builder._pool._processes)
        assert len(pids) == 1 and builder.background(os.getpid).result(60) in pids  # alive: not killed with them
    finally:
        builder.close(now=True)


def test_the_one_lasting_thread_runs_what_any_thread_hands_it():
    names = []
    in_thread_that_ends(lambda: names.append(start_lasting(lambda: threading.current_thread().name)))
    assert names == [start_lasting(lambda: threading.current_thread().name)] == ["tritune-child-starter"]
    assert start_lasting(lambda: start_lasting(lambda: 7)) == 7  # asked from itself, it runs it at once


def test_a_pool_started_from_a_thread_that_ended_still_ends_with_its_parent():
    code = ("import os, sys, threading, time\nsys.path.insert(0, %r)\n"
            "from tritune.tuner.builder import Builder\n"
            "b = Builder(None, workers=2)\n"
            "t = threading.Thread(target=lambda: [f.result() for f in [b.background(time.sleep, 0.2) for _ in range(2)]])\n"
            "t.start(); t.join()\n"
            "print(*b._pool._processes, flush=True); time.sleep(600)\n") % str(TESTS)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    children = [int(p) for p in proc.stdout.readline().split()]
    assert len(children) == 2 and all(_alive(pid) for pid in children)
    proc.kill()
    proc.wait()
    for _ in range(500):
        if not any(_alive(pid) for pid in children):
            break
        time.sleep(0.01)
    assert not any(_alive(pid) for pid in children)


def test_a_child_that_leaves_at_once_leaves_no_semaphore_to_the_resource_tracker(tmp_path):
    """`leave` skips the interpreter's teardown, not multiprocessing's: a lock a library made and
    kept in a GPU worker (tqdm's, when torch.fx runs a graph) is cleaned up, and the resource
    tracker has nothing to warn of after the parent's last line."""
    script = tmp_path / "parent.py"  # spawn finds the child's function by importing its file
    script.write_text(
        "import multiprocessing as mp, sys\nsys.path.insert(0, %r)\n"
        "from tritune.tuner.worker.lifeline import leave\n"
        "def child():\n"
        "    import multiprocessing\n"
        "    child.kept = multiprocessing.RLock()\n"
        "    leave()\n"
        "if __name__ == '__main__':\n"
        "    ctx = mp.get_context('spawn')\n"
        "    own = ctx.Lock()  # the parent uses the tracker too, as its pool's queues do\n"
        "    p = ctx.Process(target=child)\n"
        "    p.start(); p.join()\n"
        "    print('child exit', p.exitcode)\n" % str(TESTS.parent))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "child exit 0", (done.stdout, done.stderr)
    assert "leaked semaphore" not in done.stderr, done.stderr
