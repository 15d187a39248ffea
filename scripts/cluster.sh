#!/usr/bin/env bash
# Starts a whole local dcr cluster as separate processes on the embedded
# defaults (loopback TCP, an fs object store and a file commit store in the
# work directory): one dcr-owner per trainer rank, one dcr-rollout per
# rollout node, and dcr-coordinator; runs --steps refits; ends by checking
# every receiver against a dense load of the committed version and prints
# the verification line (PASS/FAIL). Processes that die are started again.
# See docs/deployment.md.
#
#   scripts/cluster.sh [--bin DIR] [--workdir DIR] [--port BASE] [--steps N]
#                      [--size S] [--seed S] [--tp N] [--nodes N] [--receivers-per-node R]
#                      [--checkpoints F0 F1 ...] [--kill-receiver-every K]
#                      [--kill-coordinator-every K] [--kill-coordinator-at POINT:STEP]
#                      [--kill-owner-at STEP] [--etcd URL[,URL...]] [--s3 URL] [--json]
#                      [--testbed] [--link-down NODE:STEP[:SECONDS]]
#                      [--transport object_store|relay_tree] [--relay-fanout K]
#                      [--s3-restart STEP[:SECONDS]] [--link-loss NODE:PCT]
#                      [--link-cut-streaming NODE:STEP[:SECONDS]] [--change-pct P]
#                      [--fetch-all] [--bucket-payloads] [--chunk-bytes N] [--bucket-bytes N]
#                      [--job-key FILE | --insecure] [--s3-credentials FILE]
#                      [--etcd-credentials FILE]
#
# --job-key FILE: the job's shared secret for every program (keyed seals on
#   payloads, manifests, dense exports and the commit record; an
#   authenticated control channel and relay links). Without it a key file is
#   made for the job (WORKDIR/job.key, mode 0600) and the line saying so is
#   printed; --insecure runs unkeyed instead (loopback, or a network you
#   trust: the programs refuse to listen unkeyed off loopback otherwise).
# --fetch-all: rollout nodes fetch every payload of an attempt instead of
#   only those the manifest index names a tensor of their receivers (an
#   expert-parallel node then also fetches the other nodes' experts).
# --bucket-payloads: owners send one payload per bucket instead of one per
#   block of experts (a block per rollout node) and one of the rest, so the
#   index has nothing to skip.
# --chunk-bytes N / --bucket-bytes N (N[KB|MB|GB|KiB|MiB|GiB]): the owners'
#   chunk and bucket targets (job flags); by default scaled to each owner's
#   share (at least 8 buckets per owner; docs/deployment.md).
#
# --transport relay_tree: payloads stream from the owners to rollout node 0
#   and down a k-ary relay tree (--relay-fanout K, default 2) instead of
#   through the object store; node j's relay listens on port BASE+200+j of
#   its host (loopback, or its testbed address). Dense exports and restores
#   still use the object store.
# --change-pct P: each step changes exactly P % of the elements (the job flag;
#   larger payloads than an AdamW step's) instead of an AdamW step.
# --kill-receiver-every K: at steps K, 2K, ... a rollout process (node
#   (step/K - 1) mod nodes) is SIGKILLed mid-apply (after its first payload
#   is applied); it is started again and restores densely before rejoining.
# --kill-coordinator-every K: at steps K, 2K, ... the coordinator is SIGKILLed
#   at a crash point (after_prepare, mid_delivery, before_commit, after_commit
#   in turn); a new coordinator process takes over.
# --kill-coordinator-at POINT:STEP: the same, once, at that point of that step.
# --kill-owner-at STEP: owner 0 is SIGKILLed mid-upload of that step.
# --forge-relay-digest ATTEMPT (relay_tree): rollout node 0 reports a wrong
#   relay stream digest once, at the first attempt id >= ATTEMPT; the
#   coordinator must fail that attempt (a test of the binding) and retry.
# --etcd URLS: keep the commit record in that etcd (keys under dcr/cluster-<pid>/).
# --s3 URL: keep the objects in bucket dcr-cluster-<pid> there (keys from
#   DCR_S3_ACCESS_KEY and DCR_S3_SECRET_KEY).
# --testbed: run inside `scripts/testbed.sh run -- ...` (docs/testbed.md):
#   owner k runs in training node t(k mod N_train), rollout node j in r(j mod
#   N_roll), the coordinator on the storage host; each listens on its node's
#   address; the objects go to the testbed's S3 and the commit record to its
#   etcd (unless --s3/--etcd say otherwise), so every payload crosses the
#   shaped links.
# --link-down NODE:STEP[:SECONDS] (with --testbed; may be repeated): as step
#   STEP's transition starts (its coordinator has taken over), take NODE's
#   link down for SECONDS (default 3), then bring it back.
# --link-cut-streaming NODE:STEP[:SECONDS] (with --testbed; may be repeated):
#   the same, but once step STEP's payloads are streaming: when an owner has
#   written the first of them (its first "upload" on the timeline,
#   DCR_TIMELINE, which defaults to $work/timeline.jsonl). The fault's marker holds the
#   times (CLOCK_REALTIME ns) the step started, the link went down and came
#   back.
# --s3-restart STEP[:SECONDS] (with --testbed; may be repeated): at the same
#   moment of step STEP, kill the storage host's S3 proxy (SIGKILL) while the
#   owners upload and start it again SECONDS (default 3) later.
# --link-loss NODE:PCT (with --testbed; may be repeated): drop PCT% of the
#   packets on NODE's link in both directions for the whole run (netem where
#   the kernel has it, else an nftables rule in the router namespace).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${DCR_BIN:-$here/build/examples}
work=""
port=0
steps=3
size=small
seed=42
tp=2
nodes=2
ranks=2
kill_rx=0
kill_co=0
kill_owner=0
forge_relay=0
kill_co_at=""
etcd=""
s3=""
json=0
testbed=0
link_downs=()
link_cuts=()
s3_restarts=()
link_losses=()
checkpoints=()
transport=object_store
fanout=2
job_key=""
insecure=0
change_pct=""
fetch_flags=()
target_flags=()
secret_flags=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --workdir) work=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --tp) tp=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --receivers-per-node) ranks=$2; shift 2 ;;
    --kill-receiver-every) kill_rx=$2; shift 2 ;;
    --kill-coordinator-every) kill_co=$2; shift 2 ;;
    --kill-coordinator-at) kill_co_at=$2; shift 2 ;;
    --kill-owner-at) kill_owner=$2; shift 2 ;;
    --forge-relay-digest) forge_relay=$2; shift 2 ;;
    --etcd) etcd=$2; shift 2 ;;
    --s3) s3=$2; shift 2 ;;
    --json) json=1; shift ;;
    --testbed) testbed=1; shift ;;
    --link-down) link_downs+=("$2"); shift 2 ;;
    --link-cut-streaming) link_cuts+=("$2"); shift 2 ;;
    --transport) transport=$2; shift 2 ;;
    --relay-fanout) fanout=$2; shift 2 ;;
    --change-pct) change_pct=$2; shift 2 ;;
    --fetch-all|--bucket-payloads) fetch_flags+=("$1"); shift ;;
    --chunk-bytes|--bucket-bytes) target_flags+=("$1" "$2"); shift 2 ;;
    --job-key) job_key=$2; shift 2 ;;
    --insecure) insecure=1; shift ;;
    --s3-credentials|--etcd-credentials) secret_flags+=("$1" "$2"); shift 2 ;;
    --s3-restart) s3_restarts+=("$2"); shift 2 ;;
    --link-loss) link_losses+=("$2"); shift 2 ;;
    --checkpoints)
      shift
      while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do checkpoints+=("$1"); shift; done ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "cluster.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -z "$work" ] || work=$(realpath -m "$work")
