#!/usr/bin/env bash
# Runs `testbed.sh selftest` under a name of its own, then checks that nothing
# it created is left: no namespace, no state directory, no server process.
set -u
testbed=$1
name=dcrtb-self$$
bash "$testbed" selftest --name "$name" --rate 200mbit
rc=$?
[ $rc -eq 77 ] && exit 77
left=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -c "^$name-")
if [ "$left" -ne 0 ] || [ -d "/run/dcr-testbed/$name" ]; then
  echo "testbed-selftest: $left namespace(s) or the state directory of '$name' left behind" >&2
  bash "$testbed" down --name "$name"
  exit 1
fi
if pgrep -f "/run/dcr-testbed/$name/" >/dev/null; then
  echo "testbed-selftest: processes of '$name' still running:" >&2
  pgrep -af "/run/dcr-testbed/$name/" >&2
  exit 1
fi
exit $rc
