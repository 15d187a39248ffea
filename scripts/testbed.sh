#!/usr/bin/env bash
# A cluster on one Linux machine, built from network namespaces: N training
# nodes, M rollout nodes and a storage host, each joined to a router namespace
# by its own veth pair. Every node's link is its link across the cluster
# boundary and is shaped with tc (rate, optionally delay and loss with netem;
# where the kernel has no sch_netem, loss is an nftables rule in the router
# namespace and delay is unavailable);
# the storage host's link is unshaped unless --storage-rate is given, as an
# object store's aggregate bandwidth is not the per-node bottleneck. The
# storage host runs a real etcd and a real S3 (Swift with s3api).
#
#   testbed.sh up       [options]      build it, start the services, print the layout
#   testbed.sh down     [--name P]     stop the services, delete every namespace of P
#   testbed.sh exec     NODE CMD...    run CMD inside NODE (router, st, t0.., r0..)
#   testbed.sh link     NODE up|down   take NODE's link down or bring it back
#   testbed.sh shape    NODE [--rate R] [--delay MS] [--loss PCT]   reshape NODE's link
#   testbed.sh counters [--json]       bytes sent and received on every node's link
#   testbed.sh restart-s3 [--for S]    kill the storage host's S3 proxy (SIGKILL),
#                                      start it again S seconds later (default 3)
#   testbed.sh run      [options] -- CMD...   up, run CMD on the host with the
#                                      layout in its environment (DCR_TB_*), down
#   testbed.sh selftest [options]      up, check reachability, services, shaping
#                                      and link faults, down; exit 77 to skip
#
# Options: --name P (default dcrtb; namespaces are P-router, P-st, P-t0, ...),
# --train N (2), --roll M (2), --rate R (tc rate, default 1gbit), --delay MS
# (0), --loss PCT (0), --storage-rate R (unshaped), --subnet A.B (10.77; link k
# is A.B.k.0/24: storage k=1, t_i k=10+i, r_j k=100+j), --services LIST
# (etcd,s3; "none" for neither).
#
# Needs root. It creates only namespaces named P-* and the veth pairs between
# them, assigns only addresses inside A.B.0.0/16 within those namespaces, and
# never touches the host's own interfaces or routes, so no traffic it carries
# leaves the namespaces. `run` and `selftest` tear everything down on exit,
# failure or interrupt; `up` leaves it for `down`. Where namespaces cannot be
# created (no root, no netns support) it says so and exits 77 (skip).
set -euo pipefail

DCR_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

name=${DCR_TB_NAME:-dcrtb} train=2 roll=2 rate=1gbit delay=0 loss=0 storage_rate='' subnet=10.77
services=etcd,s3

die() {
  echo "testbed: $*" >&2
  exit 1
}
skip() {
  echo "testbed: skip: $*" >&2
  exit 77
}
usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
}

parse_options() {
  while (($#)); do
    case "$1" in
      --name) name=$2; shift 2 ;;
      --train) train=$2; shift 2 ;;
      --roll) roll=$2; shift 2 ;;
      --rate) rate=$2; shift 2 ;;
      --delay) delay=$2; shift 2 ;;
      --loss) loss=$2; shift 2 ;;
      --storage-rate) storage_rate=$2; shift 2 ;;
      --subnet) subnet=$2; shift 2 ;;
      --services) services=$2; shift 2 ;;
      --) shift; rest=("$@"); return ;;
      *) die "unknown option '$1' (see: testbed.sh help)" ;;
    esac
  done
  rest=()
}

