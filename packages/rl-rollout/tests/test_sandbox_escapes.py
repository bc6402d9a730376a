"""Escape attempts against the sandbox, written as an attacker would (root on the host, native
code allowed where the Python guard is switched off). Each test asserts that nothing outside
the sandbox changed: marker files absent, host files unchanged, host listener not contacted,
host processes untouched.

They run under the default backend, which must be bubblewrap here: CI installs it, and under
``CI=true`` a missing ``bwrap`` fails these tests instead of skipping them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from rl_rollout.tools import SandboxConfig, run_python

pytestmark = pytest.mark.usefixtures("require_bwrap")


def cfg(**kwargs) -> SandboxConfig:
    return SandboxConfig(**kwargs)


# An attacker's helper: process creation through _posixsubprocess, which raises no audit
# event (Python 3.11/3.12 argument lists).
SPAWN = """
import _posixsubprocess, os
def spawn(argv):
    argv = [os.fsencode(a) for a in argv]
    r, w = os.pipe()
    head = [argv, [argv[0]], True, (), None, None, -1, -1, -1, -1, -1, -1, r, w, False, False]
    for tail in ([-1, None, None, None, -1, None, False], [-1, None, None, None, -1, None]):
        try:
            pid = _posixsubprocess.fork_exec(*head, *tail)
            break
        except TypeError:
            continue
    os.close(w)
    return pid
"""

# An attacker's helper: switch the audit hook off through the bootstrap's module globals.
UNHOOK = """
import sys
_m = sys.modules["__main__"]
for _name in ("BLOCKED_EVENTS", "PATH_EVENTS"):
    if isinstance(getattr(_m, _name, None), dict):
        getattr(_m, _name).clear()
if hasattr(_m, "_within"):
    _m._within = lambda path, roots: True
"""


class Listener:
    """A TCP listener on the host's 127.0.0.1 that records every connection it accepts."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.accepted: list[bytes] = []
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1)
                data = b""
                with contextlib.suppress(OSError):
                    data = conn.recv(100)
                self.accepted.append(data or b"<connected>")

    def close(self) -> None:
        time.sleep(0.3)
        self._stop = True
        self.thread.join()
        self.server.close()


@pytest.fixture
def listener():
    srv = Listener()
    yield srv
    srv.close()


@pytest.fixture
def host_process():
    """A host process with a secret on its command line."""
    secret = f"SECRET-{uuid.uuid4().hex}"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", secret])
    time.sleep(0.1)
    yield proc, secret
    proc.kill()
    proc.wait()


def _host_state(pid: int) -> tuple[str, str]:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return fields["State"].split()[0], fields["TracerPid"].strip()


def _connect_code(port: int) -> str:
    return (
        "import socket\n"
        f"socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'escaped')\n"
    )


# ---------------------------------------------------------------------------------------
# process creation
# ---------------------------------------------------------------------------------------


def test_fork_exec_of_a_shell_cannot_touch_the_host(tmp_path):
    marker = tmp_path / "escape-marker"
    code = SPAWN + (
        "import os, time\n"
        f"pid = spawn(['/bin/sh', '-c', 'id > {marker}; cat /etc/passwd >> {marker}'])\n"
        "print('spawned', pid, flush=True)\n"
        "os.waitpid(pid, 0)\n"
    )
    result = run_python(code)
    assert not marker.exists(), "a shell started by fork_exec wrote on the host"
    assert "spawned" not in result.stdout
    assert result.exit_code == 1


def test_fork_bomb_by_fork_exec_is_stopped(tmp_path):
    marker = tmp_path / "bomb-marker"
    code = SPAWN + (
        "n = 0\n"
        "try:\n"
        "    for _ in range(200):\n"
        f"        spawn(['/bin/sh', '-c', 'echo x >> {marker}; sleep 30'])\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
        "print('spawned', n)\n"
    )
    config = cfg(timeout_s=5, max_processes=8)
    result = run_python(code, config)
    spawned = int(result.stdout.split("spawned ")[1].split()[0])
    assert spawned < config.max_processes, result.stdout
    assert not marker.exists()
    leftovers = subprocess.run(["pgrep", "-f", str(marker)], capture_output=True, text=True)
    assert leftovers.stdout == "", "processes of the run outlived it"


