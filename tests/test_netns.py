"""The real multi-organisation command across simulated hosts (network namespaces, rate-limited veth links).

Each party runs `vfl fdskl --federation fed.json --party NAME --identity KEY` inside its own
namespace with its own 10.218.0.x address; the result must equal the loopback (gloo) run.
Needs root: skipped, with the reason, elsewhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vfltorch.comm import federation_file as ff
from vfltorch.comm import netns
from vfltorch.comm.identity import generate

OK, WHY = netns.available()
pytestmark = pytest.mark.skipif(not OK, reason=f"cannot build network namespaces here: {WHY}")

REPO = Path(__file__).resolve().parents[1]
FDSKL = ["fdskl", "--dataset", "breast_cancer", "--mask-seed", "seed", "--epochs", "1", "--quiet"]


def _env():
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "VFLTORCH_TIMEOUT": "120"}


def _federation(tmp_path, hosts, names, port=29418):
    """The first name is the active party; a name "dealer" is the coordinator (FDSKL's default protocol needs one)."""
    keys, parties = {}, []
    for i, name in enumerate(names):
        ident = generate(name, tmp_path / f"{name}.pem")
        keys[name] = ident.path
        role = "active" if i == 0 else "coordinator" if name == "dealer" else "passive"
        parties.append(dict(name=name, rank=i, role=role,
                            address=f"{hosts.addresses[i]}:{port}", fingerprint=ident.fingerprint,
                            certificate=f"{name}.crt"))
    return ff.write(tmp_path / "fed.json", parties, federation="netns-test"), keys


def _run_parties(hosts, path, keys, names, argv, out_json, after_first=None):
    procs = []
    for i, name in enumerate(names):
        if i == 1 and after_first is not None:
            after_first()   # party 0 is starting; the others wait until this returns
        extra = ["--output-json", str(out_json)] if i == 0 else []
        cmd = hosts.exec_prefix(i) + [sys.executable, "-m", "vfltorch", *argv, "--federation", str(path),
                                      "--party", name, "--identity", str(keys[name]), *extra]
        procs.append(subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=400) for p in procs]
    return [(p.returncode, o, e) for p, (o, e) in zip(procs, outs)]


def _equals_loopback(hosts_rec, argv, tmp_path, loss_rel=3e-2):
    loop = subprocess.run([sys.executable, "-m", "vfltorch", *argv, "--parties", "2", "--output-json",
                           str(tmp_path / "loopback.json")], env=_env(), capture_output=True, text=True, timeout=400)
    assert loop.returncode == 0, loop.stderr[-2000:]
    loop_rec = json.loads((tmp_path / "loopback.json").read_text())
    assert hosts_rec["config"]["backend"] == "tls" and loop_rec["config"]["backend"] == "gloo"
    # The dealer's masks are private (OS entropy) in both runs and the fixed-point rounding depends on them,
    # so the two runs agree to rounding (docs/fdskl.md, "Reproducibility"), not bit for bit. Two loopback runs
    # of this command differ as much: the last batch's loss by about 1% (0.2616-0.2642 in three runs under the
    # default pipelined step), the test AUC by 2e-4, the accuracy not at all; the byte count is exact.
    assert hosts_rec["metrics"].keys() == loop_rec["metrics"].keys()
    for name, value in loop_rec["metrics"].items():
        if name == "batch_loss":
            if loss_rel is not None:
                assert hosts_rec["metrics"][name] == pytest.approx(value, rel=loss_rel, abs=1e-4), name
        elif name == "bytes_per_iteration":
            assert hosts_rec["metrics"][name] == value, name
        else:   # test accuracy / error / AUC on 143 rows: within one row
            assert hosts_rec["metrics"][name] == pytest.approx(value, abs=0.0071), name
    assert hosts_rec["comm"]["0"]["bytes_sent"] == loop_rec["comm"]["0"]["bytes_sent"]


@pytest.mark.slow          # the 1 Mbit/s test below runs the same comparison in the default run
def test_fdskl_across_simulated_hosts_equals_the_loopback_run(tmp_path):
    # Two data parties and the dealer of FDSKL's default (shared) protocol, each on its own host.
    names = ["bank", "shop", "dealer"]
    with netns.SimulatedHosts(3, rate="1gbit") as hosts:
        path, keys = _federation(tmp_path, hosts, names)
        runs = _run_parties(hosts, tmp_path / "fed.json", keys, names, FDSKL, tmp_path / "hosts.json")
    # Every party's tail on failure: the first party to fail often only names the one that died.
    assert all(rc == 0 for rc, _, _ in runs), "\n".join(f"{n} (rc {rc}): {err[-1500:]}" for n, (rc, _, err) in zip(names, runs))
    _equals_loopback(json.loads((tmp_path / "hosts.json").read_text()), FDSKL, tmp_path)