state_dir() { echo "/run/dcr-testbed/$name"; }
ns() { echo "$name-$1"; }
nodes() {
  echo st
  for ((i = 0; i < train; i++)); do echo "t$i"; done
  for ((j = 0; j < roll; j++)); do echo "r$j"; done
}
link_index() {
  case "$1" in
    st) echo 1 ;;
    t*) echo $((10 + ${1#t})) ;;
    r*) echo $((100 + ${1#r})) ;;
    *) die "no node '$1'" ;;
  esac
}
addr() { echo "$subnet.$(link_index "$1").2"; }

# tc rate (e.g. 100mbit, 1gbit, 500kbit) in bits per second.
rate_bits() {
  local r=${1,,} n
  case "$r" in
    *gbit) n=${r%gbit}; echo $((n * 1000000000)) ;;
    *mbit) n=${r%mbit}; echo $((n * 1000000)) ;;
    *kbit) n=${r%kbit}; echo $((n * 1000)) ;;
    *bit) echo "${r%bit}" ;;
    *) die "rate '$1': give it as Nkbit, Nmbit or Ngbit" ;;
  esac
}

# Whether this kernel has the netem qdisc (probed once on the router's lo).
netem=''
have_netem() {
  if [ -z "$netem" ]; then
    netem=no
    if ip netns exec "$(ns router)" tc qdisc add dev lo root netem delay 0ms 2>/dev/null; then
      netem=yes
      ip netns exec "$(ns router)" tc qdisc del dev lo root 2>/dev/null || true
    fi
  fi
  [ "$netem" = yes ]
}

# Packet loss without netem: in the router namespace only, a table
# inet dcr_testbed whose forward chain sends the packets of each lossy link
# (both directions) to a per-node chain dropping a random PCT% of them
# (numgen random mod 10000 < PCT*100). PCT 0 empties the node's chain.
nft_loss() { # node pct
  local r node=$1 chain="loss_$1" n
  r=$(ns router)
  n=$(awk -v p="$2" 'BEGIN { printf "%d", p * 100 + 0.5 }')
  ((n >= 0 && n <= 10000)) || die "--loss $2: give a percentage 0..100"
  # nft is needed only for loss: without it no loss chain can exist, so a
  # link with no loss asked for is already as wanted.
  command -v nft >/dev/null || {
    ((n > 0)) || return 0
    echo "testbed: this kernel has no sch_netem and nft is not installed (Debian package nftables): --loss is unavailable" >&2
    return 77
  }
  if ! ip netns exec "$r" nft list chain inet dcr_testbed "$chain" >/dev/null 2>&1; then
    ((n > 0)) || return 0
    ip netns exec "$r" nft add table inet dcr_testbed
    ip netns exec "$r" nft add chain inet dcr_testbed forward '{ type filter hook forward priority 0; policy accept; }'
    ip netns exec "$r" nft add chain inet dcr_testbed "$chain"
    ip netns exec "$r" nft add rule inet dcr_testbed forward iifname "to-$node" jump "$chain"
    ip netns exec "$r" nft add rule inet dcr_testbed forward oifname "to-$node" jump "$chain"
  fi
  ip netns exec "$r" nft flush chain inet dcr_testbed "$chain"
  ((n == 0)) || ip netns exec "$r" nft add rule inet dcr_testbed "$chain" numgen random mod 10000 lt "$n" counter drop
}

# Why a delay cannot be applied here, exactly: the one way the testbed delays
# packets is the netem qdisc, and nftables (the loss fallback) cannot delay.
no_netem_delay() {
  echo "testbed: --delay needs the netem qdisc, which kernel $(uname -r) does not provide" \
    "('tc qdisc add ... netem' fails: no sch_netem module or CONFIG_NET_SCH_NETEM);" \
    "nftables cannot delay packets, so delay is unavailable on this machine" >&2
}

# Shape the egress of one interface: netem (delay/loss) at the root when asked
# for, then a token bucket at the rate. The bucket holds 10 ms at the rate
# (at least 32 KiB), so a burst cannot exceed the rate noticeably.
shape_dev() { # namespace dev rate delay loss
  local n=$1 dev=$2 r=$3 d=$4 l=$5 parent=root
  ip netns exec "$n" tc qdisc del dev "$dev" root 2>/dev/null || true
  if [ "$d" != 0 ] || [ "$l" != 0 ]; then
    if ! ip netns exec "$n" tc qdisc add dev "$dev" root handle 1: netem delay "${d}ms" loss "${l}%" 2>/dev/null; then
      no_netem_delay
      return 77
    fi
    parent='parent 1:'
  fi
  [ -n "$r" ] || return 0
  local bits burst
  bits=$(rate_bits "$r")
  burst=$((bits / 8 / 100))
  ((burst >= 32768)) || burst=32768
  # shellcheck disable=SC2086
  ip netns exec "$n" tc qdisc add dev "$dev" $parent handle 2: tbf rate "$r" burst "$burst" latency 200ms
}

