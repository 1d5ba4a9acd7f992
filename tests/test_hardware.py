"""rollwise.hardware: detection parses fixed /proc/cpuinfo samples of each kind (issue 34, item 1),
and the kernel micro-benchmark is cached per machine under a directory the test owns."""

import json
from pathlib import Path

import pytest

from rollwise.hardware import CPUINFO_ENV, FLAGS, Shapes, bf16_speedup, cpu_info, cpu_record, native_bf16

SAMPLES = Path(__file__).parent / "fixtures" / "cpuinfo"


@pytest.mark.parametrize("name, model, flags, cores, bf16", [
    ("avx2_epyc.txt", "AMD EPYC", {"avx2"}, 2, False),
    ("avx512_bf16_genoa.txt", "AMD EPYC 9654 96-Core Processor",
     {"avx2", "avx512f", "avx512_bf16", "avx512_vnni"}, 4, True),
    ("amx_sapphire_rapids.txt", "Intel(R) Xeon(R) Platinum 8480+",
     {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_vnni"}, 4, True),
    ("avx512_cascade_lake.txt", "Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz",
     {"avx2", "avx512f", "avx512_vnni"}, 2, False),
    ("aarch64_graviton.txt", None, set(), 2, False),  # ARM's "bf16" feature is not an x86 flag
])
def test_detection_parses_each_kind_of_sample(name, model, flags, cores, bf16):
    info = cpu_info(SAMPLES / name)
    if model is not None:
        assert info.model == model
    assert info.flags == frozenset(flags) and info.cores == cores
    assert native_bf16(info) is bf16


def test_no_cpuinfo_claims_no_feature(tmp_path):
    info = cpu_info(tmp_path / "missing")
    assert info.flags == frozenset() and not native_bf16(info) and info.cores >= 1


def test_the_environment_variable_moves_the_default(monkeypatch):
    monkeypatch.setenv(CPUINFO_ENV, str(SAMPLES / "amx_sapphire_rapids.txt"))
    assert native_bf16(cpu_info())
    rec = cpu_record()
    assert rec["model"] == "Intel(R) Xeon(R) Platinum 8480+" and rec["native_bf16"] and rec["cores"] == 4
    assert set(rec["flags"]) <= set(FLAGS) and "torch" in rec


def test_benchmark_is_measured_once_per_machine_and_shapes(tmp_path):
    calls = []

    def measure(shapes):
        calls.append(shapes)
        return 2.5

    genoa, avx2 = cpu_info(SAMPLES / "avx512_bf16_genoa.txt"), cpu_info(SAMPLES / "avx2_epyc.txt")
    shapes = Shapes(64, 256, 1000)
    assert bf16_speedup(shapes, genoa, tmp_path, measure) == 2.5
    assert bf16_speedup(shapes, genoa, tmp_path, measure) == 2.5  # from the cache
    assert len(calls) == 1
    bf16_speedup(Shapes(64, 256, 2000), genoa, tmp_path, measure)  # other shapes: measured
    bf16_speedup(shapes, avx2, tmp_path, measure)  # another CPU: measured
    assert len(calls) == 3
    keys = json.loads((tmp_path / "kernels.json").read_text())
    assert len(keys) == 3 and all("torch" in k for k in keys)


def test_the_real_measurement_runs(tmp_path):
    ratio = bf16_speedup(Shapes(32, 64, 128, rows=4), cpu_info(SAMPLES / "avx2_epyc.txt"), tmp_path)
    assert ratio > 0  # a ratio, whatever this CPU makes of bf16 (never asserted faster or slower)


def test_every_benchmark_json_records_the_cpu(tmp_path):
    from rollwise.bench.harness import write_json

    write_json(tmp_path / "bench.json", {"ratio": 2.0})
    out = json.loads((tmp_path / "bench.json").read_text())
    assert out["ratio"] == 2.0 and out["cpu"]["model"] == "AMD EPYC"  # conftest's pinned sample
    write_json(tmp_path / "own.json", {"cpu": "recorded by the bench itself"})
    assert json.loads((tmp_path / "own.json").read_text())["cpu"] == "recorded by the bench itself"