def test_nsenter_into_the_host_network_does_not_reach_a_host_listener(listener):
    """fork_exec of nsenter -t <host pid> -n, connecting to 127.0.0.1 on the host."""
    host_pid = os.getpid()
    inner = _connect_code(listener.port)
    code = SPAWN + (
        "import os, sys\n"
        f"pid = spawn(['/usr/bin/nsenter', '-t', '{host_pid}', '-n', sys.executable, '-c', {inner!r}])\n"
        "print('status', os.waitpid(pid, 0)[1])\n"
    )
    run_python(code)
    listener.close()
    assert listener.accepted == []


def test_nsenter_fails_even_when_subprocesses_are_allowed(listener):
    """With process creation allowed, the namespaces, dropped capabilities and seccomp still
    keep nsenter out of the host's network namespace."""
    host_pid = os.getpid()
    inner = _connect_code(listener.port)
    code = (
        "import subprocess, sys\n"
        f"p = subprocess.run(['/usr/bin/nsenter', '-t', '{host_pid}', '-n', sys.executable, "
        f"'-c', {inner!r}], capture_output=True, text=True)\n"
        "print('rc', p.returncode, p.stderr)\n"
    )
    result = run_python(code, cfg(allow_subprocesses=True, python_guards=False))
    listener.close()
    assert listener.accepted == []
    assert "rc 0" not in result.stdout and result.stdout.startswith("rc"), result.stderr


def test_leaving_the_pids_cgroup_via_cgroup_procs_fails():
    """Writing the own pid into a cgroup.procs higher up must not lift the process limit."""
    code = UNHOOK + (
        "import glob, os, time\n"
        "moved = []\n"
        "for procs in ['/sys/fs/cgroup/cgroup.procs', '/sys/fs/cgroup/pids/cgroup.procs',\n"
        "              '/sys/fs/cgroup/unified/cgroup.procs']:\n"
        "    try:\n"
        "        with open(procs, 'w') as f:\n"
        "            f.write(str(os.getpid()))\n"
        "        moved.append(procs)\n"
        "    except OSError as e:\n"
        "        pass\n"
        "print('moved', moved, flush=True)\n"
        "n = 0\n"
        "for _ in range(20):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(5)\n"
        "        os._exit(0)\n"
        "    n += 1\n"
        "print('children', n, flush=True)\n"
    )
    result = run_python(code, cfg(max_processes=4, allow_subprocesses=True, timeout_s=5))
    assert "moved []" in result.stdout, result.stdout + result.stderr
    children = int(result.stdout.split("children ")[1].split()[0])
    assert children < 4


# ---------------------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------------------


def _host_tree(root: Path) -> dict[str, tuple[str, bytes]]:
    tree = {}
    for path in sorted(root.rglob("*")):
        kind = "link" if path.is_symlink() else "dir" if path.is_dir() else "file"
        data = os.readlink(path).encode() if kind == "link" else b""
        if kind == "file":
            data = path.read_bytes()
        tree[str(path.relative_to(root))] = (kind, data)
    return tree


@pytest.fixture
def host_files(tmp_path):
    """A host directory: a read-allowed subdirectory and a victim file beside it."""
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "data.txt").write_text("read me")
    (tmp_path / "victim.txt").write_text("original")
    before = _host_tree(tmp_path)
    yield tmp_path
    assert _host_tree(tmp_path) == before, "files outside the sandbox changed"


