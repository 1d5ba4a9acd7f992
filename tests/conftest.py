"""Suite-wide settings and the shared tiny-model fixture.

Torch runs one intra-op thread in tests, and in the processes they start (``OMP_NUM_THREADS=1``:
``rollwise train`` killed and resumed, servers): the models are tiny, and with two threads beside
any other busy process (CI's second job, the other pytest-xdist worker) small matmuls slow down by
orders of magnitude from oversubscription (measured here: 0.17 s → 58 s for one tree-rollout test).

Property tests are reproducible: the ``ci`` hypothesis profile (the default, so ``make test``
and CI use it) derandomizes — the examples are derived from each test's source, so a commit
gives the same verdict on every run — with no example database and no deadline (a verdict
never depends on timing). ``HYPOTHESIS_PROFILE=dev`` explores fresh random examples; a
failing example found that way becomes an explicit ``@example`` on the test.

The CPU is pinned: ``rollwise.hardware`` reads a fixed AVX2-only cpuinfo sample in every test
(and its subprocesses), so ``rollout.engine_dtype: auto`` is fp32 and every verdict is the same
on AVX2 and AVX-512 machines; tests that want another CPU pass a sample themselves. Its
benchmark cache goes to a temporary directory, never ~/.cache.
"""

import os
import shutil
import tempfile

import pytest
import torch
from hypothesis import settings
from once import once, shared_root
from tinymodel import tiny_redrawn

torch.set_num_threads(1)
os.environ["OMP_NUM_THREADS"] = "1"  # read by torch in every process a test starts
os.environ["ROLLWISE_CPUINFO"] = os.path.join(os.path.dirname(__file__), "fixtures", "cpuinfo", "avx2_epyc.txt")


@pytest.fixture(scope="session", autouse=True)
def _kernel_cache(tmp_path_factory):
    os.environ["ROLLWISE_CACHE_DIR"] = str(tmp_path_factory.mktemp("rollwise-cache"))

settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="module")
def tiny():
    """(model, tokenizer): the tiny preset, matrices re-drawn (tests/tinymodel.py). Files may override."""
    return tiny_redrawn()


@pytest.fixture(scope="session")
def warm(tmp_path_factory):
    """A tiny model after 150 SFT steps on 1-digit arith (its saved directory): its groups come
    back mixed, so RL steps carry real gradients. Shared by the loop-level test files, and built
    once for all the workers of a parallel run (tests/once.py)."""
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    def build(out):
        cfg = load_run_config(None, [f"output_dir={out}", "name=warm", "task.max_digits=1", "task.eval_size=8",
                                     "model.threads=1", "sft.steps=150", "train.steps=0"])
        with Trainer(cfg) as t:
            t.prepare()

    return once(shared_root(tmp_path_factory), "warm", build) / "warm" / "init_model"


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster for the session (dist/ tests), its files in a temporary directory of
    its own; yields its address. Skips when the ray extra is not installed or a local cluster
    cannot start here (it needs local sockets and shared memory), saying why."""
    ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'rollwise[ray]'")
    tmp = tempfile.mkdtemp(prefix="rw-ray-")  # short: Ray's socket paths must fit 107 characters
    saved = {k: os.environ.get(k) for k in ("RAY_TMPDIR", "RAY_AUTH_MODE", "RAY_ADDRESS",
                                            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}

    def restore():
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)

    os.environ.update(RAY_TMPDIR=tmp, RAY_AUTH_MODE="disabled")  # no token written to ~/.ray
    os.environ.pop("RAY_ADDRESS", None)
    from rollwise.dist.pool import loopback_only

    loopback_only()  # the test cluster listens on 127.0.0.1 only
    try:
        ray.init(num_cpus=4, include_dashboard=False, configure_logging=False)
    except Exception as err:  # noqa: BLE001 — e.g. a container that forbids its sockets or shared memory
        restore()
        pytest.skip(f"a local Ray cluster cannot start on this machine: {type(err).__name__}: {err}")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
    restore()
