"""The command line end to end: runs, traces, errors, crashes, determinism (via mpiexec)."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np
import pytest

from mpiemu.analysis import load
from mpiemu.analysis.load import TraceError
from tests.conftest import child_env, our_lines, run_mpi

SMALL = ["--set", 'collectives.sizes=["1KiB", "96KiB"]', "--set", "parallel.tp=2"]


def mpiemu(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mpiemu", *args], capture_output=True,
                          text=True, timeout=60, env=child_env())


def test_devices_lists_every_preset_with_sources() -> None:
    out = mpiemu("devices").stdout
    for name in ("t3-gpu", "mi210", "a100-sxm4-80gb", "h100-sxm5"):
        assert name in out
    assert "thesis Table 8.1" in out and "[ASSUMPTION]" in out


def test_collectives_run_writes_readable_complete_traces(tmp_path: Path) -> None:
    res = run_mpi(2, ["run", "workloads/collectives.toml", *SMALL, "--out", str(tmp_path)])
    assert res.returncode == 0, res.stderr
    assert "closed form" in res.stdout and "ring/simple" in res.stdout
    run = load(tmp_path)
    assert run.complete and len(run.ranks) == 2
    for rt in run.ranks:
        names = set(rt.names)
        assert {"reduce_scatter", "all_gather", "all_reduce", "rs.send", "rs.reduce"} <= names
        assert np.all(rt.events["t_end"] >= rt.events["t_start"])
    with h5py.File(tmp_path / "trace.h5") as f:          # merged virtual view
        assert f["events"].shape[0] == sum(len(r.events) for r in run.ranks)
        assert f["ranks/1"].attrs["rank"] == 1


def test_a_run_directory_holding_a_run_is_replaced_only_with_force(tmp_path: Path) -> None:
    """A second run into the same directory is refused (every rank exits 2, one line naming
    --out) and the first run stays whole; --force replaces it."""
    args = ["run", "workloads/collectives.toml", *SMALL, "--out", str(tmp_path)]
    assert run_mpi(2, args).returncode == 0
    first = (tmp_path / "manifest.json").read_text()
    res = run_mpi(2, args)
    lines = our_lines(res.stderr)
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr
    assert all("--out" in ln and "--force" in ln for ln in lines), lines
    assert (tmp_path / "manifest.json").read_text() == first and load(tmp_path).complete
    assert run_mpi(2, [*args, "--force"]).returncode == 0
    assert (tmp_path / "manifest.json").read_text() != first and load(tmp_path).complete


def test_same_workload_gives_identical_emulated_times(tmp_path: Path) -> None:
    cols = []
    for i in range(2):
        out = tmp_path / f"r{i}"
        assert run_mpi(2, ["run", "workloads/collectives.toml", *SMALL, "--out",
                           str(out)]).returncode == 0
        cols.append([(r.events["t_start"], r.events["t_end"]) for r in load(out).ranks])
    for (s0, e0), (s1, e1) in zip(*cols):
        assert np.array_equal(s0, s1) and np.array_equal(e0, e1)


@pytest.mark.parametrize("override, needle", [
    ("device.preset=nope", "device.preset='nope'"),
    ("parallel.tp=3", "parallel.tp*parallel.dp"),
    ("collectives.sizes=[-5]", "collectives.sizes[0]=-5"),
    ("collectives.bogus=1", "collectives.bogus=1"),
    ("network.topology=torus", "network.topology='torus'"),
    ("network.intra.bw_GBps=0", "bw=0"),
    ("network.intra.latency_s.simple=-1", "latency_simple=-1"),
])
def test_config_error_is_one_line_and_exits_nonzero(tmp_path: Path, override: str,
                                                    needle: str) -> None:
    t0 = time.monotonic()
    res = run_mpi(2, ["run", "workloads/collectives.toml", "--set", override, "--out",
                      str(tmp_path)], timeout=60)
    assert res.returncode != 0
    assert time.monotonic() - t0 < 30
    lines = our_lines(res.stderr)
    assert len(lines) == 1 and lines[0].startswith("mpiemu: error: ") and needle in lines[0]
    assert "Traceback" not in res.stderr + res.stdout


def test_failing_rank_ends_job_quickly_and_leaves_readable_traces(tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = run_mpi(2, ["run", "workloads/collectives.toml", *SMALL, "--set", "debug.fail_rank=1",
                      "--set", "debug.fail_iteration=2", "--out", str(tmp_path)], timeout=60)
    assert res.returncode != 0
    assert time.monotonic() - t0 < 30
    assert "rank 1 failed" in res.stderr
    run = load(tmp_path)
    assert len(run.ranks) == 2 and not run.complete
    assert all(not r.complete for r in run.ranks)
    assert run.manifest["status"] == "failed" and run.manifest["failed_rank"] == 1


def test_analyze_prints_rank_and_op_tables(tmp_path: Path) -> None:
    assert run_mpi(2, ["run", "workloads/collectives.toml", *SMALL, "--out",
                       str(tmp_path)]).returncode == 0
    out = mpiemu("analyze", str(tmp_path)).stdout
    assert "makespan" in out and "rs.reduce" in out


def test_analyze_of_missing_dir_is_one_line_error(tmp_path: Path) -> None:
    res = mpiemu("analyze", str(tmp_path / "none"))
    assert res.returncode == 2 and "does not exist" in res.stderr


def test_devices_per_node_that_does_not_divide_the_job_is_one_line(tmp_path: Path) -> None:
    res = run_mpi(4, ["run", "workloads/collectives.toml", "--set", "network.devices_per_node=3",
                      "--set", "network.preset=dgx-a100", "--out", str(tmp_path)], timeout=60)
    lines = our_lines(res.stderr)
    assert res.returncode != 0 and len(lines) == 1, res.stderr
    assert "network.devices_per_node=3" in lines[0] and "divisor of 4" in lines[0]


def test_analyze_shows_a_two_node_dp_all_reduce_bounded_by_its_nics(tmp_path: Path) -> None:
    """2 nodes x 4 devices, DP = 8: the all-reduce's busiest port is a NIC."""
    sets = ["device.preset=a100-sxm4-80gb", "network.devices_per_node=4", "parallel.tp=1",
            "parallel.dp=8", "collectives.group=dp", "collectives.ops=['all_reduce']",
            "collectives.sizes=['64MiB']", "run.numerics=off"]
    res = run_mpi(8, ["run", "workloads/collectives.toml", *(f"--set={s}" for s in sets),
                      "--out", str(tmp_path)], timeout=120)
    assert res.returncode == 0, res.stderr
    out = run_mpi(1, ["analyze", str(tmp_path)]).stdout
    assert "collectives bounded by: inter-node (NIC)" in out


