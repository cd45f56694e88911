"""The warm worker: a fork server that imports torch, triton and the code its jobs run once, then runs each job in
processes of its own, forked from that clean state (workbench.verify.warm starts it and sends it jobs).

    python -s -P -B forkserver.py SOCKET WORKER_FILE...            # verification: imports no workbench
    python -s -P -B forkserver.py SOCKET --module MODULE...        # the replay's and parity's training children

A job arrives on the Unix socket as one JSON line ({"worker" or "module", "job_dir", "cwd", "timeout_s",
"memory_bytes", "readable", "writable", "hidden", "env", "isolate", "stdio"}) with descriptors passed along
(SCM_RIGHTS): the write end of the parent's result pipe (a worker's job), or its stdin, stdout and stderr (a
module's job, ``stdio``). The server forks a keeper for it; the keeper forks the job's first process, which forks
the job's process:

- the keeper starts a new session and, with ``isolate`` (the server runs inside bubblewrap), new mount, PID, IPC and
  network namespaces (and a user namespace where the server is not privileged); the job's first process is PID 1
  of that PID namespace, so a candidate sees no process outside its job, cannot signal the server, and every
  process it starts dies with the job;
- the first process mounts its own /proc, hides the temporary folders (a tmpfs over each), binds back the job's
  folders (the job folder and ``writable``: writable; ``readable``: read-only), brings its loopback interface up,
  drops every privilege and forks the job's process; it runs nothing else (a PID 1 ignores the signals it has no
  handler for, even its own faults);
- the job's process takes its limits (address space, CPU time, file size, no core dumps), its output (JOB_DIR/
  output.log, or the passed stdio), its environment and working folder, and calls the worker's ``main(job_dir,
  result_fd)`` or runs the module as ``python -m MODULE`` would: the same code a cold child runs, from the same
  starting state (nothing a previous job imported, patched or wrote is in it: each job is a fresh fork of a server
  that never runs a candidate).

The server answers each job with one JSON line: {"code": the job's exit code, negative for a signal} or {"timeout":
true} (it kills the keeper's session at the job's deadline, or when the parent closes the connection: the PID
namespace goes with it). It is single-threaded (forking from a threaded process is unsafe; it refuses to start
otherwise) and dies with its parent.
"""

from __future__ import annotations

import ctypes
import errno
import importlib
import importlib.util
import json
import os
import resource
import runpy
import selectors
import signal
import socket
import sys
import tempfile
import time

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWIPC, CLONE_NEWNET = \
    0x00020000, 0x10000000, 0x20000000, 0x08000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = \
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18
CAP_SETPCAP, CAP_NET_ADMIN, CAP_SYS_ADMIN, CAP_LAST = 8, 12, 21, 63
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 28, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
SECUREBITS_LOCKED_NOROOT = 0xEF  # no root privileges on exec, no setuid fix-up, no keeping or raising: each locked
OUTPUT_LIMIT_BYTES = 64 << 20
KEEPER_FAILED = 121  # the job could not be set up (its output says why)
_libc = ctypes.CDLL(None, use_errno=True)
PRIVILEGED = False  # set at start: see privileged()


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(), flags,
                       data and data.encode()), f"mount {target}")


def privileged() -> bool:
    """Whether this process may make namespaces and mount in them without a user namespace of its own (CAP_SYS_ADMIN,
    CAP_SETPCAP and CAP_NET_ADMIN effective: a server bubblewrap started as root with those three kept)."""
    with open("/proc/self/status") as f:
        effective = int(next(line for line in f if line.startswith("CapEff:")).split()[1], 16)
    return all(effective & (1 << cap) for cap in (CAP_SYS_ADMIN, CAP_SETPCAP, CAP_NET_ADMIN))


