#!/usr/bin/env bash
# The cluster programs on the network-namespace testbed (scripts/testbed.sh),
# 2 training and 2 rollout nodes behind 8 Mbit/s links, objects in the
# storage host's Swift (S3), commit record in its etcd, so every payload
# crosses the shaped links, under one fault scenario:
#  link-faults: step 2: rollout node r0's link down for 2 s as the transition
#    starts (shorter than the control channel's liveness deadline: TCP rides
#    it out, the step takes at least that long and commits); step 3: training
#    node t1's link down for 6 s (longer than the liveness deadline: the
#    attempt fails and an overwrite_all retry commits);
#  s3-restart: at step 2 the S3 proxy is SIGKILLed as the transition starts
#    (owners uploading) and started again 3 s later;
#  loss:       3% of the packets dropped on rollout node r0's and training
#    node t1's links, both directions, for a 3-step run (netem, else an
#    nftables rule in the router namespace; its drop counters must be > 0);
#  delay:      20 ms on every link (needs sch_netem: exit 77 where the kernel
#    has none);
#  relay-link-cut: payloads over the relay tree (--transport relay_tree, root
#    r0, child r1; 32 Mbit/s links, each step changing every element so that
#    a step streams for about a second), 2 steps; at step 2, once an owner
#    has written its first payload into the tree, the root's link (r0) is
#    cut for 2 s: every stream stalls; TCP rides the cut out, or its
#    retransmission backoff outlasts the liveness deadline and an
#    overwrite_all retry commits (either is right). Checked besides: a
#    payload frame to a node was in flight across the whole cut (the nodes'
#    "fetch" intervals on the timeline against the cut's times), the step
#    took at least the cut, and the relay nodes queued and forwarded the
#    payloads.
# Checked: PASS verification (every receiver equals a dense load of the
# committed version byte for byte), one row per committed version 1..N in
# order (nothing committed twice or lost), the fault fired, nothing of the
# testbed left. Exit 77 where namespaces cannot be made or etcd/Swift are
# missing.
set -uo pipefail
bin=$1 scenario=$2
here=$(cd "$(dirname "$0")/../.." && pwd)
name=dcrtb-f$$
work=$(mktemp -d "${TMPDIR:-/tmp}/dcr-testbed-fault-XXXXXX")
trap '[ "${keep:-0}" = 1 ] || rm -rf "$work"' EXIT
steps=3 tb=(--rate 8mbit) cl=()
case "$scenario" in
  link-faults) cl=(--link-down r0:2:2 --link-down t1:3:6) ;;
  s3-restart) cl=(--s3-restart 2:3) ;;
  loss) cl=(--link-loss r0:3 --link-loss t1:3) ;;
  delay) tb+=(--delay 20); steps=2 ;;
  relay-link-cut)
    tb=(--rate 32mbit); steps=2
    cl=(--transport relay_tree --change-pct 100 --link-cut-streaming r0:2:2) ;;
  *) echo "unknown scenario $scenario"; exit 2 ;;
esac
# After the run, still inside the testbed: the loss table's counters.
DCR_CLUSTER_KEEP=1 bash "$here/scripts/testbed.sh" run --name "$name" "${tb[@]}" -- \
  bash -c 'bash "$@"; rc=$?; ip netns exec "$DCR_TB_NAME-router" nft -j list table inet dcr_testbed \
    >"'"$work"'/nft.json" 2>/dev/null; exit $rc' _ \
  "$here/scripts/cluster.sh" --testbed --bin "$bin" --workdir "$work/run" --steps "$steps" \
  "${cl[@]}" --json >"$work/out" 2>"$work/err"