def test_an_algorithm_the_network_cannot_run_is_one_line(tmp_path: Path) -> None:
    res = run_mpi(2, ["run", "workloads/collectives.toml", "--set", "parallel.tp=2", "--set",
                      "collectives.algorithm=nvls", "--out", str(tmp_path)], timeout=60)
    lines = our_lines(res.stderr)
    assert res.returncode != 0 and len(lines) == 1, res.stderr
    assert "collectives.algorithm='nvls'" in lines[0] and "can run ['ring']" in lines[0]


def test_a_failed_reference_check_exits_nonzero(tmp_path: Path) -> None:
    res = run_mpi(2, ["run", "workloads/quickstart.toml", "--set", "parallel.tp=2", "--set",
                      "parallel.dp=1", "--set", "run.iterations=1", "--set",
                      "train.reference_rtol=1e-300", "--out", str(tmp_path)], timeout=120)
    assert res.returncode == 3 and "FAIL" in res.stdout, res.stdout + res.stderr


def test_nan_never_passes_the_reference_check() -> None:
    from mpiemu.training.check import rel_err
    import numpy as np
    assert rel_err(np.array([1.0, np.nan]), np.array([1.0, 2.0])) == float("inf")
    assert rel_err(np.array([1.0, 2.0]), np.array([1.0, 2.0])) == 0.0


