"""A real subprocess with its output in a log file: started, polled until its HTTP endpoint answers (or it
dies, with its log's tail in the failure), and stopped by its own PID: SIGTERM first, SIGKILL after a grace."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx

from support.waiting import wait_for


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """Whether `url` answers 200 now (a refused or timed-out connection is a no)."""
    try:
        return httpx.get(url, timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def client_per_process(
    base_url: str,
    pid_of: Callable[[httpx.Client], int],
    count: int = 2,
    tries: int = 200,
    timeout: float = 60,
) -> dict[int, httpx.Client]:
    """One keep-alive client for each of `count` processes sharing a port (SO_REUSEPORT), keyed by the pid
    that `pid_of` reads over the connection: fresh connections until the kernel has given one to each."""
    found: dict[int, httpx.Client] = {}
    for _ in range(tries):
        client = httpx.Client(base_url=base_url, timeout=timeout)
        pid = pid_of(client)
        if pid in found:
            client.close()
        else:
            found[pid] = client
        if len(found) == count:
            return found
    raise AssertionError(f"{tries} connections reached only the processes {list(found)} of {count}")


def descendants(pid: int) -> set[int]:
    """Every process below `pid` now (children, their children, ...)."""
    kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    found = {int(k) for k in kids}
    for kid in list(found):
        found |= descendants(kid)
    return found


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except OSError:
        return False


class Process:
    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        new_session: bool = False,
        name: str | None = None,
    ) -> None:
        """`new_session`: the process leads its own process group, so a terminal's signals miss it."""
        self.argv = [str(a) for a in argv]
        self.name = name or Path(self.argv[0]).name
        if log_path is None:
            log_path = Path(tempfile.mkstemp(prefix=f"skiff-test-{self.name}-", suffix=".log")[1])
        self.log_path = log_path
        with open(log_path, "wb") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=None if env is None else dict(env),
                start_new_session=new_session,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def log(self, chars: int | None = 6000) -> str:
        """The end of the process' output so far (all of it with chars=None)."""
        text = self.log_path.read_text(errors="replace")
        return text if chars is None else text[-chars:]

    def wait_http_ok(
        self, url: str, timeout: float, *, interval: float = 0.3, request_timeout: float = 2.0
    ) -> None:
        """Poll `url` until it answers 200. Fails at once, with the log's tail, if the process exits."""

        def answered() -> bool:
            if not self.running:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
            return http_ok(url, request_timeout)

        wait_for(
            answered, timeout, f"{url} ({self.name}) to answer 200", interval=interval, log=self.log_path
        )

    def terminate(self) -> None:
        if self.running:
            self.proc.terminate()

    def stop(self, grace: float = 60.0) -> int | None:
        """SIGTERM, then SIGKILL if it is still there after `grace` seconds; returns the exit code."""
        self.terminate()
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        return self.proc.returncode


def stop_all(procs: Sequence[Process], grace: float) -> None:
    """SIGTERM to every one first, then each one's stop: their shutdowns overlap."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.stop(grace)
