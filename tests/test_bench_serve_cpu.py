"""``geograph bench serve``'s CPU split: the server's processes told apart by how LitServe starts them,
and the phase's CPU by part."""

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import require

require("psutil")

from geograph.bench.serve.cpu import CpuMeter, roles, split  # noqa: E402

#: a process tree started the way LitServe starts a server's: the queue manager forked, the metrics
#: logger and the inference workers spawned, the HTTP front forked after them
TREE = textwrap.dedent(
    """
    import json, multiprocessing as mp, sys, time

    def idle():
        time.sleep(60)

    if __name__ == "__main__":
        fork, spawn = mp.get_context("fork"), mp.get_context("spawn")
        started = {}
        for role, ctx in [("manager", fork), ("logger", spawn), ("worker", spawn), ("worker", spawn), ("front", fork)]:
            p = ctx.Process(target=idle, daemon=True)
            p.start()
            started.setdefault(role, []).append(p.pid)
            time.sleep(0.1)  # create times a clock tick apart
        print(json.dumps(started), flush=True)
        sys.stdin.read()
    """
)


@pytest.fixture
def tree(tmp_path):
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        started = json.loads(proc.stdout.readline())
        yield proc.pid, started
    finally:
        proc.stdin.close()
        proc.wait(30)


def test_the_server_processes_are_told_apart_by_how_they_were_started(tree):
    root, started = tree
    got = roles(root, workers=2)
    assert sorted(pid for pid, role in got.items() if role == "workers") == sorted(started["worker"])
    assert [pid for pid, role in got.items() if role == "front"] == started["front"]
    for pid in [root, *started["manager"], *started["logger"]]:
        assert got[pid] == "server_other"


def test_a_meter_counts_this_process_as_the_clients_and_the_machine_at_least_as_much():
    meter = CpuMeter(None, 0)
    meter.start()
    sum(i * i for i in range(3_000_000))  # some CPU in this process
    used = meter.stop()
    assert used["clients"] > 0.05
    assert used["machine"] >= 0.9 * used["clients"]
    assert used["workers"] == used["front"] == 0.0


def test_the_split_names_each_part_and_caps_the_encoding_at_the_workers_time():
    used = {"clients": 1.0, "front": 2.0, "workers": 3.0, "server_other": 0.5, "machine": 7.0, "wall": 5.0}
    r = split(used, texts=1000, cpu_per_text=0.01, cpus=2)  # 10 s of encoding estimated, 3 s used
    assert r["seconds"]["workers_encode"] == 3.0 and r["seconds"]["workers_other"] == 0.0
    assert r["seconds"]["outside"] == pytest.approx(0.5)
    assert r["idle_share"] == pytest.approx(0.3)