def _long_job(out: Path, started: Callable[[], bool]) -> Any:
    """A 2-rank quickstart that would run for hours, once `started()` (or 60 s) holds."""
    from tests.conftest import ROOT, mpiexec_path
    cmd = [mpiexec_path(), "-n", "2", sys.executable, "-m", "mpiemu", "run",
           "workloads/quickstart.toml", "--set", "parallel.tp=2", "--set", "parallel.dp=1",
           "--set", "run.iterations=100000", "--set", "train.check_reference=false",
           "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(MPIEXEC_TIMEOUT="120"), cwd=ROOT)
    deadline = time.monotonic() + 60
    while not started() and time.monotonic() < deadline:
        time.sleep(0.2)
    return proc


def test_sigint_to_the_launcher_ends_the_job_and_marks_it_interrupted(tmp_path: Path) -> None:
    import signal
    proc = _long_job(tmp_path, lambda: bool(list(tmp_path.glob("rank-*.h5"))))
    time.sleep(2.0)
    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 10 and proc.returncode != 0, err
    run = load(tmp_path, allow_incomplete=True)
    assert run.manifest["status"] == "interrupted" and len(run.ranks) == 2


@pytest.mark.parametrize("case", ["dir-workload", "utf8", "out-is-file", "out-unwritable",
                                  "out-too-long"])
def test_bad_paths_are_one_line_naming_the_argument(tmp_path: Path, case: str) -> None:
    workload, out, needle = "workloads/collectives.toml", str(tmp_path / "run"), ""
    if case == "dir-workload":
        workload, needle = "workloads", "workload='workloads': a .toml file"
    elif case == "utf8":
        bad = tmp_path / "bad.toml"
        bad.write_bytes(b"\xff\xfe garbage")
        workload, needle = str(bad), "a UTF-8 TOML file"
    elif case == "out-is-file":
        (tmp_path / "f").write_text("x")
        out, needle = str(tmp_path / "f"), "(this is a file)"
    elif case == "out-unwritable":
        out, needle = "/proc/mpiemu-run", "a directory we can create and write into"
    else:
        out, needle = str(tmp_path / ("x" * 300)), "a directory we can create and write into"
    res = run_mpi(2, ["run", workload, "--set", "parallel.tp=2", "--out", out], timeout=60)
    lines = our_lines(res.stderr)
    assert res.returncode == 2 and len(lines) == 1 and needle in lines[0], res.stderr


def _final_manifest(out: Path, wait_s: float = 5.0) -> dict[str, Any]:
    """The manifest once it no longer says `running` (the watchman may speak a little after
    the launcher has returned), or as it is after `wait_s`."""
    import json
    deadline = time.monotonic() + wait_s
    while True:
        manifest: dict[str, Any] = json.loads((out / "manifest.json").read_text())
        if manifest["status"] != "running" or time.monotonic() > deadline:
            return manifest
        time.sleep(0.1)


def _names_killed(stderr: str, rank: int) -> bool:
    """The job's stderr names `rank` as killed: the watchman's line (MPICH), or under Open
    MPI, whose forwarding may drop the watchman's line, the survivors' or mpirun's own."""
    return (f"mpiemu: rank {rank} killed without a word" in stderr
            or f"rank(s) [{rank}] had died" in stderr
            or f"noticed that process rank {rank} with PID" in stderr)


def test_sigkill_of_a_rank_ends_the_job_and_every_trace_still_opens(tmp_path: Path) -> None:
    """A rank killed outright: the launcher ends the job within seconds; committed events
    (part files, `sim.trace`) of every rank read back; the manifest names the killed rank."""
    import os
    import signal
    proc = _long_job(tmp_path, lambda: len(list(tmp_path.glob("rank-00001.h5.part-*"))) >= 2)
    ranks = []                  # the Python processes of this job (not mpiexec, not hydra)
    for pid in subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True,
                              text=True).stdout.split():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].decode() == sys.executable and b"mpiemu" in argv:
            ranks.append(int(pid))
    assert len(ranks) == 2, ranks
    os.kill(max(ranks), signal.SIGKILL)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 10 and proc.returncode != 0
    manifest = _final_manifest(tmp_path)
    from mpiemu.runner.watch import exact
    if exact():                 # the watchman names the killed rank (runner/watch.py)
        assert manifest["status"] == "failed" and manifest["failed_rank"] == 1, manifest
        assert _names_killed(err, 1), err[-1500:]
    run = load(tmp_path, allow_incomplete=True)
    assert len(run.ranks) == 2 and all(len(r.events) > 0 for r in run.ranks)
    res = run_mpi(1, ["analyze", str(tmp_path), "--allow-incomplete"])
    assert res.returncode == 0 and "Traceback" not in res.stderr


