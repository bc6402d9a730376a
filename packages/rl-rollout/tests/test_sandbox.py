"""The sandboxed Python tool: ordinary code runs, limits hold, the backend in force is
reported, and the host is left as it was (no processes, no temp dir, files outside
untouched). The attacker's escapes are in test_sandbox_escapes.py.

The default backend here is bubblewrap: CI installs it, so under ``CI=true`` a missing
``bwrap`` fails these tests instead of skipping them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from rl_rollout.tools import (
    TOOLS,
    PythonSandboxTool,
    SandboxConfig,
    SandboxUnavailableError,
    run_python,
)
from rl_rollout.tools.sandbox import bubblewrap, sandbox_report, select_backend
from rl_rollout.tools.sandbox.cgroups import CgroupSupport
from rl_rollout.tools.sandbox.remote import SandboxServiceError
from rl_rollout.tools.sandbox.service import handle_run_code, start_in_thread

REPO_FILE = Path(__file__).resolve()
WEAK = SandboxConfig(backend="python-audit", allow_weak_isolation=True)


pytestmark = pytest.mark.usefixtures("require_bwrap")


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


FORK_CHILDREN = (
    "import os, time\nn = 0\nfor i in range(64):\n    try:\n        pid = os.fork()\n"
    "    except OSError as e:\n        print('refused', e.errno, flush=True)\n        break\n"
    "    if pid == 0:\n        time.sleep(120)\n        os._exit(0)\n    n += 1\n"
    "print('children', n, flush=True)\ntime.sleep(120)\n"
)


def test_process_count_is_capped_by_the_kernel_when_subprocesses_are_allowed():
    """With the audit hook off and process creation allowed, the cgroup / the user
    namespace's RLIMIT_NPROC still cap the task count and every child dies with the run."""
    config = SandboxConfig(
        timeout_s=3, max_processes=6, python_guards=False, allow_subprocesses=True
    )
    result = run_python(FORK_CHILDREN, config)
    assert result.backend == "bubblewrap"
    assert "refused 11" in result.stdout, result.stdout + result.stderr  # EAGAIN
    # the code's own task plus 5 children = max_processes
    assert "children 5" in result.stdout
    assert result.killed == "wall-clock timeout (3 s)"
    assert_host_clean(result)


def test_without_cgroups_the_process_cap_is_seccomp_or_rlimit_nproc(monkeypatch):
    """Where no cgroup hierarchy is writable the run says so. Process creation stays denied
    by seccomp; allowing it needs RLIMIT_NPROC, which (counted per user namespace) caps a
    fork bomb for a non-root host uid, and which the kernel does not apply to host root, so
    there the backend refuses allow_subprocesses."""
    monkeypatch.setattr(
        bubblewrap, "cgroup_support", lambda: CgroupSupport(None, {}, "cgroups switched off")
    )
    denied = run_python(FORK_CHILDREN, SandboxConfig(timeout_s=1, python_guards=False))
    assert not any(m.startswith("cgroup-") for m in denied.isolation)
    assert "refused 1\n" in denied.stdout and "children 0" in denied.stdout
    config = SandboxConfig(
        timeout_s=3, max_processes=6, python_guards=False, allow_subprocesses=True
    )
    if os.geteuid() == 0:
        with pytest.raises(SandboxUnavailableError, match="no writable cgroup hierarchy"):
            run_python(FORK_CHILDREN, config)
        return
    result = run_python(FORK_CHILDREN, config)
    assert "rlimit-nproc-userns" in result.isolation
    assert "refused 11" in result.stdout and "children 5" in result.stdout, result.stdout
    assert_host_clean(result)


def test_process_creation_is_refused_by_seccomp_without_python_guards():
    result = run_python(FORK_CHILDREN, SandboxConfig(timeout_s=1, python_guards=False))
    assert "refused 1\n" in result.stdout and "children 0" in result.stdout  # EPERM


