#!/bin/bash
# Start a throw-away OpenStack Swift cluster with the S3 API (s3api + tempauth)
# on free loopback ports, for the S3 object store interop tests.
#
#   start-swift.sh [BASE_DIR]
#
# Builds one-replica rings over a device directory in a fresh temporary
# directory under BASE_DIR (default: $DCR_SWIFT_TMP, else /tmp, else /var/tmp),
# writes account/container/object/proxy configs, starts the four servers,
# waits until a signed S3 request (ListBuckets) succeeds and then prints one
# line on stdout:
#
#   READY <proxy port> <access key> <secret key> <region>
#
# DCR_SWIFT_BIND names the address the servers listen on (default 127.0.0.1;
# the cluster testbed binds its storage host's address).
#
# With DCR_SWIFT_CERT and DCR_SWIFT_KEY set (PEM files), the proxy serves
# HTTPS with that certificate instead of plain HTTP.
#
# SIGUSR1 kills the proxy server (SIGKILL, as a crash would) and SIGUSR2
# starts it again on the same port with the same configuration and rings, so
# that tests can restart the S3 endpoint mid-transfer while the account,
# container and object servers (and the stored objects) stay.
#
# It then keeps running until its stdin reaches end of file (the parent exited
# or closed the pipe, even by crashing) or it gets SIGINT/SIGTERM, and on the
# way out stops every server it started and deletes the temporary directory.
# Exit status: 0 after a clean stop, 77 when the swift binaries are missing,
# 1 on any setup failure (the server logs go to stderr).
#
# Swift keeps object metadata in user extended attributes; the base directory
# must be on a filesystem that supports them (ext4, xfs, btrfs, tmpfs on
# Linux >= 6.6). Directories that do not are skipped with a message.
set -u

ACCESS_KEY='test:tester'
SECRET_KEY='testing'
REGION='us-east-1'
PY=/usr/bin/python3
BIND=${DCR_SWIFT_BIND:-127.0.0.1}

for b in swift-ring-builder swift-proxy-server swift-account-server swift-container-server swift-object-server; do
  if ! command -v "$b" >/dev/null 2>&1; then
    echo "start-swift: $b not found (install the Debian packages swift swift-proxy swift-account swift-container swift-object)" >&2
    exit 77
  fi
done
[ -x "$PY" ] || PY=python3

