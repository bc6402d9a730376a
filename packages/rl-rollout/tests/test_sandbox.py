"""The sandboxed Python tool: every escape attempt is stopped or refused and reported, and the
host is left as it was (no processes, no temp dir, files outside untouched)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from rl_rollout.tools import TOOLS, PythonSandboxTool, SandboxConfig, run_python

REPO_FILE = Path(__file__).resolve()


def _session_members(session_id: int) -> list[str]:
    """Processes (zombies included) still in the run's session: what a run leaves behind."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()  # state ppid pgrp session ...
            if int(fields[3]) == session_id:
                found.append(stat)
    return found


_ISOLATION: tuple[str, ...] | None = None


def isolation() -> tuple[str, ...]:
    """The kernel mechanisms a run gets on this machine (they depend on privileges)."""
    global _ISOLATION
    if _ISOLATION is None:
        _ISOLATION = run_python("pass", SandboxConfig(python_guards=False)).isolation
    return _ISOLATION


def assert_host_clean(result) -> None:
    assert not Path(result.work_dir).exists(), "the throw-away work dir must be deleted"
    assert _session_members(result.session_id) == [], "the run left processes behind"


def test_runs_code_and_returns_output():
    code = "import json, math\nprint(json.dumps({'pi': round(math.pi, 3)}))\nprint('err', file=__import__('sys').stderr)"
    result = run_python(code)
    assert result.ok and result.exit_code == 0 and result.killed is None
    assert result.stdout == '{"pi": 3.142}\n' and result.stderr == "err\n"
    assert "exit status: 0" in result.to_text() and '{"pi": 3.142}' in result.to_text()
    assert_host_clean(result)


def test_work_dir_is_writable_and_thrown_away():
    code = "import os\nopen('a.txt', 'w').write('hi')\nprint(open('a.txt').read(), os.listdir('.'))"
    result = run_python(code)
    assert result.stdout == "hi ['a.txt']\n"
    assert_host_clean(result)


def test_exception_reports_the_users_traceback():
    result = run_python("def f():\n    return 1 / 0\nf()\n")
    assert result.exit_code == 1 and result.killed is None
    assert 'File "<sandbox>", line 2, in f' in result.stderr
    assert "ZeroDivisionError: division by zero" in result.stderr
    assert "sandbox_bootstrap" not in result.stderr


def test_infinite_loop_is_killed_at_the_wall_clock_limit():
    start = time.monotonic()
    result = run_python("while True:\n    pass\n", SandboxConfig(timeout_s=1.5))
    assert result.killed == "wall-clock timeout (1.5 s)"
    assert result.exit_code == -9 and not result.ok
    assert 1.4 < time.monotonic() - start < 6
    assert "killed: wall-clock timeout" in result.to_text()
    assert_host_clean(result)


def test_cpu_time_limit_stops_a_busy_loop():
    result = run_python("while True:\n    pass\n", SandboxConfig(timeout_s=20, cpu_time_s=1))
    assert result.killed == "cpu time limit (1 s)"
    assert "rlimit-cpu" in result.isolation
    assert result.duration_s < 10
    assert_host_clean(result)


def test_fork_bomb_is_refused():
    code = "import os\nwhile True:\n    os.fork()\n"
    result = run_python(code, SandboxConfig(timeout_s=5))
    assert result.exit_code == 1 and result.killed is None
    assert "PermissionError: sandbox: creating processes is not allowed" in result.stderr
    subprocess_code = "import subprocess\nsubprocess.run(['ls', '/'])\n"
    result2 = run_python(subprocess_code)
    assert "creating processes is not allowed" in result2.stderr
    assert_host_clean(result)


def test_process_count_is_capped_by_the_kernel_without_python_guards():
    """With the audit hook off, the pids cgroup / RLIMIT_NPROC still caps the process count
    and every child dies with the run."""
    code = (
        "import os, time\nn = 0\nfor i in range(64):\n    try:\n        pid = os.fork()\n"
        "    except OSError as e:\n        print('refused', e.errno, flush=True)\n        break\n"
        "    if pid == 0:\n        time.sleep(120)\n        os._exit(0)\n    n += 1\n"
        "print('children', n, flush=True)\ntime.sleep(120)\n"
    )
    if not {"cgroup-pids", "rlimit-nproc"} & set(isolation()):
        pytest.skip("no kernel process limit here (root without a writable pids cgroup)")
    config = SandboxConfig(timeout_s=3, max_processes=6, python_guards=False)
    result = run_python(code, config)
    assert "cgroup-pids" in result.isolation or "rlimit-nproc" in result.isolation
    assert "refused 11" in result.stdout  # EAGAIN: the kernel refused the 7th process
    children = int(result.stdout.split("children ")[1].split()[0])
    # the worker plus 5 children = max_processes (RLIMIT_NPROC counts all of the user's tasks,
    # so there the bound is looser)
    assert children == 5 if "cgroup-pids" in result.isolation else 0 <= children <= 5
    assert result.killed == "wall-clock timeout (3 s)"
    assert_host_clean(result)


def test_huge_allocation_hits_the_memory_limit():
    result = run_python("x = bytearray(8 * 2**30)\n", SandboxConfig(memory_mb=256))
    assert result.exit_code == 1
    assert "MemoryError: the sandbox memory limit (256 MiB) was reached" in result.stderr
    result2 = run_python("x = [bytes(2**20) for _ in range(4096)]\n", SandboxConfig(memory_mb=256))
    assert "MemoryError" in result2.stderr
    assert_host_clean(result2)