@pytest.mark.slow
def test_three_hosts_at_100mbit_and_a_stranger_on_the_switch(tmp_path):
    """Three organisations at 100 Mbit/s; a fourth host with its own key dials the bank and is refused."""
    names = ["bank", "shop", "lender", "dealer"]
    with netns.SimulatedHosts(5, rate="100mbit") as hosts:
        path, keys = _federation(tmp_path, hosts, names)
        stranger_key = generate("bank", tmp_path / "stranger" / "bank.pem").path
        script = ("import socket, ssl, time, sys\n"
                  "ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT); ctx.check_hostname = False\n"
                  "ctx.verify_mode = ssl.CERT_NONE; ctx.load_cert_chain(sys.argv[2])\n"
                  "for _ in range(2400):\n"
                  "    try:\n"
                  "        s = socket.create_connection((sys.argv[1], 29418), timeout=5); break\n"
                  "    except OSError: time.sleep(0.05)\n"
                  "try:\n"
                  "    t = ctx.wrap_socket(s); t.sendall(b'x' * 64); print('read', t.recv(64))\n"
                  "except (ssl.SSLError, OSError) as e: print('refused', e)\n")
        said = []

        def stranger():   # dials the bank while it still waits for its peers
            said.append(subprocess.run(hosts.exec_prefix(4) + [sys.executable, "-c", script, hosts.addresses[0],
                                                               str(stranger_key)], capture_output=True, text=True,
                                       timeout=300).stdout)

        runs = _run_parties(hosts, tmp_path / "fed.json", keys, names, FDSKL, tmp_path / "hosts.json",
                            after_first=stranger)
        said = said[0]
    for rc, out, err in runs:
        assert rc == 0, err[-2000:]
    assert "refused" in said or "read b''" in said, said
    rec = json.loads((tmp_path / "hosts.json").read_text())
    assert rec["parties"] == 3 and rec["metrics"]["test_accuracy"] > 0.85


@pytest.mark.slow
def test_link_overhead_benchmark_runs_gloo_and_tls_across_hosts(tmp_path):
    """The benchmark behind docs/benchmarks.md's "What TLS costs" table: both transports, each party on its own host."""
    out = tmp_path / "res"
    run = subprocess.run([sys.executable, "-m", "benchmarks.link_overhead", "--netns", "--rate", "1gbit",
                          "--repeats", "1", "--only", "fdskl", "--fdskl-dataset", "breast_cancer",
                          "--output-dir", str(out)], env=_env(), capture_output=True, text=True, timeout=900, cwd=REPO)
    assert run.returncode == 0, run.stderr[-2000:]
    rec = json.loads((out / "link_overhead_netns.json").read_text())
    (row,) = rec["rows"]
    assert row["place"] == "netns 1gbit" and row["workload"] == "fdskl"
    assert row["gloo_seconds"][0] > 0 and row["tls_seconds"][0] > 0
    assert row["ratio"] == pytest.approx(row["tls_seconds"][0] / row["gloo_seconds"][0])
    assert all(c > 0 for c in row["cpu_seconds"]["gloo"] + row["cpu_seconds"]["tls"])


# slow (20 s): the default run keeps test_organisations (three namespaces at 1 Gbit/s) and test_links' slow peer
# over TLS, waited for beyond the timeout
@pytest.mark.slow
def test_a_slow_organisation_at_1mbit_is_waited_for(tmp_path):
    """The shop's link runs at 1 Mbit/s in both directions while the others have 1 Gbit/s, under a 5 s timeout.

    The run lasts longer than the timeout many times over, and the shop is slow from its first byte (the token
    bucket holds 0.1 s at its rate), yet it is alive: its links carry data or heartbeats, so it is waited for and
    the run ends with the loopback run's result (issue 33: liveness apart from progress). It is also the default
    run's check that TLS across namespaces equals the loopback gloo run."""
    names = ["bank", "shop", "dealer"]
    argv = ["fdskl", "--dataset", "breast_cancer", "--mask-seed", "seed", "--epochs", "1", "--n-components", "128",
            "--quiet", "--timeout", "5", "--join-timeout", "120"]
    with netns.SimulatedHosts(3, rate="1gbit", rates={1: "1mbit"}) as hosts:
        path, keys = _federation(tmp_path, hosts, names, port=29419)
        started = time.monotonic()
        runs = _run_parties(hosts, tmp_path / "fed.json", keys, names, argv, tmp_path / "slow.json")
        took = time.monotonic() - started
    assert all(rc == 0 for rc, _, _ in runs), "\n".join(f"{n} (rc {rc}): {err[-1500:]}" for n, (rc, _, err) in zip(names, runs))
    rec = json.loads((tmp_path / "slow.json").read_text())
    shop_bytes = rec["comm"]["1"]["bytes_sent"] + rec["comm"]["1"].get("bytes_received", 0)
    # At 1 Mbit/s (125 kB/s) the shop's own traffic alone lasts longer than the 5 s timeout.
    print(f"shop moved {shop_bytes} bytes; the run took {took:.1f} s")
    assert shop_bytes / 125e3 > 5.0 and took > 5.0, (shop_bytes, took)
    assert rec["metrics"]["test_accuracy"] > 0.85
    # And the one-machine run's result: accuracy, error and AUC within one test row, the same bytes. Not the last
    # batch's loss: at 128 features it is small and moves with the dealer's rounding (four loopback runs gave
    # 0.0140-0.0163, a clean-clone run here 0.0194 against 0.0151; the accuracy was 0.9225 in each).
    _equals_loopback(rec, argv, tmp_path, loss_rel=None)
