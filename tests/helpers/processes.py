"""Waiting on a subprocess, and a free SLURM job id for the tests that launch one."""

from __future__ import annotations

import random
import socket
import subprocess
import time


def wait_for(pred, proc: subprocess.Popen, timeout: float, poll: float) -> bool:
    """Whether ``pred()`` came true within ``timeout`` seconds while ``proc`` ran (False as soon as it exits)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(poll)
    return False


def free_slurm_job_id() -> str:
    """A SLURM job id whose derived MASTER_PORT (20000 + id % 20000) is free now.

    Kept below the kernel's ephemeral range (32768+), where other tests' gloo connections could hold it.
    """
    while True:
        job = random.randint(1, 12767)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", 20000 + job))
                return str(job)
            except OSError:
                continue