@pytest.mark.parametrize("target", ["/etc/passwd", str(REPO_FILE)])
def test_reading_outside_the_work_dir_is_refused(target):
    result = run_python(f"print(open({target!r}).read())")
    assert result.stdout == "" and result.exit_code == 1
    assert f"PermissionError: sandbox: reading {target!r} is not allowed" in result.stderr
    listing = run_python(f"import os\nprint(os.listdir({os.path.dirname(target)!r}))")
    assert "is not allowed (os.listdir)" in listing.stderr
    assert_host_clean(result)


def test_symlink_out_of_the_work_dir_is_refused():
    code = "import os\nos.symlink('/etc/passwd', 'p')\nprint(open('p').read())"
    result = run_python(code)
    assert "reading 'p' is not allowed" in result.stderr and result.stdout == ""


def test_writing_outside_the_work_dir_is_refused_and_the_file_is_untouched(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    before = victim.stat().st_mtime_ns
    for code in (
        f"open({str(victim)!r}, 'w').write('owned')",
        f"import os\nos.remove({str(victim)!r})",
        f"import os\nos.rename({str(victim)!r}, 'stolen')",
        f"import pathlib\npathlib.Path({str(tmp_path / 'new.txt')!r}).write_text('x')",
    ):
        result = run_python(code)
        assert result.exit_code == 1 and "is not allowed" in result.stderr, code
    assert victim.read_text() == "original" and victim.stat().st_mtime_ns == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim.txt"]


def test_network_socket_is_refused():
    result = run_python("import socket\nsocket.create_connection(('127.0.0.1', 80), timeout=1)")
    assert result.exit_code == 1
    assert "network access is not allowed in the sandbox" in result.stderr


def test_network_namespace_blocks_connections_without_python_guards():
    """With the audit hook off, the empty network namespace still keeps the code from
    reaching a server listening on the host's loopback."""
    if not {"netns", "userns+netns"} & set(isolation()):
        pytest.skip("the kernel does not permit network namespaces here (audit hook only)")
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(4)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        with contextlib.suppress(OSError):
            accepted.append(server.accept())

    thread = threading.Thread(target=accept)
    thread.start()
    code = (
        "import socket\ntry:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('connected')\n"
        "except OSError as e:\n    print('failed', e.errno)\n"
    )
    result = run_python(code, SandboxConfig(python_guards=False))
    thread.join()
    server.close()
    assert {"netns", "userns+netns"} & set(result.isolation), result.isolation
    assert result.stdout.startswith("failed") and accepted == []


def test_printing_gigabytes_is_cut_at_the_output_cap():
    code = "import sys\nwhile True:\n    sys.stdout.write('x' * 1_000_000)\n"
    start = time.monotonic()
    result = run_python(code, SandboxConfig(max_output_bytes=10_000, timeout_s=30))
    assert result.killed == "output limit (10000 bytes per stream)"
    assert result.stdout == "x" * 10_000 and result.stdout_truncated
    assert time.monotonic() - start < 10
    assert "[output truncated]" in result.to_text()
    assert_host_clean(result)


def test_site_packages_are_importable_only_when_allowed():
    code = (
        "import jsonschema\nprint(jsonschema.Draft202012Validator({'type': 'integer'}).is_valid(3))"
    )
    denied = run_python(code)
    assert "ModuleNotFoundError: No module named 'jsonschema'" in denied.stderr
    allowed = run_python(code, SandboxConfig(allow_site_packages=True))
    assert allowed.ok and allowed.stdout == "True\n", allowed.stderr


def test_file_size_limit():
    result = run_python(
        "open('big', 'wb').write(b'x' * 3 * 2**20)", SandboxConfig(max_file_size_mb=1)
    )
    assert result.exit_code == 1 and "File too large" in result.stderr


def test_native_code_through_ctypes_is_refused():
    result = run_python("import ctypes\nprint(ctypes.CDLL(None).getpid())")
    assert result.exit_code == 1 and "ctypes is not allowed" in result.stderr


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match=r"SandboxConfig.timeout_s=0 is invalid"):
        run_python("pass", SandboxConfig(timeout_s=0))
    with pytest.raises(
        ValueError, match=r"SandboxConfig.memory_mb=1 is invalid: expected an integer >= 32"
    ):
        SandboxConfig(memory_mb=1).validate()


def test_python_tool_from_the_registry_runs_concurrently():
    tool = TOOLS.build("python", config={"timeout_s": 5}, max_concurrency=2)
    assert isinstance(tool, PythonSandboxTool)
    assert tool.schema.to_openai()["function"]["parameters"]["required"] == ["code"]

    async def main():
        codes = [f"import time\ntime.sleep(0.5)\nprint({i} * {i})" for i in range(4)]
        return await asyncio.gather(*(tool.execute({"code": c}) for c in codes))

    start = time.monotonic()
    results = asyncio.run(main())
    elapsed = time.monotonic() - start
    assert [r.text.splitlines()[-1] for r in results] == ["0", "1", "4", "9"]
    assert all(not r.is_error for r in results)
    assert 1.0 <= elapsed < 4  # 4 runs of 0.5 s, two at a time