def enter_namespaces(privileged_server: bool) -> None:
    """New mount, PID, IPC and network namespaces for the calling, single-threaded process (the PID namespace is its
    next child's), and a new user namespace (the same uid and gid inside) unless the server is privileged: a proc
    mounted in a user namespace needs a /proc with nothing mounted over it, which bubblewrap's is not."""
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET
    _check(_libc.unshare(flags if privileged_server else flags | CLONE_NEWUSER), "unshare")
    if privileged_server:
        return
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def restrict_view(readable: list[str], writable: list[str], hidden: list[str]) -> None:
    """In the job's mount namespace: its own /proc, a tmpfs over each hidden folder (the temporary folders every job
    folder lives in), and the readable folders (read-only) and the writable ones bound back, parents first."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    kept = sorted([(p, True) for p in readable if os.path.isdir(p)] + [(p, False) for p in writable],
                  key=lambda item: len(item[0]))
    handles = [(path, read_only, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path, read_only in kept]
    for folder in hidden:
        _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for path, read_only, fd in handles:
        os.makedirs(path, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        if read_only:
            _mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.close(fd)


def loopback_up() -> None:
    """The job's network namespace gets its loopback interface up (as bubblewrap's --unshare-net does): a
    distributed replay's ranks meet there; nothing outside the job is reachable."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def drop_privileges() -> None:
    """No capability left, none to gain by exec (bounding set emptied, root's exec privileges off and locked, no new
    privileges): what bubblewrap leaves a child it starts as root."""
    for cap in range(CAP_LAST + 1):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != errno.EINVAL:
            _check(-1, f"drop capability {cap}")
    _check(_libc.prctl(PR_SET_SECUREBITS, SECUREBITS_LOCKED_NOROOT, 0, 0, 0), "securebits")
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "ambient capabilities")
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: empty, twice (capabilities 0-31, 32-63)
    _check(_libc.capset(header, data), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no new privileges")


def _status_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def init_job(request: dict, fds: list[int], jobs_code: dict) -> None:
    """The job's first process (PID 1 of its PID namespace when isolating): its output, its view of the files, no
    privileges; then it forks the job's process, reaps until that one ends and exits with its status (128 + N for
    signal N). Never returns."""
    code = KEEPER_FAILED
    try:
        if request["stdio"]:
            for target, fd in zip((0, 1, 2), fds, strict=True):
                os.dup2(fd, target)
            kept = []
        else:
            log = os.open(os.path.join(request["job_dir"], "output.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                          0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            kept = fds
        for low, high in zip([3, *(fd + 1 for fd in kept)], [*kept, 65536], strict=True):  # all but the kept
            os.closerange(low, high)
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
        if request["isolate"]:
            restrict_view(request["readable"], [request["job_dir"], *request["writable"]], request["hidden"])
            loopback_up()
            drop_privileges()
        _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "not dumpable")  # the job's process cannot trace it
        if not (request["worker"] or request["module"]):  # the server's start-up probe: the isolation holds
            os._exit(0)
        job = os.fork()
        if job == 0:
            run_job(request, kept, jobs_code)
        for fd in (0, 1, 2, *kept):
            os.close(fd)
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == job:
                code = _status_code(status)
                break
    except BaseException as exc:  # noqa: BLE001 - printed to the job's output, which the parent reads
        print(f"warm worker: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    os._exit(code)


def run_job(request: dict, kept: list[int], jobs_code: dict) -> None:
    """The job's process: its limits, its folder, its environment; then the worker's main or the module as
    ``__main__``. Never returns."""
    code = KEEPER_FAILED
    try:
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
        _check(_libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")
        timeout = float(request["timeout_s"])
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (OUTPUT_LIMIT_BYTES, OUTPUT_LIMIT_BYTES))
        resource.setrlimit(resource.RLIMIT_CPU, (int(2 * timeout) + 60, int(2 * timeout) + 60))
        if request["memory_bytes"]:
            resource.setrlimit(resource.RLIMIT_AS, (request["memory_bytes"], request["memory_bytes"]))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # from the job's TMPDIR, or set by the worker under the job folder
        if request["module"]:
            os.environ["WORKBENCH_WARM_JOB"] = "1"  # the module may fork what it would start as new interpreters
            sys.argv = [request["module"]]
            try:
                runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        else:
            code = jobs_code[request["worker"]].main(request["job_dir"], kept[0])
    except BaseException as exc:  # noqa: BLE001 - printed to the job's output, which the parent reads
        print(f"warm worker: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 0)


def start_job(request: dict, fds: list[int], jobs_code: dict, server_fds: list[int]) -> int:
    """Fork the job's keeper; returns its pid. The keeper (in its own session, with new namespaces when isolating)
    forks the job's first process, waits for it and exits with its status."""
    pid = os.fork()
    if pid:
        return pid
    try:
        signal.set_wakeup_fd(-1)  # the server's SIGCHLD wake-up is not the job's: default dispositions from here
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in server_fds:
            os.close(fd)
        os.setsid()
        if request["isolate"]:
            enter_namespaces(PRIVILEGED)
        child = os.fork()
        if child == 0:
            init_job(request, fds, jobs_code)
        for fd in fds:
            os.close(fd)
        _, status = os.waitpid(child, 0)
        os._exit(_status_code(status))
    except BaseException as exc:  # noqa: BLE001
        print(f"warm worker keeper: {type(exc).__name__}: {exc}", file=sys.stderr)
        os._exit(KEEPER_FAILED)


def load(files: list[str], modules: list[str]) -> dict:
    """Import torch and triton with what their first op imports lazily, the worker files (by path; they import only
    the standard library at module level) and the modules; returns the workers by file."""
    import torch
    import torch.autograd.graph
    import torch.autograd.profiler  # noqa: F401
    import triton
    import triton.compiler
    import triton.language  # noqa: F401
    from triton.runtime import jit  # noqa: F401

    if os.environ.get("TRITON_INTERPRET") == "1":
        from triton.runtime import interpreter  # noqa: F401
    workers = {}
    for i, path in enumerate(files):
        spec = importlib.util.spec_from_file_location(f"warm_worker_{i}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        workers[path] = module
    for name in modules:
        importlib.import_module(name)
    torch.empty(2, 2).reshape(4).clone().sum()  # the lazy imports of a first op
    del triton
    return workers


def serve(path: str, files: list[str], modules: list[str]) -> None:
    global PRIVILEGED
    PRIVILEGED = privileged()
    workers = load(files, modules)
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        sys.exit(f"the server has {threads} threads after its imports: forking it is unsafe")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    ended_read, ended_write = os.pipe()  # a keeper's end wakes the loop: SIGCHLD writes a byte here
    os.set_blocking(ended_write, False)
    signal.set_wakeup_fd(ended_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector.register(ended_read, selectors.EVENT_READ)
    own_fds = [listener.fileno(), ended_read, ended_write]
    jobs: dict[int, dict] = {}  # keeper pid -> {"conn", "deadline", "timed_out"}
    print("ready", flush=True)
    while True:
        now = time.monotonic()
        wait = min([1.0, *(max(0.0, j["deadline"] - now) for j in jobs.values())])
        for key, _ in selector.select(wait):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                _accept(conn, jobs, workers, own_fds + [j["conn"].fileno() for j in jobs.values()], selector)
            elif key.fileobj == ended_read:
                os.read(ended_read, 4096)
            else:  # a parent gave up on its job (closed its end): the job ends
                pid = key.data
                if pid in jobs and not key.fileobj.recv(1, socket.MSG_PEEK):
                    _kill(pid)
        now = time.monotonic()
        for pid, job in jobs.items():
            if not job["timed_out"] and now > job["deadline"]:
                job["timed_out"] = True
                _kill(pid)
        _reap(jobs, selector)


def _accept(conn, jobs, workers, server_fds, selector) -> None:
    fds = []
    try:
        message, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        while not message.endswith(b"\n"):
            chunk = conn.recv(1 << 16)
            if not chunk:
                raise ValueError("the request ended early")
            message += chunk
        request = json.loads(message)
        if len(fds) != (3 if request["stdio"] else 1):
            raise ValueError(f"{len(fds)} descriptors passed")
    except (OSError, ValueError, KeyError) as exc:
        print(f"bad request: {exc}", file=sys.stderr, flush=True)
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    pid = start_job(request, fds, workers, server_fds + [conn.fileno()])
    for fd in fds:
        os.close(fd)
    jobs[pid] = {"conn": conn, "deadline": time.monotonic() + float(request["timeout_s"]), "timed_out": False}
    selector.register(conn, selectors.EVENT_READ, pid)


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the keeper's session (without namespaces, the candidate's processes too)
    except ProcessLookupError:
        pass


def _reap(jobs: dict, selector) -> None:
    while jobs:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        job = jobs.pop(pid, None)
        if job is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        answer = {"timeout": True} if job["timed_out"] else {"code": 128 - code if code > 128 else code}
        selector.unregister(job["conn"])
        try:
            job["conn"].sendall((json.dumps(answer) + "\n").encode())
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                raise
        job["conn"].close()


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    path, rest = argv[0], argv[1:]
    modules = [rest[i + 1] for i, arg in enumerate(rest) if arg == "--module"]
    files = [arg for i, arg in enumerate(rest) if arg != "--module" and (i == 0 or rest[i - 1] != "--module")]
    serve(path, files, modules)


if __name__ == "__main__":
    main(sys.argv[1:])