def test_slurm_template_runs_as_shipped_with_a_stand_in_srun(tmp_path: Path) -> None:
    """launch/slurm.sbatch, with Slurm's variables set and `srun` played by mpiexec, runs and
    analyses a workload: the template cannot rot without this failing."""
    import os
    import subprocess
    import sys
    from tests.conftest import ROOT, child_env, mpiexec_path
    if Path(sys.executable).parent != ROOT / ".venv" / "bin":
        pytest.skip("the template sources the repository's .venv; this is another Python")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text(f"#!/bin/bash\nshift\nexec {mpiexec_path()} -n $SLURM_NTASKS "
                               "\"$@\"\n")
    (fake / "srun").chmod(0o755)
    env = child_env(PATH=f"{fake}:{Path(sys.executable).parent}:{os.environ['PATH']}",
                    SLURM_NTASKS="2", SLURM_NTASKS_PER_NODE="2", SLURM_JOB_ID=tmp_path.name,
                    SLURM_JOB_NAME="mpiemu-test", SLURM_CPUS_PER_TASK="1")
    import shutil
    for args in (["workloads/collectives.toml", "--set", "collectives.sizes=['4KiB']", "--set",
                  "run.numerics=off", "--set", "parallel.tp=2"],
                 # the workload's own layout, folded: 2 tasks stand for its 8 GPUs
                 ["workloads/pipeline-small.toml", "--set", "run.numerics=off", "--set",
                  "train.check_reference=false", "--set", "run.iterations=1"]):
        res = subprocess.run(["bash", "launch/slurm.sbatch", *args], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-1500:]
        assert "collectives bounded by" in res.stdout or "makespan" in res.stdout
        shutil.rmtree(ROOT / "runs" / f"mpiemu-test-{tmp_path.name}", ignore_errors=True)


def _kill_everything(out: Path, watchman: bool) -> None:
    """SIGKILL every rank of a long job (and its watchman too if asked), as the OOM killer
    or a node failure would."""
    import json
    import os
    import signal
    proc = _long_job(out, lambda: len(list(out.glob("rank-00001.h5.part-*"))) >= 2)
    pids = [pid for _, pid in json.loads((out / "manifest.json").read_text())["processes"]]
    assert len(pids) == 2
    if watchman:
        found = subprocess.run(["pgrep", "-f", f"mpiemu.runner.watch {out}"], capture_output=True,
                               text=True).stdout.split()
        assert len(found) == 1, found
        os.kill(int(found[0]), signal.SIGKILL)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=30)


def test_sigkill_of_every_rank_is_marked_failed_by_the_watchman(tmp_path: Path) -> None:
    import json
    _kill_everything(tmp_path, watchman=False)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        manifest = json.loads((tmp_path / "manifest.json").read_text())
        if manifest["status"] != "running":
            break
        time.sleep(0.2)
    assert manifest["status"] == "failed" and manifest["failed_rank"] in (0, 1), manifest
    run = load(tmp_path, allow_incomplete=True)
    assert len(run.ranks) == 2 and all(len(r.events) > 0 for r in run.ranks)


def test_a_run_killed_with_its_watchman_reads_as_killed(tmp_path: Path) -> None:
    """Nobody left to write the manifest: readers see `running` with no live process."""
    import json
    _kill_everything(tmp_path, watchman=True)
    assert json.loads((tmp_path / "manifest.json").read_text())["status"] == "running"
    with pytest.raises(TraceError, match="none of its 2 processes is alive"):
        load(tmp_path)
    run = load(tmp_path, allow_incomplete=True)
    assert run.manifest["status"] == "killed" and len(run.ranks) == 2
    res = run_mpi(1, ["analyze", str(tmp_path), "--allow-incomplete"])
    assert res.returncode == 0 and "status=killed" in res.stdout


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("fail_at, at_rank", [("start", "last"), ("collective", "last"),
                                              ("flush", "first"), ("sigkill", "first"),
                                              ("sigkill", "last")])
def test_injected_faults_end_the_job_promptly_and_leave_readable_traces(
        tmp_path: Path, ranks: int, fail_at: str, at_rank: str) -> None:
    """A raise at an iteration's start, inside a collective (the rank's next message) or
    inside a trace flush, or SIGKILL of rank 0 or the last rank: the job ends within 10 s,
    non-zero, naming the failing rank (a raise); the manifest says `failed`; every rank's
    trace opens and `analyze --allow-incomplete` reads the directory."""
    rank = 0 if at_rank == "first" else ranks - 1
    t0 = time.monotonic()
    res = run_mpi(ranks, ["run", "workloads/quickstart.toml", "--set", f"parallel.tp={ranks}",
                          "--set", "parallel.dp=1", "--set", "model.heads=8",
                          "--set", "run.iterations=3", "--set", "train.check_reference=false",
                          "--set", f"debug.fail_rank={rank}", "--set", "debug.fail_iteration=1",
                          "--set", f"debug.fail_at='{fail_at}'", "--out", str(tmp_path)],
                  timeout=60)
    assert res.returncode != 0 and time.monotonic() - t0 < 10 + 5, res.stderr[-800:]
    if fail_at != "sigkill":
        assert f"mpiemu: rank {rank} failed" in res.stderr, res.stderr[-1500:]
    manifest = _final_manifest(tmp_path)
    assert manifest["status"] == "failed"
    if fail_at == "sigkill":
        # the killed rank cannot speak: the watchman names the rank that died first, exactly
        # where the kernel's exit events reach it (root or CAP_NET_ADMIN), else among those
        # found dead together (runner/watch.py); under Open MPI the survivors name it too
        from mpiemu.runner.watch import exact
        if exact():
            assert manifest["failed_rank"] == rank, manifest
            assert _names_killed(res.stderr, rank), res.stderr[-1500:]
        else:
            assert f"{rank}" in manifest["cause"], manifest
    run = load(tmp_path, allow_incomplete=True)
    assert len(run.ranks) == ranks
    out = run_mpi(1, ["analyze", str(tmp_path), "--allow-incomplete"])
    assert out.returncode == 0 and "Traceback" not in out.stderr