def test_dir_fd_through_a_symlink_cannot_write_read_or_delete_outside(host_files):
    ro = host_files / "ro"
    code = (
        "import os\n"
        "out = []\n"
        "def attempt(name, fn):\n"
        "    try:\n"
        "        fn()\n"
        "        out.append(name)\n"
        "    except OSError as e:\n"
        "        pass\n"
        f"fd = os.open({str(ro)!r}, os.O_RDONLY | os.O_DIRECTORY)\n"
        f"attempt('symlink', lambda: os.symlink({str(host_files)!r}, 'lnk', dir_fd=fd))\n"
        "attempt('create', lambda: os.close(os.open('lnk/owned', os.O_WRONLY | os.O_CREAT, dir_fd=fd)))\n"
        "attempt('write', lambda: os.write(os.open('lnk/victim.txt', os.O_WRONLY | os.O_TRUNC, dir_fd=fd), b'owned'))\n"
        "attempt('read', lambda: print(os.read(os.open('lnk/victim.txt', os.O_RDONLY, dir_fd=fd), 100)))\n"
        "attempt('delete', lambda: os.unlink('lnk/victim.txt', dir_fd=fd))\n"
        "attempt('plant', lambda: os.close(os.open('planted', os.O_WRONLY | os.O_CREAT, dir_fd=fd)))\n"
        "print('done', out)\n"
    )
    result = run_python(code, cfg(extra_read_paths=(str(ro),)))
    assert "b'original'" not in result.stdout
    assert "done []" in result.stdout, result.stdout + result.stderr


def test_writes_through_proc_self_fd_symlinks_and_hard_links_fail(host_files):
    ro = host_files / "ro"
    data = ro / "data.txt"
    code = UNHOOK + (
        "import os\n"
        "out = []\n"
        "def attempt(name, fn):\n"
        "    try:\n"
        "        fn()\n"
        "        out.append(name)\n"
        "    except OSError:\n"
        "        pass\n"
        f"rfd = os.open({str(data)!r}, os.O_RDONLY)\n"
        "attempt('proc-fd', lambda: open(f'/proc/self/fd/{rfd}', 'w').write('owned'))\n"
        f"dfd = os.open({str(ro)!r}, os.O_RDONLY | os.O_DIRECTORY)\n"
        "attempt('proc-dirfd', lambda: open(f'/proc/self/fd/{dfd}/planted', 'w').write('x'))\n"
        f"attempt('symlink', lambda: os.symlink({str(host_files / 'victim.txt')!r}, 'v'))\n"
        "attempt('symlink-write', lambda: open('v', 'r+').write('owned'))\n"
        f"attempt('hardlink', lambda: os.link({str(data)!r}, 'h'))\n"
        "attempt('hardlink-write', lambda: open('h', 'r+').write('owned'))\n"
        "print('done', out)\n"
    )
    result = run_python(code, cfg(extra_read_paths=(str(ro),)))
    written = [
        n
        for n in ("proc-fd", "proc-dirfd", "symlink-write", "hardlink-write")
        if n in result.stdout
    ]
    assert written == [], result.stdout + result.stderr


def test_switching_off_the_audit_hook_via_main_gains_nothing(tmp_path):
    marker = tmp_path / "hook-marker"
    code = UNHOOK + (
        f"open({str(marker)!r}, 'w').write(open('/etc/passwd').read())\nprint('escaped')\n"
    )
    result = run_python(code)
    assert not marker.exists()
    assert "escaped" not in result.stdout and "root:" not in result.stdout


def test_reading_etc_shadow_fails():
    code = (
        "for path in ('/etc/shadow', '/etc/passwd'):\n"
        "    try:\n"
        "        print(open(path).read())\n"
        "    except OSError as e:\n"
        "        print('refused', path)\n"
    )
    for config in (cfg(), cfg(python_guards=False)):
        result = run_python(code, config)
        assert "root:" not in result.stdout, result.stdout
        assert "refused /etc/shadow" in result.stdout


def test_disk_flood_hits_the_quota():
    code = (
        "import os\n"
        "written = 0\n"
        "try:\n"
        "    for i in range(40):\n"
        "        with open(f'f{i}', 'wb') as f:\n"
        "            f.write(b'x' * (16 * 2**20 - 4096))\n"
        "        written += 1\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
        "print('files', written)\n"
    )
    result = run_python(code, cfg(timeout_s=30, memory_mb=256))
    assert f"refused {errno.ENOSPC}" in result.stdout, result.stdout + result.stderr
    assert int(result.stdout.split("files ")[1].split()[0]) < 40


# ---------------------------------------------------------------------------------------
# kernel interfaces, with the Python guard switched off (native code via ctypes)
# ---------------------------------------------------------------------------------------

LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"


