#!/usr/bin/env bash
# dcr-bench-cluster --quick --json on a 2 + 2 node testbed (small model, one
# change rate): every row has the keys docs/benchmarks.md promises and is
# consistent in itself (speedup = reference / refit, V_cross >= V_payload,
# lower bounds within the window, the transport bound the larger of the
# owners' payload writes and the nodes' payload reads). Timings are not judged.
#   bench_cluster_smoke.sh TESTBED_SH BENCH_EXE EXAMPLES_DIR
set -uo pipefail
testbed=$1 bench=$2 bin=$3
out=$(mktemp)
trap 'rm -f "$out" "$out.svg"' EXIT
bash "$testbed" run --name dcrtb-bsmoke --subnet 10.79 --train 2 --roll 2 --rate 500mbit \
  --services etcd,s3 -- "$bench" --quick --json --bin "$bin" --svg "$out.svg" >"$out"
rc=$?
[ "$rc" -eq 77 ] && { echo "skip: no testbed here"; exit 77; }
[ "$rc" -eq 0 ] || { echo "FAIL: the bench exited $rc"; cat "$out"; exit 1; }
# testbed.sh prints the layout first; the bench's JSON is its one line starting with '{'.
python3 - "$out" "$out.svg" <<'PY'
import json, sys
d = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
rows = d["rows"]
assert rows, "no rows"
keys = ["transport", "change_pct", "refit_s", "reference_s", "speedup", "ideal_speedup",
        "v_payload_bytes", "v_cross_bytes", "link_mbit_s", "construction_lb_s",
        "transport_lb_s", "upload_lb_s", "fetch_lb_s", "finalization_s", "refit_over_bound"]
for r in rows:
    for k in keys:
        assert k in r, "row lacks " + k
    assert r["transport"] in ("object_store", "relay_tree"), r["transport"]
    assert r["refit_s"] > 0 and r["reference_s"] > 0, r
    assert abs(r["speedup"] - r["reference_s"] / r["refit_s"]) <= 1e-3 * r["speedup"], r
    assert r["v_payload_bytes"] > 0, "no payload was uploaded"
    # every payload crosses a training link once and each rollout link once
    assert r["v_cross_bytes"] >= r["v_payload_bytes"] * (1 + r["rollout_nodes"]), r
    assert r["v_cross_bytes"] < r["checkpoint_bytes"] * (1 + r["rollout_nodes"]), \
        "a refit at a few percent moved more than the whole checkpoint"
    for k in ("construction_lb_s", "transport_lb_s"):
        assert 0 < r[k] <= r["refit_s"] + 1e-6, (k, r)
    # the transport bound is the larger of the owners' writes and the nodes' reads
    assert r["fetch_lb_s"] > 0 and r["upload_lb_s"] > 0, r
    assert abs(r["transport_lb_s"] - max(r["upload_lb_s"], r["fetch_lb_s"])) <= 1e-9, r
    assert 0 <= r["finalization_s"] <= r["refit_s"], r
    assert abs(r["refit_over_bound"] - r["refit_s"] / (max(r["construction_lb_s"],
               r["transport_lb_s"]) + r["finalization_s"])) <= 1e-3 * r["refit_over_bound"], r
svg = open(sys.argv[2]).read()
assert svg.startswith("<svg") and "construction" in svg and "<rect" in svg, "bad SVG"
print("PASS:", len(rows), "row(s);", ", ".join(
    "%s %g%%: refit %.2f s, reference %.2f s" % (r["transport"], r["change_pct"], r["refit_s"],
                                                r["reference_s"]) for r in rows))
PY
