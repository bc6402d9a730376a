"""Child side of the Python sandbox; run as ``python -I -S -B sandbox_bootstrap.py RUN_ID CFG``.

This process is the run's *supervisor*. In a fresh, single-threaded interpreter, before any
untrusted code, it

1. leaves the host's network namespace (``unshare(CLONE_NEWNET)``; as non-root together with
   a new user namespace) when the kernel allows it: the run then sees only a loopback
   interface that is down, so no connection can leave it;
2. waits for the code on stdin (the parent sends it only after placing this process in its
   pids cgroup), becomes a child subreaper and forks the *worker*, which
   - starts its own process group and sets resource limits (CPU seconds, address space,
     file size, open files, no core dumps and, where the kernel enforces it for this user,
     the process count),
   - installs an audit hook (a Python-level guard, bypassable by native code, so ctypes is
     refused as well) that refuses process creation, sockets, signals to other processes
     and file access outside the work directory (reads are also allowed in the
     interpreter's own library directories),
   - runs the code as ``__main__`` with a traceback showing the user's frames;
3. reports what it applied and the worker's pid on the status pipe, waits for the worker,
   then kills and reaps every remaining descendant (they are re-parented to it), so no
   process and no zombie outlives the run even where PID 1 does not reap orphans, and
   exits with the worker's status.

This file must not import rl_rollout: it runs in an isolated interpreter without site.
"""

import contextlib
import json
import os
import resource
import signal
import sys
import time
import traceback

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PR_SET_CHILD_SUBREAPER = 36
BLOCKED_EVENTS = {
    "os.fork": "creating processes is not allowed in the sandbox",
    "os.forkpty": "creating processes is not allowed in the sandbox",
    "os.exec": "creating processes is not allowed in the sandbox",
    "os.posix_spawn": "creating processes is not allowed in the sandbox",
    "os.spawn": "creating processes is not allowed in the sandbox",
    "os.system": "creating processes is not allowed in the sandbox",
    "subprocess.Popen": "creating processes is not allowed in the sandbox",
    "pty.spawn": "creating processes is not allowed in the sandbox",
    "socket.__new__": "network access is not allowed in the sandbox",
    "socket.connect": "network access is not allowed in the sandbox",
    "socket.bind": "network access is not allowed in the sandbox",
    "socket.getaddrinfo": "network access is not allowed in the sandbox",
    "socket.gethostbyname": "network access is not allowed in the sandbox",
    "socket.sendto": "network access is not allowed in the sandbox",
    "os.link": "hard links are not allowed in the sandbox",
    "os.chroot": "chroot is not allowed in the sandbox",
    "os.setuid": "changing credentials is not allowed in the sandbox",
    "os.setgid": "changing credentials is not allowed in the sandbox",
}
# Events whose first argument is a path the code wants to touch, and whether it writes.
PATH_EVENTS = {
    "os.listdir": False,
    "os.scandir": False,
    "os.chdir": False,
    "os.mkdir": True,
    "os.remove": True,
    "os.rmdir": True,
    "os.chmod": True,
    "os.chown": True,
    "os.truncate": True,
    "os.utime": True,
}
READABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _libc():
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True)
    except Exception:
        return None


def _unshare_network(libc):
    """Enter a new network namespace; return the mechanism used, or None if refused."""
    if libc is None:
        return None
    if libc.unshare(CLONE_NEWNET) == 0:
        return "netns"
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        return "userns+netns"
    return None


def _limits(cfg):
    cpu = int(cfg["cpu_time_s"])
    limits = [
        ("cpu", resource.RLIMIT_CPU, (cpu, cpu + 1)),
        ("address-space", resource.RLIMIT_AS, (cfg["memory_bytes"],) * 2),
        ("file-size", resource.RLIMIT_FSIZE, (cfg["max_file_size_bytes"],) * 2),
        ("open-files", resource.RLIMIT_NOFILE, (cfg["max_open_files"],) * 2),
        ("core", resource.RLIMIT_CORE, (0, 0)),
    ]
    if cfg["nproc_limit"] is not None:
        limits.append(("nproc", resource.RLIMIT_NPROC, (cfg["nproc_limit"],) * 2))
    return limits