def test_ptrace_of_a_host_process_fails(host_process):
    proc, _ = host_process
    code = LIBC + (
        f"r = libc.ptrace(16, {proc.pid}, 0, 0)\n"  # PTRACE_ATTACH
        "print('ptrace', r, ctypes.get_errno())\n"
        "import time; time.sleep(0.3)\n"
    )
    result = run_python(code, cfg(python_guards=False))
    assert result.stdout.startswith("ptrace -1"), result.stdout + result.stderr
    assert _host_state(proc.pid) == ("S", "0")


def test_mount_unshare_setns_fail(tmp_path, listener):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    code = LIBC + (
        f"print('mount', libc.mount(b'none', {str(mnt).encode()!r}, b'tmpfs', 0, None))\n"
        "print('unshare-user', libc.unshare(0x10000000))\n"
        "print('unshare-mnt', libc.unshare(0x00020000))\n"
        f"fd = os.open('/proc/{os.getpid()}/ns/net', os.O_RDONLY) if os.path.exists('/proc/{os.getpid()}/ns/net') else -1\n"
        "print('setns', libc.setns(fd, 0x40000000) if fd >= 0 else -1)\n"
        "self_fd = os.open('/proc/self/ns/net', os.O_RDONLY)\n"
        "print('setns-self', libc.setns(self_fd, 0x40000000))\n"
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {listener.port}), timeout=1).sendall(b'escaped')\n"
        "except OSError as e:\n"
        "    print('connect refused')\n"
    )
    result = run_python(code, cfg(python_guards=False))
    listener.close()
    try:
        for name in ("mount", "unshare-user", "unshare-mnt", "setns", "setns-self"):
            assert f"{name} -1" in result.stdout, result.stdout + result.stderr
        assert listener.accepted == []
        assert str(mnt) not in Path("/proc/self/mountinfo").read_text()
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_kill_of_a_host_process_fails(host_process):
    proc, _ = host_process
    code = (
        "import os, signal\n"
        "try:\n"
        f"    os.kill({proc.pid}, signal.SIGKILL)\n"
        "    print('killed')\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
    )
    run_python(code, cfg(python_guards=False))
    time.sleep(0.1)
    assert proc.poll() is None, "the host process was killed from the sandbox"


def test_proc_of_host_processes_is_not_readable(host_process):
    proc, secret = host_process
    code = (
        "import os\n"
        f"for name in ('cmdline', 'environ', 'status'):\n"
        "    try:\n"
        f"        print(open(f'/proc/{proc.pid}/' + name, 'rb').read())\n"
        "    except OSError as e:\n"
        "        print('refused', name)\n"
        "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
    )
    result = run_python(code, cfg(python_guards=False))
    assert secret not in result.stdout
    assert "refused cmdline" in result.stdout, result.stdout + result.stderr
    assert str(proc.pid) not in result.stdout.splitlines()[-1]


# x86-64: mov eax, 272 (unshare); mov edi, CLONE_NEWUSER; syscall; ret
# aarch64: mov x8, #97 (unshare); mov x0, #0x10000000; svc #0; ret
MACHINE_CODE = {
    "x86_64": "b810010000bf00000010" + "0f05c3",
    "aarch64": "280c80d2" + "0000a2d2" + "010000d4" + "c0035fd6",
}


def test_raw_syscall_from_machine_code_in_an_executable_mmap_is_stopped():
    """Machine code written into an executable mmap with bytes, called through ctypes (no
    ctypes-free way to jump to it exists in CPython): seccomp still stops the syscall."""
    machine = os.uname().machine
    assert machine in MACHINE_CODE, f"no machine code for {machine}"
    code = (
        "import ctypes, mmap\n"
        f"blob = bytes.fromhex({MACHINE_CODE[machine]!r})\n"
        "m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "m.write(blob)\n"
        "addr = ctypes.addressof(ctypes.c_char.from_buffer(m))\n"
        "fn = ctypes.CFUNCTYPE(ctypes.c_long)(addr)\n"
        "print('unshare', fn())\n"
    )
    result = run_python(code, cfg(python_guards=False))
    assert f"unshare -{errno.EPERM}" in result.stdout, result.stdout + result.stderr