rc=$?
cat "$work/out"
[ "$rc" -eq 77 ] && { tail -n 3 "$work/err"; exit 77; }
fail() {
  keep=1
  echo "(kept: $work)"
  echo "FAIL: $*"
  cat "$work/err"
  for f in "$work"/run/logs/*.log; do echo "== $f"; tail -n 20 "$f"; done
  exit 1
}
[ "$rc" -eq 0 ] || fail "cluster run exited $rc"
left=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -c "^$name-")
[ "$left" -eq 0 ] || fail "$left namespace(s) of the testbed left behind"
case "$scenario" in
  link-faults) [ -e "$work/run/faults/link-r0-2" ] && [ -e "$work/run/faults/link-t1-3" ] ||
    fail "a link fault did not fire" ;;
  s3-restart) [ -e "$work/run/faults/s3-2" ] || fail "the S3 fault did not fire" ;;
  relay-link-cut) [ -e "$work/run/faults/cut-r0-2" ] || fail "the link cut did not fire"
    # Payloads went owners -> node 0 -> node 1 through the relay tree.
    q0=$(grep -o 'relay node 0: [0-9]* payloads queued, [0-9]* frames forwarded' "$work/run/logs/node0.log" | tail -n1)
    q1=$(grep -o 'relay node 1: [0-9]* payloads queued' "$work/run/logs/node1.log" | tail -n1)
    echo "$q0; $q1"
    [ "$(awk '{print $4}' <<<"$q0")" -gt 0 ] && [ "$(awk '{print $7}' <<<"$q0")" -gt 0 ] &&
      [ "$(awk '{print $4}' <<<"$q1")" -gt 0 ] || fail "no payloads through the relay nodes" ;;
  loss) grep -q 'link of r0: 3% packet loss' "$work/err" && grep -q 'link of t1: 3% packet loss' "$work/err" ||
    fail "the loss was not applied" ;;
esac
# Without netem the loss must have gone through nftables: its counters are then
# required, not optional.
if [ "$scenario" = loss ] && [ ! -s "$work/nft.json" ]; then
  probe="$name-probe"
  ip netns add "$probe" || fail "cannot create namespace $probe"
  if ip netns exec "$probe" tc qdisc add dev lo root netem delay 0ms 2>/dev/null; then has_netem=1; else has_netem=0; fi
  ip netns del "$probe"
  [ "$has_netem" -eq 1 ] || fail "no netem and no nftables loss table: the loss was not applied"
fi
/usr/bin/python3 - "$work/out" "$scenario" "$steps" "$work/nft.json" "$work/run" <<'PY' || fail "checks on the JSON rows"
import json, os, sys
out, scenario, steps, nft, run = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
d = json.loads(open(out).read().strip().splitlines()[-1])
rows = d["steps"]
assert d["bit_exact"] is True, d
assert [s["step"] for s in rows] == list(range(1, steps + 1)), rows
msg = ""
if scenario == "link-faults":
    assert rows[1]["refit_s"] >= 2.0, ("step 2 did not wait out the link fault", rows[1])
    assert rows[2]["attempts"] >= 2, ("step 3 did not fail and retry", rows[2])
    msg = "step 2 %.1f s, step 3 %d attempts" % (rows[1]["refit_s"], rows[2]["attempts"])
if scenario == "s3-restart":
    # The proxy was away for 3 s of step 2: it cannot have finished sooner.
    assert rows[1]["refit_s"] >= 2.5, ("step 2 did not wait out the S3 restart", rows[1])
    msg = "step 2 %.1f s, %d attempt(s)" % (rows[1]["refit_s"], rows[1]["attempts"])
if scenario == "relay-link-cut":
    f = open(os.path.join(run, "faults", "cut-r0-2")).read().split()
    down, up = int(f[f.index("down") + 1]), int(f[f.index("up") + 1])
    fetches = [json.loads(l) for l in open(os.path.join(run, "timeline.jsonl"))]
    fetches = [e for e in fetches if e["what"] == "fetch"]
    # A payload frame whose body started arriving before the link was down
    # and finished after it was back: the cut hit the stream, not a pause.
    across = [e for e in fetches if e["t0"] < down and e["t1"] > up]
    assert across, ("no payload frame in flight across the cut", down, up, fetches)
    assert rows[1]["refit_s"] >= 2.0, ("step 2 did not wait out the link cut", rows[1])
    e = across[0]
    msg = "a %d-byte frame to %s in flight %.1f s across the %.1f s cut; step 2 %.1f s, %d attempt(s)" % (
        e["bytes"], e["who"], (e["t1"] - e["t0"]) / 1e9, (up - down) / 1e9, rows[1]["refit_s"],
        rows[1]["attempts"])
if scenario == "loss" and os.path.getsize(nft) > 0:
    drops = {}
    for item in json.load(open(nft))["nftables"]:
        rule = item.get("rule")
        if rule:
            for e in rule["expr"]:
                if "counter" in e:
                    drops[rule["chain"]] = e["counter"]["packets"]
    assert drops.get("loss_r0", 0) > 0 and drops.get("loss_t1", 0) > 0, drops
    assert "loss_t0" not in drops and "loss_r1" not in drops, drops
    msg = "dropped packets %s" % drops
print("testbed cluster %s: PASS (%s)" % (scenario, msg))
PY