def test_quiet_log_interval_and_heartbeat(tmp_path: Path) -> None:
    """--log-interval prints every N-th iteration line and the last; --quiet the last only;
    --heartbeat prints progress lines inside the iterations (rank 0)."""
    def iteration_lines(*flags: str) -> tuple[list[int], list[str]]:
        res = run_mpi(2, ["run", "workloads/quickstart.toml", "--set", "parallel.dp=1",
                          "--set", "run.iterations=5", "--out", str(tmp_path / "r"), "--force",
                          *flags])
        assert res.returncode == 0, res.stderr
        its = [int(ln.split()[0]) for ln in res.stdout.splitlines()
               if re.match(r"^\s+\d+\s", ln) and "of stage" not in ln]
        beats = [ln for ln in res.stdout.splitlines() if "passes of stage" in ln]
        return its, beats
    assert iteration_lines()[0] == [0, 1, 2, 3, 4]
    assert iteration_lines("--log-interval", "2")[0] == [0, 2, 4]
    assert iteration_lines("--quiet")[0] == [4]
    its, beats = iteration_lines("--quiet", "--heartbeat", "1e-9")
    assert its == [4] and beats and all("iteration" in b for b in beats)


def test_a_terminal_gets_a_progress_bar_redrawn_in_place(tmp_path: Path) -> None:
    """On a terminal (one process, no mpiexec piping its output) the heartbeat is a bar
    redrawn with carriage returns, cleared before each iteration line."""
    import os
    import pty
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "mpiemu", "run", "workloads/quickstart.toml",
                             "--set", "parallel.dp=1", "--set", "parallel.tp=1", "--set",
                             "run.iterations=2", "--out",
                             str(tmp_path / "r"), "--heartbeat", "1e-9"],
                            stdout=slave, stderr=subprocess.PIPE, env=child_env(),
                            cwd=Path(__file__).resolve().parents[1])
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:         # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=120) == 0, proc.stderr.read() if proc.stderr else ""
    text = b"".join(chunks).decode()
    assert "passes of stage 0" in text and "\r     iteration 0 [" in text
    bars = [ln for ln in text.split("\r") if ln.startswith("     iteration 1 [")]
    assert bars and all("\n" not in b for b in bars)       # redrawn in place, never a line
    assert "\r\x1b[K   1 " in text          # the bar cleared before iteration 1's line


def test_bash_completion_completes_subcommands_options_and_names() -> None:
    """`eval "$(mpiemu completion)"` defines a completion that knows the subcommands, each
    one's options and the bundled workloads."""
    import shutil
    import subprocess
    import sys
    if shutil.which("bash") is None:
        pytest.skip("no bash here")
    script = subprocess.run([sys.executable, "-m", "mpiemu", "completion"], capture_output=True,
                            text=True, check=True).stdout

    def complete(*words: str) -> set[str]:
        arr = " ".join(f"'{w}'" for w in words)
        res = subprocess.run(["bash", "-c", f'{script}\nCOMP_WORDS=({arr}); '
                              f'COMP_CWORD={len(words) - 1}; _mpiemu; echo "${{COMPREPLY[@]}}"'],
                             capture_output=True, text=True, check=True, cwd="/")
        return set(res.stdout.split())
    assert {"run", "report"} <= complete("mpiemu", "r")
    assert "quickstart" in complete("mpiemu", "run", "quick")
    assert "--ranks" in complete("mpiemu", "export", "x", "--ra")
    assert "t3" in complete("mpiemu", "report", "t")


def test_every_argument_of_every_subcommand_has_help() -> None:
    from mpiemu.cli import build_parser
    from mpiemu.completion import _subparsers
    for name, sp in _subparsers(build_parser()).items():
        for action in sp._actions:
            assert action.help, f"mpiemu {name}: {action.dest} has no help"