bin=$(realpath -m "$bin")
for i in "${!checkpoints[@]}"; do checkpoints[$i]=$(realpath -m "${checkpoints[$i]}"); done
if [ -z "${DCR_BIN:-}" ] && [ "$bin" = "$here/build/examples" ]; then
  # The default build/: set it up and build the three programs (incremental).
  DCR_BUILD_TARGETS="examples/dcr-owner examples/dcr-rollout examples/dcr-coordinator"
  # shellcheck source=setup.sh
  source "$here/scripts/setup.sh" >&2
  set +e
fi
for p in dcr-owner dcr-rollout dcr-coordinator; do
  [ -x "$bin/$p" ] || { echo "cluster.sh: no $bin/$p (build first, or pass --bin DIR)" >&2; exit 2; }
done
own_work=0
if [ -z "$work" ]; then work=$(mktemp -d "${TMPDIR:-/tmp}/dcr-cluster-XXXXXX"); own_work=1; fi
mkdir -p "$work/logs" "$work/pids"
if [ -n "$job_key" ] && [ "$insecure" = 1 ]; then
  echo "cluster.sh: --job-key and --insecure exclude each other" >&2; exit 2
fi
if [ -z "$job_key" ] && [ "$insecure" = 0 ]; then
  # Keys on by default: one secret for every program of this job.
  job_key=$work/job.key
  [ -s "$job_key" ] || (umask 077 && head -c 32 /dev/urandom >"$job_key")
  echo "[cluster] job key: $job_key (made for this job; pass --job-key FILE to use your own)" >&2
