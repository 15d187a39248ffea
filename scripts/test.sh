#!/usr/bin/env bash
# Sets up and builds build/, then runs every test suite. Ends with one line
# "tests: N passed, N failed, N skipped"; exits non-zero if any test failed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$DCR_ROOT"
set +e
meson test -C build --print-errorlogs --num-processes "${DCR_JOBS:-2}" ${DCR_TEST_ARGS:-}
rc=$?
set -e
log=build/meson-logs/testlog.json
if [ -f "$log" ]; then
  passed=$(grep -c '"result": "OK"' "$log" || true)
  failed=$(grep -cE '"result": "(FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS)"' "$log" || true)
  skipped=$(grep -c '"result": "SKIP"' "$log" || true)
  echo "tests: $passed passed, $failed failed, $skipped skipped"
fi
exit $rc
