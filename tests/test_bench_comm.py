"""The topology benchmark runs end to end (tiny sizes) and its link model is what its docstring says."""

import json

from benchmarks.comm_topologies import link_model_seconds, main


def test_topology_benchmark_smoke(tmp_path):
    main(["--rows", "60", "--parties", "3", "--repeats", "1", "--output-dir", str(tmp_path),
          "--dataset", "breast_cancer"])
    table = json.loads((tmp_path / "comm_topologies.json").read_text())["table"]
    assert {(r["parties"], r["structure"], r["op"]) for r in table} >= {(3, "ring", "allreduce"), (3, "tree", "reduce")}
    for r in table:
        if r["op"] == "allreduce":
            # every structure's all-reduce moves 2 (Q - 1) matrices in total
            assert r["bytes_total"] == 2 * (r["parties"] - 1) * r["matrix_bytes"]
    assert (tmp_path / "comm_topologies.png").exists()


def test_link_model():
    one = 1e9 / 8   # a matrix that takes one second at 1 Gbit/s
    assert link_model_seconds("tree", 8, one) == 6.0
    assert link_model_seconds("star", 8, one) == 14.0
    assert link_model_seconds("ring", 8, one) == 2 * 7 / 8
