"""Child side of the Python sandbox; run as ``python -I -S -B bootstrap.py RUN_ID CFG``.

It reads the code on stdin, sets the resource limits, installs the audit hook (a Python-level
guard that gives clear errors; the kernel layers are what hold against native code) and runs
the code as ``__main__`` in a module of its own (not this one, so the guard's state is out of
reach). Two modes:

``direct`` (bubblewrap): namespaces, seccomp, no_new_privs and dropped capabilities are
already in force; this process verifies them from ``/proc/self/status``, reports what it
found on the status pipe, and runs the code itself (process creation is refused by seccomp,
bubblewrap's PID 1 reaps and the parent kills the tree).

``supervised`` (python-audit, weak isolation): this process is the run's *supervisor*. It
leaves the host's network namespace (``unshare(CLONE_NEWNET)``; as non-root with a new user
namespace) when the kernel allows it, becomes a child subreaper and forks the *worker*, which
sets the limits, installs the guard and runs the code; it then reports the worker's pid,
waits for it, kills and reaps every remaining descendant and exits with the worker's status.

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
# Events whose first argument is a path the code wants to touch: (writes, index of dir_fd).
PATH_EVENTS = {
    "os.listdir": (False, None),
    "os.scandir": (False, None),
    "os.chdir": (False, None),
    "os.mkdir": (True, 2),
    "os.remove": (True, 1),
    "os.rmdir": (True, 1),
    "os.chmod": (True, 2),
    "os.chown": (True, 3),
    "os.truncate": (True, None),
    "os.utime": (True, 3),
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


PROCESS_EVENTS = frozenset(e for e, why in BLOCKED_EVENTS.items() if why.startswith("creating"))


def _install_guard(work_dir, read_roots, allow_subprocesses=False):
    """Install the audit hook. Its tables are frozen copies held in this closure only."""
    blocked = {
        e: why
        for e, why in BLOCKED_EVENTS.items()
        if not (allow_subprocesses and e in PROCESS_EVENTS)
    }
    path_events = dict(PATH_EVENTS)
    devices = frozenset(READABLE_DEVICES)
    write_flags = WRITE_FLAGS
    realpath = os.path.realpath
    fspath = os.fspath
    encoding = sys.getfilesystemencoding()
    own_pid = os.getpid()
    write_roots = (work_dir,)
    read_roots = (work_dir, *read_roots)
    sep = os.sep

    def within(path, roots):
        return any(path == root or path.startswith(root.rstrip(sep) + sep) for root in roots)

    def check_path(event, path, write, dir_fd=None):
        if isinstance(path, int) or path is None:
            return  # an already-open file descriptor
        path = fspath(path)
        if isinstance(path, bytes):
            path = path.decode(encoding, "surrogateescape")
        if dir_fd is not None and dir_fd != -1 and not path.startswith(sep):
            raise PermissionError(f"sandbox: paths relative to dir_fd are not allowed ({event})")
        resolved = realpath(path)
        if write and not within(resolved, write_roots):
            raise PermissionError(f"sandbox: writing {path!r} is not allowed ({event})")
        if not write and not within(resolved, read_roots) and resolved not in devices:
            raise PermissionError(f"sandbox: reading {path!r} is not allowed ({event})")

    def hook(event, args):
        if event in blocked:
            raise PermissionError(f"sandbox: {blocked[event]} ({event})")
        if event.startswith("ctypes."):
            raise PermissionError(f"sandbox: native code via ctypes is not allowed ({event})")
        if event in ("gc.get_objects", "gc.get_referrers", "gc.get_referents"):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open":
            path, mode, flags = args
            write = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(
                isinstance(flags, int) and flags & write_flags
            )
            check_path(event, path, write)
        elif event in path_events:
            write, fd_index = path_events[event]
            dir_fd = args[fd_index] if fd_index is not None and len(args) > fd_index else None
            check_path(event, args[0], write, dir_fd)
        elif event == "os.symlink":
            check_path(event, args[1], True, args[2] if len(args) > 2 else None)
        elif event == "os.rename":
            check_path(event, args[0], True, args[2] if len(args) > 2 else None)
            check_path(event, args[1], True, args[3] if len(args) > 3 else None)
        elif event in ("os.kill", "os.killpg", "signal.pthread_kill") and args[0] != own_pid:
            raise PermissionError(f"sandbox: signalling other processes is not allowed ({event})")

    sys.addaudithook(hook)


def _run_user_code(code, memory_mb):
    import builtins
    import linecache
    import types

    filename = "<sandbox>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    module = types.ModuleType("__main__")
    module.__builtins__ = builtins
    sys.modules["__main__"] = module  # the code's own __main__, not this bootstrap
    namespace = module.__dict__
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
    if cfg.get("setpgid", True):
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
        _install_guard(
            os.path.realpath(cfg["work_dir"]), read_roots, cfg.get("allow_subprocesses", False)
        )
        for name in [
            m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))
        ]:
            del sys.modules[name]
    _run_user_code(code, cfg["memory_bytes"] // 2**20)
    sys.stdout.flush()


def _verified_isolation():
    """What the kernel reports about this process: the layers bubblewrap put in place."""
    fields = {}
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.split()
    found = []
    if fields.get("NoNewPrivs") == ["1"]:
        found.append("no-new-privs")
    if fields.get("Seccomp") == ["2"]:
        found.append("seccomp")
    caps = [int(fields.get(k, ["1"])[0], 16) for k in ("CapEff", "CapPrm", "CapBnd")]
    if caps == [0, 0, 0]:
        found.append("caps-dropped")
    if fields.get("Uid", [None])[0] == "65534":
        found.append("uid-65534")
    return found


def _read_code():
    code = sys.stdin.read()  # the parent sends the code once this process is in its cgroups
    sys.stdin.close()
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the user's stdin, empty, for the run
    return code


def main():
    cfg = json.loads(sys.argv[2])
    status = os.fdopen(cfg["status_fd"], "w")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if cfg["mode"] == "direct":
        os.chdir(cfg["work_dir"])
        code = _read_code()
        applied = _verified_isolation() + ["rlimit-" + name for name, _, _ in _limits(cfg)]
        status.write(json.dumps({"applied": applied}) + "\n")
        status.close()
        cfg["setpgid"] = False
        _worker(cfg, code)
        return
    libc = _libc()
    applied = []
    if not cfg["allow_network"]:
        mechanism = _unshare_network(libc)
        if mechanism:
            applied.append(mechanism)
    if libc is not None and libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
        applied.append("subreaper")
    os.chdir(cfg["work_dir"])
    code = _read_code()
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