shape_node() { # node rate delay loss: both directions of the node's link
  local l=$4
  if ! have_netem; then
    [ "$3" = 0 ] || { no_netem_delay; return 77; }
    nft_loss "$1" "$l" || return $?
    l=0
  fi
  shape_dev "$(ns "$1")" uplink "$2" "$3" "$l" || return $?
  shape_dev "$(ns router)" "to-$1" "$2" "$3" "$l"
}

wait_http() { # node url seconds
  local deadline=$((SECONDS + $3))
  until ip netns exec "$(ns "$1")" curl -fsS -m 2 -o /dev/null "$2" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.2
  done
}

start_services() {
  local sd st_ns st_ip
  sd=$(state_dir) st_ns=$(ns st) st_ip=$(addr st)
  if [[ ",$services," == *,etcd,* ]]; then
    [ -x /usr/bin/etcd ] || skip "etcd is not installed (Debian package etcd-server)"
    mkdir -p "$sd/etcd"
    setsid ip netns exec "$st_ns" /usr/bin/etcd --name testbed --data-dir "$sd/etcd/data" \
      --listen-client-urls "http://$st_ip:2379" --advertise-client-urls "http://$st_ip:2379" \
      --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
      --initial-cluster testbed=http://127.0.0.1:2380 --log-level warn \
      </dev/null >"$sd/etcd/etcd.log" 2>&1 &
    echo $! >"$sd/etcd.pid"
    wait_http st "http://$st_ip:2379/health" 30 || {
      tail -n 20 "$sd/etcd/etcd.log" >&2
      die "etcd did not become healthy at $st_ip:2379 within 30 s"
    }
    echo "DCR_TB_ETCD=http://$st_ip:2379" >>"$sd/env"
  fi
  if [[ ",$services," == *,s3,* ]]; then
    command -v swift-proxy-server >/dev/null || skip "Swift is not installed (Debian packages swift swift-proxy swift-object swift-container swift-account)"
    mkdir -p "$sd/swift"
    # start-swift.sh runs until its stdin closes: hold a fifo open for it.
    mkfifo "$sd/swift/stdin"
    setsid sleep infinity >"$sd/swift/stdin" &
    echo $! >"$sd/swift-holder.pid"
    DCR_SWIFT_BIND=$st_ip setsid ip netns exec "$st_ns" bash "$DCR_ROOT/test/s3/start-swift.sh" "$sd/swift" \
      <"$sd/swift/stdin" >"$sd/swift/ready" 2>"$sd/swift/log" &
    echo $! >"$sd/swift.pid"
    local deadline=$((SECONDS + 120)) line=''
    until line=$(grep '^READY' "$sd/swift/ready" 2>/dev/null); do
      kill -0 "$(cat "$sd/swift.pid")" 2>/dev/null || {
        tail -n 30 "$sd/swift/log" >&2
        die "Swift failed to start"
      }
      [ $SECONDS -lt $deadline ] || die "Swift not ready within 120 s"
      sleep 0.3
    done
    read -r _ port ak sk region <<<"$line"
    {
      echo "DCR_TB_S3=http://$st_ip:$port"
      echo "DCR_TB_S3_ACCESS_KEY=$ak"
      echo "DCR_TB_S3_SECRET_KEY=$sk"
      echo "DCR_TB_S3_REGION=$region"
    } >>"$sd/env"
  fi
}

