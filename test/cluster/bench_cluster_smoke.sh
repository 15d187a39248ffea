#!/usr/bin/env bash
# dcr-bench-cluster --quick --json on a 2 + 2 node testbed (small model, one
# change rate): every row has the keys docs/benchmarks.md promises and is
# consistent in itself (speedup = reference / refit, V_cross >= V_payload,
# lower bounds within the window, the transport bound the larger of the
# owners' payload writes and the nodes' payload reads), and the object store's
# indexed row moved fewer bytes across the links than its fetch-all row (each
# rollout node fetches only its experts' payloads), every refit was verified
# against a dense load, and each row reports the peak resident set and held
# bytes of the rollout nodes and the coordinator's peak (the owners' where
# they record them). Timings are not judged.
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
keys = ["transport", "fetch", "change_pct", "refit_s", "reference_s", "speedup", "ideal_speedup",
        "v_payload_bytes", "v_cross_bytes", "link_mbit_s", "construction_lb_s",
        "transport_lb_s", "upload_lb_s", "fetch_lb_s", "finalization_s", "refit_over_bound",
        "window_from", "verified", "owner_peak_rss_bytes", "owner_owned_bytes", "owner_held_bytes",
        "rollout_peak_rss_bytes", "rollout_held_bytes", "coordinator_peak_rss_bytes"]
for r in rows:
    for k in keys:
        assert k in r, "row lacks " + k
    assert r["transport"] in ("object_store", "relay_tree"), r["transport"]
    assert r["fetch"] in ("all", "indexed"), r["fetch"]
    assert r["refit_s"] > 0 and r["reference_s"] > 0, r
    assert abs(r["speedup"] - r["reference_s"] / r["refit_s"]) <= 1e-3 * r["speedup"], r
    assert r["v_payload_bytes"] > 0, "no payload was uploaded"
    # every payload crosses a training link once, and with fetch all each rollout link once
    nodes = r["rollout_nodes"] if r["fetch"] == "all" else 0
    assert r["v_cross_bytes"] >= r["v_payload_bytes"] * (1 + nodes), r
    assert r["v_cross_bytes"] < r["checkpoint_bytes"] * (1 + r["rollout_nodes"]), \
        "a refit at a few percent moved more than the whole checkpoint"
    for k in ("construction_lb_s", "transport_lb_s"):
        assert 0 < r[k] <= r["refit_s"] + 1e-6, (k, r)
    # the transport bound is the larger of the owners' writes and the nodes' reads
    assert r["fetch_lb_s"] > 0 and r["upload_lb_s"] > 0, r
    assert abs(r["transport_lb_s"] - max(r["upload_lb_s"], r["fetch_lb_s"])) <= 1e-9, r
    assert 0 <= r["finalization_s"] <= r["refit_s"], r
    # the owners record their comparison: the window opens at the first one
    assert r["window_from"] == "compare", r
    assert r["verified"] is True, "the refit was not verified against a dense load"
    # a rollout node holds at least its receivers' storage, resident during the refit
    assert r["rollout_held_bytes"] > 0 and r["rollout_peak_rss_bytes"] > 0, r
    assert r["coordinator_peak_rss_bytes"] > 0, r
    # every owner reports its owned shard bytes, what it holds (shards and
    # trackers: at least as much) and its peak
    assert r["owner_owned_bytes"] > 0 and r["owner_peak_rss_bytes"] > 0, r
    assert r["owner_held_bytes"] >= r["owner_owned_bytes"], r
    assert abs(r["refit_over_bound"] - r["refit_s"] / (max(r["construction_lb_s"],
               r["transport_lb_s"]) + r["finalization_s"])) <= 1e-3 * r["refit_over_bound"], r
before = {(r["transport"], r["change_pct"]): r for r in rows if r["fetch"] == "all"}
after = [r for r in rows if r["fetch"] == "indexed"]
assert after, "no indexed row"
for r in after:
    b = before[(r["transport"], r["change_pct"])]
    assert r["v_cross_down_bytes"] < b["v_cross_down_bytes"], ("indexed fetch moved no fewer bytes", r, b)
    assert abs(r["v_cross_over_fetch_all"] - r["v_cross_bytes"] / b["v_cross_bytes"]) <= 1e-3, r
svg = open(sys.argv[2]).read()
assert svg.startswith("<svg") and "construction" in svg and "<rect" in svg, "bad SVG"
print("PASS:", len(rows), "row(s);", ", ".join(
    "%s fetch %s %g%%: refit %.2f s, V_cross %.2f MB, reference %.2f s" % (
        r["transport"], r["fetch"], r["change_pct"], r["refit_s"], r["v_cross_bytes"] / 1e6,
        r["reference_s"]) for r in rows))
PY
