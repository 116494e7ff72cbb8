"""`cgtune fleet run --address` joins a Ray cluster that was running before it and leaves it running: a head started
with `ray start --head` (its own process group, 2 CPUs, a short temp dir), the fleet run from another process, the
deployment's tasks on that cluster's worker processes, and the cluster still there after. One tiny deployment on the
cpu kind (profiled for real on the CPU, searched on a hand-made profile with graph rows: a test fixture)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_fleet_ray's catalogue writer
from test_fleet_ray import WIDTHS, write_catalogue  # noqa: E402

RAY = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cgtune(*args: object, env: dict[str, str], timeout: float) -> tuple[int, int, str]:
    """(its pid, exit status, stdout + stderr) of a cgtune command in a process of its own."""
    proc = subprocess.Popen([sys.executable, "-c", "from tuner.cli import main; raise SystemExit(main())",
                             *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=env)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return proc.pid, proc.returncode, out


@pytest.mark.skipif(RAY is None, reason="Ray's `ray` command is not installed (the fleet extra)")
@pytest.mark.slow
def test_fleet_run_joins_a_running_cluster_by_address_and_leaves_it_running(tmp_path: Path) -> None:
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="/tmp/rayt")  # Ray's socket paths must stay short
    # Ray 2.60 turns token authentication on for a `ray start` cluster; a test's cluster on loopback does without.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    head = subprocess.Popen([RAY, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                             "--num-cpus", "2", "--num-gpus", "0",
                             "--include-dashboard=false", "--temp-dir", temp, "--block"],
                            stdout=(tmp_path / "head.log").open("w"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    try:
        catalogue = write_catalogue(tmp_path / "c", ("tiny-a",), trials=0, validate_steps=0)
        address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:  # the head is up when a client can read its nodes
            probe = subprocess.run([sys.executable, "-c", f"import ray; ray.init(address={address!r}, "
                                    "log_to_driver=False); print(len(ray.nodes()))"],
                                   capture_output=True, text=True, timeout=120, env=env)
            if probe.returncode == 0 and probe.stdout.strip().endswith("1"):
                break
            assert head.poll() is None and time.monotonic() < deadline, (tmp_path / "head.log").read_text()[-3000:]
            time.sleep(2)
        driver, code, out = _cgtune("fleet", "run", catalogue, "--address", address, "--poll", "0.2", env=env,
                                    timeout=420)
        assert code == 0, out[-4000:]
        index = json.loads((catalogue.parent / "results" / "index.json").read_text())
        (entry,) = index["deployments"]
        assert entry["status"] == "done" and entry["widths_done"] == WIDTHS, entry
        status = json.loads((catalogue.parent / "results" / "deployments" / "tiny-a" / "status.json").read_text())
        # The profile ran in one of that cluster's worker processes, not in the fleet's own.
        log = [json.loads(line) for line in (catalogue.parent / "results" / "deployments" / "tiny-a" / "profile" /
                                              "measured.jsonl").read_text().splitlines()]
        assert status["state"] == "done" and log and all(rec["pid"] not in (driver, os.getpid()) for rec in log)
        assert head.poll() is None, "the fleet run stopped a cluster it had only joined"
        after = subprocess.run([sys.executable, "-c", f"import ray; ray.init(address={address!r}, "
                                "log_to_driver=False); print(sum(n['Alive'] for n in ray.nodes()))"],
                               capture_output=True, text=True, timeout=120, env=env)
        assert after.returncode == 0 and after.stdout.strip().endswith("1"), after.stderr[-2000:]
    finally:
        for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(head.pid, sig)
            except ProcessLookupError:
                break
            end = time.monotonic() + wait_s
            while time.monotonic() < end and head.poll() is None:
                time.sleep(0.2)
        shutil.rmtree(temp, ignore_errors=True)
