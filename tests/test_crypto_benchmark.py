"""The Paillier benchmark runs end to end (tiny insecure key, one repeat) and writes the documented JSON."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_benchmark_smoke(tmp_path):
    out = tmp_path / "paillier.json"
    cmd = [sys.executable, "-m", "benchmarks.paillier", "--key-sizes", "512", "--insecure", "--quick",
           "--no-parallel", "--repeats", "1", "--output-json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    ops = res["key_sizes"]["512"]["ops"]
    for op in ("add_ct_ct", "add_ct_plain", "mul_scalar_16bit", "decrypt"):
        assert {"vfltorch_per_s", "phe_per_s", "ratio"} <= set(ops[op])
    enc = ops["encrypt"]
    assert {"vfltorch_online_per_s", "vfltorch_offline_djn_per_s", "vfltorch_total_djn_per_s", "phe_per_s",
            "ratio_online", "ratio_total_djn"} <= set(enc)
    rnd = res["key_sizes"]["512"]["gradient_round"]
    assert rnd["rows"] == 1000 and rnd["features"] == 23
    assert rnd["vfltorch_max_abs_error"] < 1e-2 and rnd["phe_s"] > 0 and rnd["ratio_online"] > 0
    assert "scaled" in rnd["phe_note"]
    assert {"gmpy2", "obfuscator_pool", "short_exponents", "crt_decryption", "bucket_multiexp",
            "packing"} <= set(res["key_sizes"]["512"]["levers"])


def test_small_keys_need_the_insecure_flag():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.paillier", "--key-sizes", "512", "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "insecure" in proc.stderr
