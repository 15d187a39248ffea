#!/usr/bin/env bash
# One crash scenario of a local cluster of real processes (scripts/cluster.sh:
# 2 owners, 2 rollout nodes x 2 receivers, the small model), by name:
#   receiver-mid-apply       a rollout process SIGKILLed mid-apply, restarted, restores
#   coordinator-<point>      the coordinator SIGKILLed at after_prepare, mid_delivery,
#                            before_commit or after_commit; a new one takes over
#   owner-mid-upload         owner 0 SIGKILLed mid-upload, restarted
#   ci                       one receiver kill and one coordinator kill in one run
#   checkpoints              owners replay three safetensors checkpoints (written by
#                            dcr-demo --save-checkpoint), a receiver killed at step 2
#   relay-clean              --transport relay_tree, no fault
#   relay-receiver-mid-apply --transport relay_tree, a rollout process (its relay node
#                            with it) SIGKILLed mid-stream, restarted
#   relay-owner-mid-upload   --transport relay_tree, owner 0 SIGKILLed mid-stream
#   relay-coordinator-mid_delivery  --transport relay_tree, the coordinator killed mid-delivery
#   relay-forged-digest      --transport relay_tree, a node reports a wrong relay stream
#                            digest once: the attempt fails naming the owner, that node's
#                            receivers are restored densely, the retry commits
# relay-*: besides, the payloads crossed the relay nodes (their counters), and
# the object store holds no payload of any attempt.
# Checked after each: the verification line says PASS (every receiver equals,
# byte for byte, a dense load of the committed version from the owners'
# dense export, and serves the commit record's digest); the fault really
# fired (its marker, a process restart or a second coordinator run); the
# committed version went up by one per step and never back. The launcher
# stops every process it started, also when this test is stopped.
set -euo pipefail
bin=$1
scenario=$2
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/dcr-cluster-test-XXXXXX")
trap 'rm -rf "$work"' EXIT
steps=3
args=()
marker=""
case "$scenario" in
  receiver-mid-apply) args=(--kill-receiver-every 2); marker=rollout-apply-2 ;;
  coordinator-*) p=${scenario#coordinator-}; args=(--kill-coordinator-at "$p:2"); marker=coordinator-$p-2 ;;
  owner-mid-upload) args=(--kill-owner-at 2); marker=owner-upload-2 ;;
  ci) args=(--kill-receiver-every 2 --kill-coordinator-every 3); marker=rollout-apply-2 ;;
  checkpoints)
    for s in 0 1 2 3; do
      "$bin/dcr-demo" --size small --seed $((s + 5)) --save-checkpoint "$work/v$s.safetensors" 2>/dev/null
    done
    args=(--kill-receiver-every 2 --checkpoints "$work"/v{0,1,2,3}.safetensors); marker=rollout-apply-2 ;;
  keyed)
    # Every program gets the job key: keyed seals and an authenticated control channel.
    head -c 32 /dev/urandom >"$work/job.key"
    args=(--kill-receiver-every 2 --job-key "$work/job.key"); marker=rollout-apply-2 ;;
  relay-keyed)
    head -c 32 /dev/urandom >"$work/job.key"
    args=(--transport relay_tree --job-key "$work/job.key") ;;
  relay-clean) args=(--transport relay_tree --relay-fanout 1) ;;
  relay-forged-digest)
    # Node 0 reports a wrong stream digest for owner 0 once (attempt >= 2):
    # the coordinator's binding fails that attempt, the retry commits.
    args=(--transport relay_tree --forge-relay-digest 2); marker=relay-forge ;;
  relay-receiver-mid-apply) args=(--transport relay_tree --kill-receiver-every 2); marker=rollout-apply-2 ;;
  relay-owner-mid-upload) args=(--transport relay_tree --kill-owner-at 2); marker=owner-upload-2 ;;
  relay-coordinator-mid_delivery)
    args=(--transport relay_tree --kill-coordinator-at mid_delivery:2); marker=coordinator-mid_delivery-2 ;;
  *) echo "unknown scenario $scenario"; exit 2 ;;
