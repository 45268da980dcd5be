#!/usr/bin/env bash
# with-testenv.sh CMD...: start the test servers (scripts/testenv.sh up), run
# CMD with the SHOP_TEST_* variables from the env file, then stop again what
# this run started (and only that), and exit with CMD's status.
#
#   SHOP_TESTENV_KEEP=1       leave the servers running afterwards (a later
#                             `scripts/testenv.sh down` stops them)
#   SHOP_TESTENV_SENTINEL=1   also start the Sentinel group (up --with-sentinel)
#   SHOP_TESTENV_DIR, SHOP_TESTENV_PORT_OFFSET, SHOP_TEST_*: see testenv.sh
#
# Servers that were already running (started by an earlier `testenv.sh up`,
# by another engineer, or by the system) are reused and never stopped here.
set -euo pipefail

[[ $# -ge 1 ]] || { echo "usage: ${0##*/} CMD [ARGS...]" >&2; exit 2; }

here=$(cd "$(dirname "$0")" && pwd)
dir=${SHOP_TESTENV_DIR:-/tmp/shop-testenv}
case $dir in /*) ;; *) dir=$PWD/$dir ;; esac
export SHOP_TESTENV_DIR=$dir
mkdir -p "$dir"

keep=${SHOP_TESTENV_KEEP:-0}
[[ $keep == 1 || $keep == true ]] && keep=1 || keep=0

# Per-run list of what our `up` starts, so our `down` stops exactly that even
# if other runs share the directory.
runfile=$(mktemp "$dir/run.XXXXXX")
export SHOP_TESTENV_RUN_FILE=$runfile

# shellcheck disable=SC2317 # invoked via trap
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if ((keep)); then
		rm -f "$runfile"
		[[ -f $dir/env ]] && echo "with-testenv: SHOP_TESTENV_KEEP=1: servers left running; env: $dir/env" >&2
	else
		"$here/testenv.sh" down || echo "with-testenv: testenv.sh down failed" >&2
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

up_args=()
[[ ${SHOP_TESTENV_SENTINEL:-0} == 1 || ${SHOP_TESTENV_SENTINEL:-} == true ]] && up_args+=(--with-sentinel)
"$here/testenv.sh" up "${up_args[@]}" >/dev/null

# shellcheck source=/dev/null
. "$dir/env"

set +e
"$@"
status=$?
set -e
exit "$status"