cmd_up() {
  [ "$(id -u)" -eq 0 ] || skip "network namespaces need root"
  command -v ip >/dev/null && command -v tc >/dev/null || skip "iproute2 (ip, tc) is not installed"
  ((train >= 1 && train <= 89 && roll >= 1 && roll <= 150)) || die "--train must be 1..89 and --roll 1..150"
  [[ "$subnet" =~ ^[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "--subnet must be two octets, e.g. 10.77"
  local sd
  sd=$(state_dir)
  if [ -d "$sd" ] || ip netns list | grep -q "^$name-"; then
    die "a testbed named '$name' exists already (testbed.sh down --name $name)"
  fi
  ip netns add "$(ns router)" 2>/dev/null || skip "cannot create network namespaces here"
  mkdir -p "$sd"
  {
    echo "DCR_TB_NAME=$name"
    echo "DCR_TB_RATE=$rate"
    echo "DCR_TB_SUBNET=$subnet"
    echo "DCR_TB_DELAY_MS=$delay"
    echo "DCR_TB_LOSS_PCT=$loss"
    echo "DCR_TB_TRAIN='$(nodes | grep '^t' | tr '\n' ' ' | sed 's/ $//')'"
    echo "DCR_TB_ROLL='$(nodes | grep '^r' | tr '\n' ' ' | sed 's/ $//')'"
  } >"$sd/env"
  local r
  r=$(ns router)
  ip -n "$r" link set lo up
  ip netns exec "$r" sysctl -qw net.ipv4.ip_forward=1
  for node in $(nodes); do
    local n k
    n=$(ns "$node") k=$(link_index "$node")
    ip netns add "$n"
    ip -n "$n" link set lo up
    # Created with each end already in its namespace: nothing appears on the host.
    ip link add name uplink netns "$n" type veth peer name "to-$node" netns "$r"
    ip -n "$n" addr add "$subnet.$k.2/24" dev uplink
    ip -n "$r" addr add "$subnet.$k.1/24" dev "to-$node"
    ip -n "$n" link set uplink up
    ip -n "$r" link set "to-$node" up
    ip -n "$n" route add default via "$subnet.$k.1"
    echo "DCR_TB_ADDR_$node=$subnet.$k.2" >>"$sd/env"
    if [ "$node" = st ]; then
      shape_node st "$storage_rate" 0 0
    else
      local rc=0
      shape_node "$node" "$rate" "$delay" "$loss" || rc=$?
      ((rc == 0)) || { cmd_down; exit "$rc"; }
    fi
  done
  start_services
  echo "testbed '$name': $train training node(s), $roll rollout node(s), storage at $(addr st)"
  echo "  every node's link: rate $rate, delay ${delay} ms, loss ${loss}%; storage link: ${storage_rate:-unshaped}"
  echo "  layout: $sd/env"
  grep -E '^DCR_TB_(ETCD|S3)=' "$sd/env" | sed 's/^/  /' || true
}

kill_pidfile() { # file
  [ -f "$1" ] || return 0
  local p
  p=$(cat "$1")
  kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null || true
  rm -f "$1"
}

cmd_down() {
  local sd
  sd=$(state_dir)
  # Swift first, through its holder (EOF on stdin: it stops its servers).
  kill_pidfile "$sd/swift-holder.pid"
  kill_pidfile "$sd/swift.pid"
  kill_pidfile "$sd/etcd.pid"
  # The loss table lives in the router namespace; delete it explicitly.
  ip netns exec "$(ns router)" nft delete table inet dcr_testbed 2>/dev/null || true
  # Anything still running inside the namespaces goes with them.
  for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$name-" || true); do
    for p in $(ip netns pids "$n" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$n" 2>/dev/null || true
  done
  rm -rf "$sd"
}

cmd_exec() {
  local node=$1
  shift
  ip netns exec "$(ns "$node")" "$@"
}

cmd_link() {
  local node=$1 state=$2
  [[ "$state" == up || "$state" == down ]] || die "link $node: say up or down"
  ip -n "$(ns router)" link set "to-$node" "$state"
  ip -n "$(ns "$node")" link set uplink "$state"
  if [ "$state" = up ]; then
    ip -n "$(ns "$node")" route replace default via "$subnet.$(link_index "$node").1"
  fi
}

cmd_restart_s3() { # seconds
  local sd p secs=$1
  sd=$(state_dir)
  [ -f "$sd/swift.pid" ] || die "restart-s3: the testbed '$name' runs no S3"
  p=$(cat "$sd/swift.pid")
  kill -USR1 "$p" || die "restart-s3: Swift (pid $p) is not running"
  echo "testbed: S3 proxy killed; starting it again in $secs s" >&2
  sleep "$secs"
  kill -USR2 "$p" || die "restart-s3: Swift (pid $p) is not running"
  local url
  url=$(sed -n 's/^DCR_TB_S3=//p' "$sd/env")
  wait_http st "$url/info" 30 || die "restart-s3: the proxy did not answer at $url within 30 s"
  echo "testbed: S3 proxy up again" >&2
}

cmd_shape() {
  local node=$1
  shift
  parse_options "$@"
  shape_node "$node" "$rate" "$delay" "$loss"
}

# Bytes on every node's link, as the kernel counted them at the node's end.
cmd_counters() {
  local json=${1:-}
  "$PY" - "$name" "$json" $(nodes) <<'PYEOF'
import json, subprocess, sys
name, as_json, nodes = sys.argv[1], sys.argv[2] == "--json", sys.argv[3:]
rows = []
for node in nodes:
    out = subprocess.run(["ip", "-n", f"{name}-{node}", "-s", "-j", "link", "show", "uplink"],
                         capture_output=True, text=True, check=True).stdout
    st = json.loads(out)[0]["stats64"]
    rows.append({"node": node, "tx_bytes": st["tx"]["bytes"], "rx_bytes": st["rx"]["bytes"]})
if as_json:
    print(json.dumps({"rows": rows}))
else:
    print(f"{'node':<6} {'tx bytes':>14} {'rx bytes':>14}")
    for r in rows:
        print(f"{r['node']:<6} {r['tx_bytes']:>14} {r['rx_bytes']:>14}")
PYEOF
}

child=''
stop_child() {
  [ -n "$child" ] || return 0
  kill -TERM "$child" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$child" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$child" 2>/dev/null || true
}

cmd_run() {
  trap 'stop_child; cmd_down' EXIT
  trap 'exit 130' INT TERM
  local rc=0
  cmd_up || { rc=$?; exit "$rc"; }
  set -a
  # shellcheck disable=SC1090
  source "$(state_dir)/env"
  set +a
  ((${#rest[@]})) || die "run: give the command after --"
  # In the background, so that a signal to this script is handled at once
  # (the command is stopped, then everything torn down).
  "${rest[@]}" &
  child=$!
  wait "$child" || rc=$?
  child=''
  exit "$rc"
}

# Sends N bytes from one node to a listener in another and prints Mbit/s.
throughput() { # from to bytes
  local to_ip port=5201
  to_ip=$(addr "$2")
  cmd_exec "$2" "$PY" -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(30)
c, _ = s.accept(); c.settimeout(30); n = 0
while True:
    b = c.recv(1 << 20)
    if not b: break
    n += len(b)
c.sendall(str(n).encode()); c.close()' "$to_ip" "$port" &
  local listener=$!
  sleep 0.3
  cmd_exec "$1" "$PY" -c '
import socket, sys, time
ip, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.create_connection((ip, port), timeout=30)
buf = bytes(1 << 20); t0 = time.monotonic(); left = n
while left > 0:
    k = min(left, len(buf)); s.sendall(buf[:k]); left -= k
s.shutdown(socket.SHUT_WR)
got = int(s.recv(64).decode()); dt = time.monotonic() - t0
assert got == n, (got, n)
print("%.1f" % (n * 8 / dt / 1e6))' "$to_ip" "$port" "$3"
  wait "$listener"
}

cmd_selftest() {
  trap 'cmd_down' EXIT
  trap 'exit 130' INT TERM
  local rc=0
  cmd_up || { rc=$?; exit "$rc"; }
  # shellcheck disable=SC1090
  source "$(state_dir)/env"
  local failures=0
  check() { # description command...
    local what=$1
    shift
    if "$@"; then echo "  ok    $what"; else echo "  FAIL  $what"; failures=$((failures + 1)); fi
  }
  echo "selftest:"
  for node in $(nodes); do
    [ "$node" = st ] && continue
    check "$node reaches storage" cmd_exec "$node" "$PY" -c '
import socket, sys; socket.create_connection((sys.argv[1], 2379 if sys.argv[2] else 9), timeout=3).close()' \
      "$(addr st)" "${DCR_TB_ETCD:-}"
  done
  if [ -n "${DCR_TB_ETCD:-}" ]; then
    check "etcd answers from t0" cmd_exec t0 curl -fsS -m 5 -o /dev/null "$DCR_TB_ETCD/health"
  fi
  if [ -n "${DCR_TB_S3:-}" ]; then
    check "Swift answers from r0" cmd_exec r0 curl -fsS -m 5 -o /dev/null "$DCR_TB_S3/info"
  fi
  # The shaped path r0 -> t0 crosses two shaped links at the same rate.
  local want got
  want=$(($(rate_bits "$rate") / 1000000))
  got=$(throughput r0 t0 $((want * 1000000 / 8 * 2))) || got=0
  echo "  link rate: configured $want Mbit/s, measured $got Mbit/s over 2 s of traffic"
  check "measured rate within 60-115% of the configured rate" \
    "$PY" -c "import sys; sys.exit(0 if 0.60 * $want <= $got <= 1.15 * $want else 1)"
  cmd_link t0 down
  check "t0 unreachable with its link down" \
    bash -c "! ip netns exec $(ns r0) $PY -c 'import socket; socket.create_connection((\"$(addr t0)\", 9), timeout=2)' 2>/dev/null"
  cmd_link t0 up
  check "t0 reachable after its link came back" cmd_exec r0 "$PY" -c '
import socket, sys, time
t = time.monotonic() + 5
while True:
    try:
        socket.create_connection((sys.argv[1], 2379), timeout=1).close(); break
    except ConnectionRefusedError:
        break  # the host answered: reachable
    except OSError:
        if time.monotonic() > t: sys.exit(1)
        time.sleep(0.1)' "$(addr t0)"
  if shape_dev "$(ns r1)" uplink "$rate" 20 0 2>/dev/null; then
    check "netem delay: r1 -> storage round trip >= 20 ms" cmd_exec r1 "$PY" -c '
import socket, sys, time
t0 = time.monotonic(); socket.create_connection((sys.argv[1], 2379), timeout=3).close()
sys.exit(0 if time.monotonic() - t0 >= 0.020 else 1)' "$(addr st)"
  else
    echo "  skip  netem delay/loss: this kernel has no sch_netem"
  fi
  ((failures == 0)) || die "$failures selftest check(s) failed"
  echo "testbed selftest: PASS"
}

cmd=${1:-help}
(($#)) && shift
case "$cmd" in
  up) parse_options "$@"; cmd_up ;;
  down) parse_options "$@"; cmd_down ;;
  exec)
    (($# >= 2)) || die "exec NODE CMD..."
    node=$1; shift
    [ -f "$(state_dir)/env" ] || die "no testbed '$name' is up"
    cmd_exec "$node" "$@" ;;
  link) (($# >= 2)) || die "link NODE up|down"; n=$1 s=$2; shift 2; parse_options "$@"; cmd_link "$n" "$s" ;;
  shape) (($# >= 1)) || die "shape NODE [--rate R] [--delay MS] [--loss PCT]"; n=$1; shift; cmd_shape "$n" "$@" ;;
  restart-s3)
    secs=3
    [ "${1:-}" = --for ] && { secs=$2; shift 2; }
    parse_options "$@"; cmd_restart_s3 "$secs" ;;
  counters) json=''; [ "${1:-}" = --json ] && { json=--json; shift; }; parse_options "$@"; cmd_counters "$json" ;;
  run) parse_options "$@"; cmd_run ;;
  selftest) parse_options "$@"; cmd_selftest ;;
  help | -h | --help) usage ;;
  *) die "unknown command '$cmd' (see: testbed.sh help)" ;;
esac
