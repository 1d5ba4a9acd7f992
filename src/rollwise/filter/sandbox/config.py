"""``SandboxConfig``: how model-written code is run (isolation, pool size, per-run limits)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollwise.config import StrictModel


class SandboxConfig(StrictModel):
    """Isolation, worker pool and default limits for running model-written code."""

    isolation: Literal["full", "best_effort"] = Field(
        "full",
        description="full: refuse to run unless every layer works (separate uid, bubblewrap, seccomp, rlimits); "
        "best_effort: use the layers this machine has and log a warning naming the missing ones on every start",
    )
    workers: int = Field(0, ge=0, le=256, description="sandboxed worker processes (0 = one per CPU core)")
    recycle_every: int = Field(500, ge=1, description="replace a worker after this many runs")
    timeout_s: float = Field(5.0, gt=0, le=600, description="default wall-clock limit of one run, seconds")
    memory_mb: int = Field(512, ge=64, le=65536, description="default address-space limit of each process of a run, MiB")
    max_output_bytes: int = Field(1_000_000, ge=1024, description="stdout + stderr kept per run; more stops the run")
    max_file_mb: int = Field(16, ge=1, description="largest file a run may write, MiB (RLIMIT_FSIZE)")
    tmpfs_mb: int = Field(64, ge=4, description="size of the run's private /tmp (all files together), MiB")
    max_processes: int = Field(16, ge=2, le=4096,
                               description="processes and threads per worker (RLIMIT_NPROC); memory is bounded "
                               "by workers x max_processes x memory_mb")
    max_open_files: int = Field(64, ge=16, le=65536, description="open files per process (RLIMIT_NOFILE)")
    python: str = Field(
        "auto",
        description="interpreter run inside the sandbox; it must be readable by the sandbox uid "
        "(auto: this Python if it is, else /usr/bin/python3)",
    )
    uid_base: int = Field(61000, ge=1000, le=2**31 - 100_000,
                          description="as root, workers run as free uids from here up (one per worker)")