def test_weak_backend_caps_processes_too():
    config = dataclasses.replace(WEAK, timeout_s=3, max_processes=6, python_guards=False)
    result = run_python(FORK_CHILDREN, config)
    assert result.backend == "python-audit"
    if {"cgroup-v1-pids", "cgroup-v2-pids", "rlimit-nproc"} & set(result.isolation):
        assert "refused 11" in result.stdout
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
    assert "netns" in result.isolation, result.isolation
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
    with pytest.raises(ValueError, match=r"SandboxConfig.timeout_s: invalid value 0"):
        run_python("pass", SandboxConfig(timeout_s=0))
    with pytest.raises(
        ValueError, match=r"SandboxConfig.memory_mb: invalid value 1; expected an integer >= 32"
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


# ---------------------------------------------------------------------------------------
# backends
# ---------------------------------------------------------------------------------------


def test_default_backend_is_bubblewrap_and_reports_verified_layers():
    result = run_python("print(6 * 7)")
    assert result.stdout == "42\n" and result.backend == "bubblewrap"
    verified = {"no-new-privs", "seccomp", "caps-dropped", "uid-65534"}
    assert verified <= set(result.isolation), result.isolation
    assert {"userns", "mountns", "pidns", "netns", "ipcns", "utsns"} <= set(result.isolation)
    assert "tmpfs-quota-64MiB" in result.isolation
    report = sandbox_report()
    assert report["backend"] == "bubblewrap"
    assert report["cgroups"] in ("v1", "v2") or report["cgroups"].startswith("unavailable: ")


def test_ordinary_code_threads_files_and_arithmetic():
    code = (
        "import threading, os\n"
        "out = []\n"
        "def work(i):\n    out.append(sum(range(i * 1000)))\n"
        "ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "os.makedirs('sub', exist_ok=True)\n"
        "with open('sub/r.txt', 'w') as f:\n    f.write(str(sorted(out)))\n"
        "print(open('sub/r.txt').read(), os.listdir('.'))\n"
    )
    result = run_python(code)
    expected = sorted(sum(range(i * 1000)) for i in range(4))
    assert result.ok, result.stderr
    assert result.stdout == f"{expected} ['sub']\n"


def test_missing_bubblewrap_refuses_untrusted_code_naming_the_package():
    config = SandboxConfig(bwrap_path="/nonexistent/bwrap")
    with pytest.raises(SandboxUnavailableError, match=r"apt-get install bubblewrap"):
        run_python("print(1)", config)
    with pytest.raises(SandboxUnavailableError, match=r"Debian's `bubblewrap`"):
        PythonSandboxTool(config)
    # accepted only when weaker isolation is explicitly acceptable
    weak = dataclasses.replace(config, allow_weak_isolation=True)
    assert select_backend(weak) == "python-audit"
    assert run_python("print(1)", weak).stdout == "1\n"


def test_python_audit_backend_needs_an_explicit_flag():
    with pytest.raises(SandboxUnavailableError, match="allow_weak_isolation"):
        run_python("print(1)", SandboxConfig(backend="python-audit"))
    result = run_python("print(1)", WEAK)
    assert result.backend == "python-audit" and "audit-hook" in result.isolation
    assert_host_clean(result)


def test_bad_backend_names_the_field():
    with pytest.raises(ValueError, match=r"SandboxConfig.backend: invalid value 'docker'"):
        run_python("pass", SandboxConfig(backend="docker"))
    with pytest.raises(ValueError, match=r"SandboxConfig.remote_url: invalid value None"):
        run_python("pass", SandboxConfig(backend="remote"))


@pytest.fixture(scope="module")
def fusion_service():
    """A real SandboxFusion-API server on 127.0.0.1 running code through bubblewrap."""
    server, url = start_in_thread(config=SandboxConfig(timeout_s=10))
    yield url
    server.shutdown()
    server.server_close()


def test_remote_backend_runs_code_on_a_sandboxfusion_service(fusion_service, tmp_path):
    config = SandboxConfig(backend="remote", remote_url=fusion_service)
    result = run_python("import sys\nprint(2 ** 10)\nprint('e', file=sys.stderr)", config)
    assert result.backend == "remote" and result.ok
    assert result.stdout == "1024\n" and result.stderr == "e\n"
    assert "service:bubblewrap" in result.isolation and "seccomp" in result.isolation
    marker = tmp_path / "remote-marker"
    escape = run_python(
        f"open({str(marker)!r}, 'w').write('x')",
        dataclasses.replace(config, python_guards=False),
    )
    assert escape.exit_code == 1 and not marker.exists()
    slow = run_python("while True:\n    pass", dataclasses.replace(config, timeout_s=1))
    assert slow.killed == "wall-clock timeout (1 s)" and not slow.ok


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url + "/run_code",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def test_sandboxfusion_api_wire_format(fusion_service):
    reply = _post(fusion_service, {"code": "print('hi')", "language": "python", "run_timeout": 5})
    assert reply["status"] == "Success"
    assert reply["run_result"]["status"] == "Finished"
    assert reply["run_result"]["return_code"] == 0 and reply["run_result"]["stdout"] == "hi\n"
    failed = _post(fusion_service, {"code": "raise SystemExit(3)", "language": "python"})
    assert failed["status"] == "Failed" and failed["run_result"]["return_code"] == 3
    with pytest.raises(urllib.error.HTTPError) as info:
        _post(fusion_service, {"code": "echo hi", "language": "bash"})
    assert info.value.code == 400
    assert "language='bash' is not supported" in json.loads(info.value.read())["message"]
    with pytest.raises(ValueError, match="run_timeout=0 is invalid"):
        handle_run_code({"code": "", "run_timeout": 0}, SandboxConfig())


def test_unreachable_service_fails_loudly_naming_the_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(SandboxServiceError, match=rf"sandbox service {url}/run_code failed"):
        run_python("print(1)", SandboxConfig(backend="remote", remote_url=url, timeout_s=1))