pids=()
dir=''
cleanup() {
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do
    # A server that ignores TERM for 5 s is killed.
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  [ -n "$dir" ] && rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 0' INT TERM

die() {
  echo "start-swift: $*" >&2
  if [ -n "$dir" ] && [ -d "$dir/log" ]; then
    for f in "$dir"/log/*.log; do echo "--- $f (last lines)" >&2; tail -n 30 "$f" >&2; done
  fi
  exit 1
}

# A base directory whose filesystem keeps user xattrs.
xattr_ok() {
  "$PY" - "$1" <<'PYEOF' 2>/dev/null
import os, sys, tempfile
with tempfile.NamedTemporaryFile(dir=sys.argv[1]) as f:
    os.setxattr(f.name, "user.dcr-probe", b"1")
    sys.exit(0 if os.getxattr(f.name, "user.dcr-probe") == b"1" else 1)
PYEOF
}
base=''
for cand in "${1:-}" "${DCR_SWIFT_TMP:-}" /tmp /var/tmp; do
  [ -n "$cand" ] && [ -d "$cand" ] || continue
  if xattr_ok "$cand"; then base=$cand; break; fi
  echo "start-swift: $cand has no user xattr support, trying the next directory" >&2
done
[ -n "$base" ] || die "no candidate directory supports user xattrs (pass one as the first argument)"
dir=$(mktemp -d "$base/dcr-swift-XXXXXX") || die "mktemp in $base failed"
mkdir -p "$dir/etc" "$dir/srv/d1" "$dir/log" || die "mkdir failed"

# Four free loopback ports, held open together so they differ, then released.
read -r proxy_port account_port container_port object_port < <("$PY" -c '
import socket, sys
ss = [socket.socket() for _ in range(4)]
for s in ss: s.bind((sys.argv[1], 0))
print(*[s.getsockname()[1] for s in ss])
for s in ss: s.close()' "$BIND")
[ -n "${object_port:-}" ] || die "could not pick free ports"

# Rings: 2^2 partitions, one replica, one device each. "rebalance" exits 1 for
# mere warnings, which a single-device ring always has.
for kind in account container object; do
  port_var=${kind}_port
  b="$dir/etc/$kind.builder"
  swift-ring-builder "$b" create 2 1 1 >/dev/null || die "ring create $kind"
  swift-ring-builder "$b" add "r1z1-$BIND:${!port_var}/d1" 1 >/dev/null || die "ring add $kind"
  swift-ring-builder "$b" rebalance >/dev/null
  [ $? -le 1 ] && [ -f "$dir/etc/$kind.ring.gz" ] || die "ring rebalance $kind"
done

user=$(id -un)
common() { # port
  cat <<CONF
[DEFAULT]
bind_ip = $BIND
bind_port = $1
workers = 0
user = $user
swift_dir = $dir/etc
devices = $dir/srv
mount_check = false
log_level = WARNING
CONF
}
for kind in account container object; do
  port_var=${kind}_port
  { common "${!port_var}"
    cat <<CONF
[pipeline:main]
pipeline = $kind-server
[app:$kind-server]
use = egg:swift#$kind
CONF
    [ "$kind" = object ] && printf '[object-updater]\n[object-auditor]\n'
  } > "$dir/etc/$kind-server.conf"
done
scheme=http
{ common "$proxy_port"
  if [ -n "${DCR_SWIFT_CERT:-}" ]; then
    scheme=https
    printf 'cert_file = %s\nkey_file = %s\n' "$DCR_SWIFT_CERT" "${DCR_SWIFT_KEY:?DCR_SWIFT_KEY must go with DCR_SWIFT_CERT}"
  fi
  cat <<CONF
[pipeline:main]
pipeline = catch_errors gatekeeper proxy-logging cache listing_formats s3api tempauth copy slo dlo proxy-logging proxy-server
[app:proxy-server]
use = egg:swift#proxy
account_autocreate = true
[filter:s3api]
use = egg:swift#s3api
location = $REGION
[filter:tempauth]
use = egg:swift#tempauth
user_test_tester = $SECRET_KEY .admin
[filter:catch_errors]
use = egg:swift#catch_errors
[filter:gatekeeper]
use = egg:swift#gatekeeper
[filter:proxy-logging]
use = egg:swift#proxy_logging
[filter:cache]
use = egg:swift#memcache
[filter:listing_formats]
use = egg:swift#listing_formats
[filter:copy]
use = egg:swift#copy
[filter:slo]
use = egg:swift#slo
[filter:dlo]
use = egg:swift#dlo
CONF
} > "$dir/etc/proxy-server.conf"

for kind in account container object proxy; do
  "swift-$kind-server" "$dir/etc/$kind-server.conf" -v </dev/null >>"$dir/log/$kind.log" 2>&1 &
  pids+=($!)
done
# The proxy is the last; while it is stopped on purpose its slot is skipped.
proxy_idx=$((${#pids[@]} - 1))
proxy_down=0
stop_proxy() {
  [ "$proxy_down" = 1 ] && return
  proxy_down=1
  kill -KILL "${pids[$proxy_idx]}" 2>/dev/null
  wait "${pids[$proxy_idx]}" 2>/dev/null
  echo "start-swift: proxy stopped (SIGUSR1)" >&2
}
start_proxy() {
  [ "$proxy_down" = 1 ] || return
  swift-proxy-server "$dir/etc/proxy-server.conf" -v </dev/null >>"$dir/log/proxy.log" 2>&1 &
  pids[$proxy_idx]=$!
  proxy_down=0
  echo "start-swift: proxy started again (SIGUSR2)" >&2
}

# Ready when a SigV4-signed ListBuckets answers 200 (an independent signer in
# the standard library of Python, so a failure here points at the server).
s3_ok() {
  "$PY" - "$proxy_port" "$ACCESS_KEY" "$SECRET_KEY" "$REGION" "$scheme" "$BIND" <<'PYEOF' 2>/dev/null
import datetime, hashlib, hmac, ssl, sys, urllib.request
port, ak, sk, region, scheme, bind = sys.argv[1:7]
host = bind + ":" + port
now = datetime.datetime.now(datetime.timezone.utc)
amz, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
empty = hashlib.sha256(b"").hexdigest()
signed = "host;x-amz-content-sha256;x-amz-date"
canon = "\n".join(["GET", "/", "", "host:" + host, "x-amz-content-sha256:" + empty, "x-amz-date:" + amz, "", signed, empty])
scope = "/".join([day, region, "s3", "aws4_request"])
sts = "\n".join(["AWS4-HMAC-SHA256", amz, scope, hashlib.sha256(canon.encode()).hexdigest()])
k = ("AWS4" + sk).encode()
for part in (day, region, "s3", "aws4_request"):
    k = hmac.new(k, part.encode(), hashlib.sha256).digest()
sig = hmac.new(k, sts.encode(), hashlib.sha256).hexdigest()
rq = urllib.request.Request(scheme + "://" + host + "/", headers={
    "x-amz-date": amz, "x-amz-content-sha256": empty,
    "Authorization": "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s" % (ak, scope, signed, sig)})
# Up is all this asks; the tests check the certificate.
with urllib.request.urlopen(rq, timeout=2, context=ssl._create_unverified_context()) as r:
    sys.exit(0 if r.status == 200 else 1)
PYEOF
}
deadline=$((SECONDS + 60))
until s3_ok; do
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || die "a swift server exited during start-up"; done
  [ $SECONDS -lt $deadline ] || die "no S3 answer on port $proxy_port within 60 s"
  sleep 0.2
done

echo "READY $proxy_port $ACCESS_KEY $SECRET_KEY $REGION"
trap stop_proxy USR1
trap start_proxy USR2
# Run until stdin closes; watch the servers meanwhile.
while :; do
  read -r -t 1 _
  rc=$?
  [ $rc -eq 0 ] && continue
  [ $rc -gt 128 ] || break # EOF
  for i in "${!pids[@]}"; do
    [ "$i" = "$proxy_idx" ] && [ "$proxy_down" = 1 ] && continue
    kill -0 "${pids[$i]}" 2>/dev/null || die "a swift server exited"
  done
done
exit 0
