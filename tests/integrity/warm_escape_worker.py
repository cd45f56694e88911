"""A sandbox worker that is its own candidate, with no audit hook: it tries, with the namespaces alone in its way,
everything a job of the warm worker must not do, reports what it saw on the result pipe, then leaves processes
behind (tests/integrity/test_warm.py)."""

import json
import os
import signal
import socket
import time


def main(job_dir: str, result_fd: int) -> int:
    with open(os.path.join(job_dir, "targets.json")) as f:
        targets = json.load(f)
    report = {"tmp": sorted(os.listdir("/tmp")), "cwd": os.getcwd(),
              "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()), "self": os.getpid()}
    try:
        with open(targets["other_secret"]) as f:
            report["other_secret"] = f.read()
    except OSError as exc:
        report["other_secret"] = None
        report["other_secret_error"] = exc.strerror
    try:
        with open(targets["outside"], "w") as f:
            f.write("escaped")
        report["wrote_outside"] = True
    except OSError:
        report["wrote_outside"] = False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(targets["server_socket"])
            conn.sendall(b"{not json\n")
        report["reached_server"] = True
    except OSError:
        report["reached_server"] = False
    killed = []
    for pid in report["pids"]:
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
    report["killed"] = killed
    try:
        with open(f"/proc/{os.getppid()}/mem", "rb") as mem:
            mem.read(1)
        report["read_parent_memory"] = True
    except OSError:
        report["read_parent_memory"] = False
    os.write(result_fd, json.dumps(report).encode())
    for _ in range(targets["children"]):  # left running, each holding the result pipe open
        if os.fork() == 0:
            time.sleep(3600)
            os._exit(0)
    return 0