fi
[ -z "$job_key" ] || secret_flags+=(--job-key "$(realpath -m "$job_key")")
[ "$insecure" = 0 ] || secret_flags+=(--insecure)
# A streaming cut waits for the programs' timeline (examples/cluster/timeline.hpp).
[ ${#link_cuts[@]} -eq 0 ] || export DCR_TIMELINE=${DCR_TIMELINE:-$work/timeline.jsonl}
# Ports: BASE+k for owner k, BASE+100+j for node j (by default a range chosen by the PID,
# below the ephemeral range 32768-60999 so that no outgoing connection holds one).
[ "$port" -ne 0 ] || port=$((20000 + ($$ % 60) * 200)) # below the ephemeral range

# Where each process runs and listens: loopback, or a testbed node.
# at NODE: sets `at` to the command prefix that runs a program there.
at=()
at_node() { at=(); [ "$testbed" = 1 ] && at=(ip netns exec "$DCR_TB_NAME-$1"); }
owner_node() { echo "${tb_train[$(($1 % ${#tb_train[@]}))]}"; }
rollout_node() { echo "${tb_roll[$(($1 % ${#tb_roll[@]}))]}"; }
tb_addr() { local v="DCR_TB_ADDR_$1"; echo "${!v}"; }
owner_host() { if [ "$testbed" = 1 ]; then tb_addr "$(owner_node "$1")"; else echo 127.0.0.1; fi; }
node_host() { if [ "$testbed" = 1 ]; then tb_addr "$(rollout_node "$1")"; else echo 127.0.0.1; fi; }
if [ "$testbed" = 1 ]; then
  [ -n "${DCR_TB_NAME:-}" ] || { echo "cluster.sh: --testbed: run it under scripts/testbed.sh run -- ..." >&2; exit 2; }
  read -r -a tb_train <<<"$DCR_TB_TRAIN"
  read -r -a tb_roll <<<"$DCR_TB_ROLL"
  [ -n "$s3" ] || s3=${DCR_TB_S3:-}
  [ -n "$etcd" ] || etcd=${DCR_TB_ETCD:-}
  export DCR_S3_ACCESS_KEY=${DCR_S3_ACCESS_KEY:-${DCR_TB_S3_ACCESS_KEY:-}}
  export DCR_S3_SECRET_KEY=${DCR_S3_SECRET_KEY:-${DCR_TB_S3_SECRET_KEY:-}}
  [ -n "$s3" ] || { echo "cluster.sh: --testbed: the testbed runs no S3" >&2; exit 2; }
  for f in "${link_losses[@]}"; do
    IFS=: read -r n pct <<<"$f"
    bash "$here/scripts/testbed.sh" shape "$n" --rate "$DCR_TB_RATE" --loss "$pct" --name "$DCR_TB_NAME" >&2 ||
      { echo "cluster.sh: --link-loss $f could not be applied" >&2; exit 2; }
    echo "[cluster] link of $n: ${pct}% packet loss" >&2
  done
elif [ $((${#link_downs[@]} + ${#link_cuts[@]} + ${#s3_restarts[@]} + ${#link_losses[@]})) -gt 0 ]; then
  echo "cluster.sh: --link-down, --link-cut-streaming, --s3-restart and --link-loss need --testbed" >&2; exit 2
fi

job=(--workdir "$work" --size "$size" --seed "$seed" --tp "$tp" --nodes "$nodes"
     --receivers-per-node "$ranks")
[ -z "$change_pct" ] || job+=(--change-pct "$change_pct")
[ ${#checkpoints[@]} -eq 0 ] || job+=(--checkpoints "${checkpoints[@]}")
[ ${#fetch_flags[@]} -eq 0 ] || job+=("${fetch_flags[@]}")
[ ${#target_flags[@]} -eq 0 ] || job+=("${target_flags[@]}")
[ ${#secret_flags[@]} -eq 0 ] || job+=("${secret_flags[@]}")
[ -z "$etcd" ] || job+=(--etcd "$etcd" --etcd-prefix "dcr/cluster-$$/")
[ -z "$s3" ] || job+=(--s3 "$s3" --s3-bucket "dcr-cluster-$$")
if [ "$transport" = relay_tree ]; then
  relay=""
  for ((j = 0; j < nodes; j++)); do relay+="${relay:+,}$(node_host "$j"):$((port + 200 + j))"; done
  job+=(--transport relay_tree --relay-nodes "$relay" --relay-fanout "$fanout")
elif [ "$transport" != object_store ]; then
  echo "cluster.sh: --transport $transport: expected object_store or relay_tree" >&2; exit 2
fi

say() { echo "[cluster] $*" >&2; }
supervisors=()
# supervise NAME CMD...: run CMD, start it again whenever it dies, until $work/stop exists.
supervise() {
  local name=$1; shift
  (
    while [ ! -e "$work/stop" ]; do
      "$@" >>"$work/logs/$name.log" 2>&1 &
      echo $! >"$work/pids/$name"
      wait $!
      rc=$?
      [ -e "$work/stop" ] && break
      echo "[cluster] $name exited ($rc), starting it again" >>"$work/logs/$name.log"
      echo "$name" >>"$work/restarts"
      sleep 0.2
    done
  ) &
  supervisors+=($!)
}
cleanup() {
  touch "$work/stop"
  for f in "$work"/pids/*; do [ -e "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null; done
  for s in "${supervisors[@]}"; do wait "$s" 2>/dev/null; done
  if [ "$own_work" = 1 ] && [ "${DCR_CLUSTER_KEEP:-0}" = 0 ]; then rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT

owners=$(( tp ))
owner_flags=()
for ((k = 0; k < owners; k++)); do
  extra=()
  [ "$kill_owner" -gt 0 ] && [ "$k" -eq 0 ] && extra=(--die-mid-upload "$kill_owner")
  h=$(owner_host "$k")
  [ "$testbed" = 1 ] && at_node "$(owner_node "$k")"
  supervise "owner$k" "${at[@]}" "$bin/dcr-owner" --rank "$k" --listen "$h:$((port + k))" "${job[@]}" "${extra[@]}"
  owner_flags+=(--owner "$h:$((port + k))")
done
node_flags=()
for ((j = 0; j < nodes; j++)); do
  extra=()
  if [ "$kill_rx" -gt 0 ]; then
    for ((s = kill_rx; s <= steps; s += kill_rx)); do
      if [ $(( (s / kill_rx - 1) % nodes )) -eq "$j" ]; then extra=(--die-mid-apply "$s"); break; fi
    done
  fi
  [ "$forge_relay" -gt 0 ] && [ "$j" -eq 0 ] && extra+=(--forge-relay-digest "$forge_relay")
  h=$(node_host "$j")
  [ "$testbed" = 1 ] && at_node "$(rollout_node "$j")"
  supervise "node$j" "${at[@]}" "$bin/dcr-rollout" --node "$j" --listen "$h:$((port + 100 + j))" "${job[@]}" "${extra[@]}"
  node_flags+=(--node "$h:$((port + 100 + j))")
done
say "work directory $work; $owners owners, $nodes nodes x $ranks receivers; $steps steps; transport $transport"

# link_fault NODE:STEP[:SECONDS]: once the step's coordinator has taken over
# (its "epoch" line in the log; the transition starts right after), take
# await_takeover EPOCHS: wait (at most 120 s) until the coordinator log shows
# more than EPOCHS takeovers, i.e. this step's coordinator has taken over and
# its transition is starting; then 0.2 s more. Fails when none took over.
await_takeover() {
  local deadline=$((SECONDS + 120))
  until [ "$(grep -c '^dcr-coordinator: epoch' "$work/logs/coordinator.log" 2>/dev/null)" -gt "$1" ]; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.05
  done
  sleep 0.2
}

# Payload writes ("upload" intervals) of the owners on the timeline so far.
uploads() { local n; n=$(grep -c '"what":"upload"' "$DCR_TIMELINE" 2>/dev/null); echo "${n:-0}"; }

# NODE's link down for SECONDS, then bring it back. Every receiver and owner
# is needed for the attempt, so the cut always overlaps it. With MODE
# "streaming", the cut waits (at most 120 s) for the step's first payload
# written after the takeover. Writes $work/faults/link-<NODE>-<STEP> (or
# cut-<NODE>-<STEP>) holding "start T down T up T" (ns).
link_fault() {
  local node step secs epochs0=$2 mode=${3:-} uploads0 t_start t_down deadline
  IFS=: read -r node step secs <<<"$1"
  secs=${secs:-3}
  t_start=$(date +%s%N)
  [ "$mode" = streaming ] && uploads0=$(uploads)
  await_takeover "$epochs0" || { say "step $step: no coordinator took over; link fault not fired"; return 1; }
  if [ "$mode" = streaming ]; then
    deadline=$((SECONDS + 120))
    until [ "$(uploads)" -gt "$uploads0" ]; do
      [ $SECONDS -lt $deadline ] || { say "step $step: no payload streamed; link cut not fired"; return 1; }
      sleep 0.02
    done
  fi
  say "step $step: link of $node down for $secs s${mode:+ ($mode)}"
  bash "$here/scripts/testbed.sh" link "$node" down --name "$DCR_TB_NAME" \
    --subnet "${DCR_TB_SUBNET:-10.77}"
  t_down=$(date +%s%N) # the link is down by now
  sleep "$secs"
  bash "$here/scripts/testbed.sh" link "$node" up --name "$DCR_TB_NAME" --subnet "${DCR_TB_SUBNET:-10.77}"
  say "step $step: link of $node up again"
  local tag=link
  [ "$mode" = streaming ] && tag=cut
  mkdir -p "$work/faults" && echo "start $t_start down $t_down up $(date +%s%N)" >"$work/faults/$tag-$node-$step"
}

# s3_fault STEP[:SECONDS] EPOCHS: at the same moment, kill the S3 proxy and
# start it again SECONDS later. Writes $work/faults/s3-<STEP>.
s3_fault() {
  local step secs epochs0=$2
  IFS=: read -r step secs <<<"$1"
  secs=${secs:-3}
  await_takeover "$epochs0" || { say "step $step: no coordinator took over; S3 fault not fired"; return 1; }
  say "step $step: S3 proxy killed for $secs s"
  bash "$here/scripts/testbed.sh" restart-s3 --for "$secs" --name "$DCR_TB_NAME" 2>&1 | sed 's/^/[cluster] /' >&2
  say "step $step: S3 proxy up again"
  mkdir -p "$work/faults" && touch "$work/faults/s3-$step"
}

points=(after_prepare mid_delivery before_commit after_commit)
# The coordinator runs on the storage host (its link is not a node's link).
at=()
[ "$testbed" = 1 ] && at_node st
co_at=("${at[@]}")
t0=$(date +%s.%N)
co_runs=0
# One coordinator run per step, so that each can be armed to die at that
# step's crash point; a SIGKILLed one is followed by a fresh process that
# takes over (the commit store fences the dead one's epoch).
for ((s = 1; s <= steps; s++)); do
  extra=()
  if [ "$kill_co" -gt 0 ] && [ $((s % kill_co)) -eq 0 ]; then
    extra=(--die-at "${points[$(( (s / kill_co - 1) % 4 ))]}:$s")
  fi
  [ -n "$kill_co_at" ] && [ "${kill_co_at#*:}" = "$s" ] && extra=(--die-at "$kill_co_at")
  faults=()
  for f in "${link_downs[@]}"; do
    if [ "$(echo "$f" | cut -d: -f2)" = "$s" ]; then
      link_fault "$f" "$(grep -c '^dcr-coordinator: epoch' "$work/logs/coordinator.log" 2>/dev/null)" &
      faults+=($!)
    fi
  done
  for f in "${link_cuts[@]}"; do
    if [ "$(echo "$f" | cut -d: -f2)" = "$s" ]; then
      link_fault "$f" "$(grep -c '^dcr-coordinator: epoch' "$work/logs/coordinator.log" 2>/dev/null)" streaming &
      faults+=($!)
    fi
  done
  for f in "${s3_restarts[@]}"; do
    if [ "${f%%:*}" = "$s" ]; then
      s3_fault "$f" "$(grep -c '^dcr-coordinator: epoch' "$work/logs/coordinator.log" 2>/dev/null)" &
      faults+=($!)
    fi
  done
  for attempt in 1 2 3 4 5; do
    co_runs=$((co_runs + 1))
    "${co_at[@]}" "$bin/dcr-coordinator" "${owner_flags[@]}" "${node_flags[@]}" "${job[@]}" --steps "$s" \
      --rows "$work/rows.jsonl" "${extra[@]}" >>"$work/logs/coordinator.log" 2>&1
    rc=$?
    [ "$rc" -eq 0 ] && break
    say "step $s: coordinator exited ($rc); starting a new one"
    extra=()
  done
  for f in "${faults[@]}"; do wait "$f"; done
  [ "$rc" -eq 0 ] || { say "step $s failed; logs in $work/logs"; DCR_CLUSTER_KEEP=1; break; }
done
verdict=$("${co_at[@]}" "$bin/dcr-coordinator" "${owner_flags[@]}" "${node_flags[@]}" "${job[@]}" --steps "$steps" \
  --verify 2>>"$work/logs/coordinator.log")
vrc=$?
t1=$(date +%s.%N)
restarts=$(cat "$work/restarts" 2>/dev/null | wc -l)
if [ "$json" = 1 ]; then
  rows=$(paste -sd, "$work/rows.jsonl" 2>/dev/null)
  # The counts are the verifier's own ("verification: E of C receivers equal
  # ..."), not the job's size: a verifier that checked fewer receivers than
  # the job has, or printed no verdict, shows as such.
  vline=$(printf '%s\n' "$verdict" | grep -m1 '^verification: [0-9]* of [0-9]* ' || true)
  checked=0 equal=0
  if [ -n "$vline" ]; then
    equal=$(echo "$vline" | awk '{print $2}')
    checked=$(echo "$vline" | awk '{print $4}')
  fi
  exact=false
  [ "$vrc" -eq 0 ] && [ "$checked" -eq $((nodes * ranks)) ] && [ "$equal" -eq "$checked" ] && exact=true
  echo "{\"steps\":[${rows}],\"bit_exact\":${exact},\"receivers_checked\":${checked},\"receivers_equal\":${equal},\"coordinator_runs\":${co_runs},\"process_restarts\":${restarts}}"
else
  [ -e "$work/rows.jsonl" ] && cat "$work/rows.jsonl"
  echo "cluster: $owners owners, $nodes rollout nodes x $ranks receivers, $steps steps," \
    "$co_runs coordinator runs, $restarts process restarts, $(echo "$t1 - $t0" | bc) s"
  echo "$verdict"
fi
[ "$vrc" -eq 0 ] || DCR_CLUSTER_KEEP=1
exit "$vrc"
