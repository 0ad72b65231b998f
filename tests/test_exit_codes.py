"""Every run-time failure of the CLI ends in one line and a documented exit code (issue 11,
defect 8); ``--debug`` keeps the traceback."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from cosparse import exits
from cosparse.config import ConfigError
from cosparse.data.errors import DataError
from cosparse.data.pool import WorkerExited
from cosparse.ps.client import PSAuthError, PSUnavailable
from cosparse.stall import StallError
from cosparse.supply.collaborative import SupplyFailure
from cosparse.train.checkpoint import CheckpointError
from cosparse.train.nonfinite import NonFiniteLoss

CLI = [sys.executable, "-m", "cosparse.cli"]


@pytest.mark.parametrize("error, code, what", [
    (ConfigError("unknown key 'data.x'"), 2, "error"),
    (DataError("a.txt:3:C1: not an integer"), 3, "data error"),
    (PSUnavailable(0, "tcp://127.0.0.1:1", "no reply for 4.1 s"), 4, "PS unavailable"),
    (PSAuthError(1, "tcp://127.0.0.1:2", 5, "bad MAC"), 4, "PS authentication failed"),
    (WorkerExited("data worker 0 (pid 7) exited with code -9"), 5, "data worker failed"),
    (SupplyFailure("worker stale-drop rate 0.9"), 5, "data worker failed"),
    (StallError("stall: the trainer waited 300 s for ..."), 6, "hang detected"),
    (CheckpointError("cannot write"), 7, "checkpoint error"),
    (OSError(errno.ENOSPC, "No space left on device"), 7, "disk full"),
    (NonFiniteLoss(3, float("nan"), 0, 3), 8, "non-finite loss"),
    (KeyboardInterrupt(), 130, "interrupted"),
    (exits.Terminated("SIGTERM"), 143, "terminated"),
    (ZeroDivisionError("division by zero"), 1, "internal error"),
])
def test_each_failure_is_one_line_with_its_code(capsys, error, code, what):
    def body() -> int:
        raise error

    assert exits.run_reported(body) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"cosparse: {what}"), err
    assert "Traceback" not in err


def test_debug_keeps_the_traceback(capsys):
    def body() -> int:
        raise ZeroDivisionError("division by zero")

    assert exits.run_reported(body, debug=True) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "--debug" in err


def _config(tmp_path, **over) -> str:
    cfg = {
        "data": {"reader": "synthetic", "batch_size": 256, "workers": 1,
                 "synthetic": {"num_features": 4, "num_dense": 3, "vocab_size": 5000,
                               "num_batches": 100000, "eval_batches": 1}},
        "model": {"kind": "dlrm", "bottom": [8, 4], "top": [8, 1]},
        "tables": [{"name": "t", "dim": 4, "features": ["C1", "C2", "C3", "C4"]}],
        "train": {"steps": 100000, "progress": False, "log_every": 1, "threads": 1},
    }
    for k, v in over.items():
        cfg[k] = {**cfg.get(k, {}), **v}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except OSError:
                continue
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_and_terminate_stop_cleanly(tmp_path, sig, code):
    """Ctrl-C or SIGTERM mid-run: one line, exit 130/143, and the data worker is stopped."""
    # a test run started in the background (`make test &`) ignores SIGINT, and so would the
    # trainer it starts: give the trainer Ctrl-C as a terminal would
    p = subprocess.Popen([*CLI, "train", "--config", _config(tmp_path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=tmp_path,  # (its runs/ there)
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 50
        while time.monotonic() < deadline:  # wait for the first trained step
            line = p.stdout.readline()
            if line.startswith("step "):
                break
        kids = _children(p.pid)
        p.send_signal(sig)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == code, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("cosparse: interrupted" if code == 130 else "cosparse: terminated"), err
    assert "Traceback" not in err
    time.sleep(0.5)
    assert not [k for k in kids if _alive(k)], "a child process outlived the trainer"


def test_unreachable_ps_exits_4_with_the_endpoint(tmp_path):
    cfg = _config(tmp_path, supply={"path": "ps-direct"},
                  store={"remote": {"embedded": False, "endpoints": ["tcp://127.0.0.1:9"],
                                    "timeout_s": 2.0, "heartbeat_s": 0.5}})
    p = subprocess.run([*CLI, "train", "--config", cfg], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert p.returncode == 4, p.stderr
    assert "cosparse: PS unavailable" in p.stderr and "127.0.0.1:9" in p.stderr
    assert "Traceback" not in p.stderr


def test_disk_full_while_checkpointing_exits_7_and_commits_nothing(tmp_path):
    """A file-size limit makes the checkpoint's writes fail as a full disk does (EFBIG instead
    of ENOSPC): exit 7, one line naming the step, and no committed or temporary checkpoint."""
    import resource

    cfg = _config(tmp_path, data={"workers": 0, "synthetic": {
        "num_features": 4, "num_dense": 3, "vocab_size": 50000, "num_batches": 10,
        "eval_batches": 1}}, train={"steps": 10, "log_every": 5,
                                    "checkpoint": {"dir": str(tmp_path / "ck"), "every": 5}})

    def small_files() -> None:  # in the child, before exec
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))

    p = subprocess.run([*CLI, "train", "--config", cfg], capture_output=True, text=True,
                       timeout=60, preexec_fn=small_files, cwd=tmp_path)
    assert p.returncode == 7, p.stderr
    assert p.stderr.startswith("cosparse: checkpoint error: writing the checkpoint of step 5")
    assert "Traceback" not in p.stderr
    assert os.listdir(tmp_path / "ck") == []


def test_checkpoint_onto_a_symlink_names_the_link_and_leaves_no_temp_dir(tmp_path):
    """A step directory that is a symbolic link (issue 32, item 13): exit 7, one line naming the
    link as the cause (not "free disk space"), the link's target untouched, and no
    ``.tmp-step_*`` left behind."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "step_00000005").symlink_to(target)
    cfg = _config(tmp_path, data={"workers": 0, "synthetic": {
        "num_features": 4, "num_dense": 3, "vocab_size": 5000, "num_batches": 10,
        "eval_batches": 1}}, train={"steps": 10, "log_every": 5,
                                    "checkpoint": {"dir": str(ck), "every": 5}})
    p = subprocess.run([*CLI, "train", "--config", cfg], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert p.returncode == 7, p.stderr
    assert p.stderr.startswith("cosparse: checkpoint error:"), p.stderr
    assert "step_00000005 is a symbolic link" in p.stderr and "disk space" not in p.stderr
    assert "Traceback" not in p.stderr
    assert sorted(os.listdir(ck)) == ["step_00000005"]  # no .tmp-step_* left
    assert os.listdir(target) == ["keep.txt"]


def test_checkpoint_os_error_names_the_cause_and_advises_by_errno():
    """Only a full disk or quota advises freeing space; another OSError names its code and path
    (issue 32, item 13)."""
    from cosparse.train.checkpoint import checkpoint_os_advice, checkpoint_os_error

    full = OSError(errno.ENOSPC, "No space left on device", "/ck/x")
    assert checkpoint_os_advice(full) == "free disk space"
    loop = OSError(errno.ELOOP, "Too many levels of symbolic links", "/ck/step_1")
    assert checkpoint_os_error(loop) == "ELOOP: Too many levels of symbolic links (/ck/step_1)"
    assert "disk space" not in checkpoint_os_advice(loop)


def test_report_now_prints_the_line_before_the_cleanup_and_only_once(capsys):
    """``report_now`` prints the failure's line at once (the CLI calls it before stopping the
    shards, issue 32 item 11); the final ``report`` then gives the exit code without a second
    line."""
    e = PSUnavailable(0, "tcp://127.0.0.1:9", "silent for 3.0 s")
    exits.report_now(e)
    first = capsys.readouterr().err
    assert first.startswith("cosparse: PS unavailable:") and first.count("\n") == 1
    assert exits.report(e) == 4
    assert capsys.readouterr().err == ""


def test_a_debug_command_run_in_process_leaves_report_now_without_traceback(capsys):
    """``run_reported(debug=True)`` sets ``report_now``'s debug only while its command runs: a
    later failure in the same process prints its one line, no traceback."""
    assert exits.run_reported(lambda: 0, debug=True) == 0
    exits.report_now(PSUnavailable(0, "tcp://127.0.0.1:9", "silent for 3.0 s"))
    assert capsys.readouterr().err.startswith("cosparse: PS unavailable:")


@pytest.mark.parametrize("signal_error, code", [(exits.Terminated("SIGTERM"), 143),
                                                (KeyboardInterrupt(), 130)])
def test_an_error_raised_while_a_signal_unwinds_is_the_signal(capsys, signal_error, code):
    """A signal's exception can land inside ``Condition.wait`` between its release and its
    re-acquire; the ``with`` block's exit then raises "cannot release un-acquired lock" (CI,
    stop 44). That error is reported as the signal (one line, its exit code), not as a bug."""
    exits.report_now(signal_error)
    capsys.readouterr()
    try:
        try:
            raise signal_error
        finally:
            raise RuntimeError("cannot release un-acquired lock")
    except RuntimeError as secondary:
        assert exits.report(secondary) == code
    err = capsys.readouterr().err
    assert "internal error" not in err and "un-acquired" not in err