esac
snap_pid=""
if [ "$scenario" = keyed ]; then
  # Payloads and manifests are collected after each commit: copies taken
  # while the run goes (complete objects only: the fs store writes dot-named
  # temporaries and renames them) are checked for their seals below.
  mkdir -p "$work/snap"
  (for _ in $(seq 1 1200); do
     [ -e "$work/snap.stop" ] && break
     if [ -d "$work/run/objects" ]; then
       find "$work/run/objects" -type f ! -name '.tmp.*' \( -path '*/payload/*' -o -path '*/manifest/*' \) \
         -exec cp -n --parents {} "$work/snap" \; 2>/dev/null
     fi
     sleep 0.05
   done) &
  snap_pid=$!
fi
set +e
out=$(DCR_CLUSTER_KEEP=1 bash "$here/scripts/cluster.sh" --bin "$bin" --workdir "$work/run" \
  --steps "$steps" --json "${args[@]}" 2>"$work/stderr")
rc=$?
set -e
if [ -n "$snap_pid" ]; then touch "$work/snap.stop"; wait "$snap_pid" || true; fi
echo "$out"
if [ "$rc" -ne 0 ]; then
  cat "$work/stderr"; for f in "$work"/run/logs/*.log; do echo "== $f"; tail -n 20 "$f"; done
  echo "FAIL: cluster run exited $rc"; exit 1
fi
grep -qF '"bit_exact":true' <<<"$out" || { echo "FAIL: not bit-exact"; exit 1; }
grep -qF '"receivers_checked":4' <<<"$out" || { echo "FAIL: not every receiver checked"; exit 1; }
grep -qF '"receivers_equal":4' <<<"$out" || { echo "FAIL: not every receiver equals a dense load"; exit 1; }
[ -z "$marker" ] || [ -e "$work/run/faults/$marker" ] || { echo "FAIL: fault $marker did not fire"; exit 1; }
if [ "$scenario" = ci ]; then
  [ -e "$work/run/faults/coordinator-after_prepare-3" ] || { echo "FAIL: no coordinator kill"; exit 1; }
fi
# Versions: one row per committed step, in order, ending at --steps.
versions=$(grep -o '"step":[0-9]*' <<<"$out" | cut -d: -f2 | paste -sd' ')
[ "$versions" = "$(seq -s' ' 1 $steps)" ] || { echo "FAIL: committed versions '$versions'"; exit 1; }
grep -qx "version $steps" "$work/run/control/commit" || { echo "FAIL: record is not at version $steps"; exit 1; }
case "$scenario" in
  relay-clean)
    [ ! -s "$work/run/restarts" ] || { echo "FAIL: a process restarted in a clean run"; exit 1; } ;;
  receiver-mid-apply|owner-mid-upload|ci|checkpoints|keyed|relay-receiver-mid-apply|relay-owner-mid-upload)
    grep -q . "$work/run/restarts" || { echo "FAIL: no process was restarted"; exit 1; } ;;
  coordinator-*|relay-coordinator-*)
    runs=$(grep -o '"coordinator_runs":[0-9]*' <<<"$out" | cut -d: -f2)
    [ "$runs" -gt "$steps" ] || { echo "FAIL: no coordinator took over"; exit 1; } ;;
  relay-forged-digest)
    # The binding refused the forged digest, naming the owner, and retried.
    grep -q "owner 0: node of .* read manifest .*, the owner reported publishing" \
      "$work/run/logs/coordinator.log" ||
      { tail -n 30 "$work/run/logs/coordinator.log"; echo "FAIL: the forged digest was not refused"; exit 1; }
    grep -o '"attempts":[0-9]*' <<<"$out" | grep -qv '"attempts":1' ||
      { echo "FAIL: no step needed a second attempt"; exit 1; }
    # What that node delivered is not what the owner sent: its receivers were
    # restored densely before the retry.
    grep -o '"attempts":[0-9]*,"payload_bytes":[0-9]*,"restore_s":[0-9.]*' <<<"$out" |
      grep -v '"attempts":1,' | grep -Eqv '"restore_s":0(\.0*)?$' ||
      { echo "FAIL: the node's receivers were not restored before the retry"; exit 1; } ;;
esac
if [ "${scenario#relay-}" != "$scenario" ]; then
  # Payloads went node 0 -> node 1 through the relay tree, not the object store.
  q0=$(grep -o 'relay node 0: [0-9]* payloads queued, [0-9]* frames forwarded' "$work/run/logs/node0.log" | tail -n1)
  q1=$(grep -o 'relay node 1: [0-9]* payloads queued' "$work/run/logs/node1.log" | tail -n1)
  echo "$q0; $q1"
  [ "$(awk '{print $4}' <<<"$q0")" -gt 0 ] && [ "$(awk '{print $7}' <<<"$q0")" -gt 0 ] &&
    [ "$(awk '{print $4}' <<<"$q1")" -gt 0 ] || { echo "FAIL: no payloads through the relay nodes"; exit 1; }
  if find "$work/run/objects" -path '*payload*' | grep -q .; then
    echo "FAIL: payload objects in the object store"; exit 1
  fi
fi
if [ "${scenario%keyed}" != "$scenario" ]; then
  # The record is sealed with the key: its digest line is not the unkeyed one.
  head -n -1 "$work/run/control/commit" >"$work/body"
  plain=$(b2sum -l 128 "$work/body" | cut -d' ' -f1)
  ! grep -qx "digest $plain" "$work/run/control/commit" || { echo "FAIL: commit record not keyed"; exit 1; }
fi
if [ "$scenario" = keyed ]; then
  # Every object kind is sealed with the job key, none with the plain digest
  # (payloads and manifests live only until the next commit collects them: a
  # fast run may leave none in the snapshot, so only the lasting kinds are required).
  python3 "$here/test/cluster/check_seals.py" "$work/job.key" "$work/snap" "$work/run/objects" \
    "$work/run/control/commit" --need "dense export,commit record" ||
    { echo "FAIL: an object is not sealed with the job key"; exit 1; }
  # Unkeyed listeners beyond loopback are refused, naming the way out.
  set +e
  "$bin/dcr-owner" --rank 0 --listen 10.255.255.1:9 --workdir "$work/insecure" --tp 1 --nodes 1 \
    --receivers-per-node 1 2>"$work/insecure.log"
  irc=$?
  set -e
  if [ "$irc" -eq 0 ] || ! grep -q "beyond loopback and the job has no key" "$work/insecure.log"; then
    cat "$work/insecure.log"; echo "FAIL: an unkeyed owner listened beyond loopback"; exit 1
  fi
  # An owner with the key refuses a coordinator without it, and one with
  # another key, typed (verification), before any call runs.
  one=(--workdir "$work/neg" --tp 1 --nodes 1 --receivers-per-node 1)
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$bin/dcr-owner" --rank 0 --listen "127.0.0.1:$port" "${one[@]}" --job-key "$work/job.key" \
    2>"$work/owner.log" &
  owner_pid=$!
  for _ in $(seq 1 200); do
    ! grep -q 'serving on' "$work/owner.log" || break
    sleep 0.1
  done
  grep -q 'serving on' "$work/owner.log" ||
    { kill "$owner_pid" || true; cat "$work/owner.log"; echo "FAIL: owner did not start"; exit 1; }
  head -c 32 /dev/urandom >"$work/other.key"
  for k in none other; do
    key_args=()
    [ "$k" = none ] || key_args=(--job-key "$work/other.key")
    set +e
    "$bin/dcr-coordinator" --owner "127.0.0.1:$port" --node 127.0.0.1:1 "${one[@]}" \
      "${key_args[@]}" --steps 1 --wait 5 >/dev/null 2>"$work/coord-$k.log"
    crc=$?
    set -e
    if [ "$crc" -eq 0 ] || ! grep -q verification "$work/coord-$k.log"; then
      kill "$owner_pid" || true; cat "$work/coord-$k.log"
      echo "FAIL: a coordinator with key '$k' was not refused (typed)"; exit 1
    fi
  done
  kill "$owner_pid"; wait "$owner_pid" 2>/dev/null || true
  echo "keyless and wrong-key coordinators refused"
fi
echo "PASS: $scenario"