def _within(path, roots):
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def _install_guard(work_dir, read_roots):
    realpath = os.path.realpath
    fspath = os.fspath
    own_pid = os.getpid()
    write_roots = (work_dir,)
    read_roots = (work_dir, *read_roots)

    def check_path(event, path, write):
        if isinstance(path, int) or path is None:
            return  # an already-open file descriptor
        path = fspath(path)
        if isinstance(path, bytes):
            path = path.decode(sys.getfilesystemencoding(), "surrogateescape")
        resolved = realpath(path)
        if write and not _within(resolved, write_roots):
            raise PermissionError(f"sandbox: writing {path!r} is not allowed ({event})")
        if not write and not _within(resolved, read_roots) and resolved not in READABLE_DEVICES:
            raise PermissionError(f"sandbox: reading {path!r} is not allowed ({event})")

    def hook(event, args):
        if event in BLOCKED_EVENTS:
            raise PermissionError(f"sandbox: {BLOCKED_EVENTS[event]} ({event})")
        if event.startswith("ctypes."):
            raise PermissionError(f"sandbox: native code via ctypes is not allowed ({event})")
        if event == "open":
            path, mode, flags = args
            write = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(
                isinstance(flags, int) and flags & WRITE_FLAGS
            )
            check_path(event, path, write)
        elif event in PATH_EVENTS:
            check_path(event, args[0], PATH_EVENTS[event])
        elif event in ("os.rename", "os.symlink"):
            check_path(event, args[1], True)
            if event == "os.rename":
                check_path(event, args[0], True)
        elif event in ("os.kill", "os.killpg", "signal.pthread_kill") and args[0] != own_pid:
            raise PermissionError(f"sandbox: signalling other processes is not allowed ({event})")

    sys.addaudithook(hook)


def _run_user_code(code, memory_mb):
    import builtins
    import linecache

    filename = "<sandbox>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(code, filename, "exec"), namespace)
    except SystemExit:
        raise
    except MemoryError:
        sys.stderr.write(f"MemoryError: the sandbox memory limit ({memory_mb} MiB) was reached\n")
        sys.exit(1)
    except BaseException as exc:
        # Show the user's frames and library frames, not the bootstrap's own.
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
        sys.stderr.write("Traceback (most recent call last):\n")
        sys.stderr.write("".join(traceback.format_list(frames)))
        sys.stderr.write("".join(traceback.format_exception_only(type(exc), exc)))
        sys.exit(1)


def _children(pid):
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(name))
    return found


def _supervise(worker):
    """Wait for the worker, end and reap all descendants, exit with the worker's status."""
    _, wait_status = os.waitpid(worker, 0)
    own = os.getpid()
    while True:
        with contextlib.suppress(OSError):
            os.killpg(worker, 9)
        for pid in _children(own):
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break  # no descendants left
        if pid == 0:
            time.sleep(0.005)
    sys.stdout.flush()
    if os.WIFSIGNALED(wait_status):
        sig = os.WTERMSIG(wait_status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(own, sig)
    os._exit(os.waitstatus_to_exitcode(wait_status) if os.WIFEXITED(wait_status) else 1)


def _worker(cfg, code):
    os.setpgid(0, 0)
    for _, which, value in _limits(cfg):
        resource.setrlimit(which, value)
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")
    sys.stderr.reconfigure(encoding="utf-8", errors="backslashreplace")
    sys.path[:0] = cfg["extra_sys_path"]
    if cfg["python_guards"]:
        # Readable: the interpreter's own library directories, the extra import paths and
        # any extra read roots the parent allowed.
        read_roots = [os.path.realpath(p) for p in [*sys.path, *cfg["read_roots"]] if p]
        _install_guard(os.path.realpath(cfg["work_dir"]), read_roots)
        for name in [
            m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))
        ]:
            del sys.modules[name]
    _run_user_code(code, cfg["memory_bytes"] // 2**20)
    sys.stdout.flush()


def main():
    cfg = json.loads(sys.argv[2])
    status = os.fdopen(cfg["status_fd"], "w")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    libc = _libc()
    applied = []
    if not cfg["allow_network"]:
        mechanism = _unshare_network(libc)
        if mechanism:
            applied.append(mechanism)
    if libc is not None and libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
        applied.append("subreaper")
    os.chdir(cfg["work_dir"])
    code = sys.stdin.read()  # the parent sends the code once this process is in its cgroup
    sys.stdin.close()
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the user's stdin, empty, for the run
    worker = os.fork()
    if worker == 0:
        status.close()
        _worker(cfg, code)
        return
    applied += ["rlimit-" + name for name, _, _ in _limits(cfg)]
    status.write(json.dumps({"applied": applied, "worker_pid": worker}) + "\n")
    status.close()
    _supervise(worker)


if __name__ == "__main__":
    main()
