#!/bin/sh
# Runs the k6 flows (loadtest/k6/shop.js) against the compose stack, the way
# loadtest/runner runs them against local processes: reset the data to the
# loadtest fixture, put the two load-test SKUs on sale, mint user tokens,
# run k6 through the load balancer, then print the audit. `make up` first.
#
#   deploy/loadtest.sh                       # all flows, 100/s for 15 s
#   FLOWS=seckill RATE=200 deploy/loadtest.sh
#
# Needs docker compose, curl and the stack's admin token: SHOP_ADMIN_TOKEN,
# or the one make up wrote to .env. One backend per run: SHOP_LOCK_BACKEND=x make up, then
# this again; Grafana keeps each run apart by its backend label.
set -eu
cd "$(dirname "$0")/.."

COMPOSE="${COMPOSE:-docker compose}"
LB="http://127.0.0.1:${LB_PORT:-8080}"
ADMIN="${SHOP_ADMIN_TOKEN:-$(sed -n 's/^SHOP_ADMIN_TOKEN=//p' .env 2>/dev/null)}"
[ -n "$ADMIN" ] || { echo "no admin token: set SHOP_ADMIN_TOKEN or run make up (it writes .env)" >&2; exit 2; }
# The flows draw users up to 300 (orders use 100..300); the runner mints 500.
USERS="${USERS:-500}"
STOCK="${STOCK:-200}"
RATE="${RATE:-100}"
DURATION="${DURATION:-15}"
FLOWS="${FLOWS:-seckill,balance,likes,orders}"
out=loadtest/results/compose

# Tokens are signed by shop itself, inside a running instance, with the
# stack's secret (k6 cannot sign HS256 without a remote library). One exec
# per user, several at once: see "--token" below.
if [ "${1:-}" = "--token" ]; then
	tok="$($COMPOSE exec -T shop-1 /shop token "$2" -ttl 2h)"
	printf '{"user":%s,"token":"%s"}\n' "$2" "$tok"
	exit 0
fi

admin() {
	curl -fsS -X "$1" -H "Authorization: Bearer $ADMIN" -H 'Content-Type: application/json' \
		${3:+--data "$3"} "$LB$2"
}

echo "reset to the loadtest fixture; lt-hot has $STOCK units"
admin POST /admin/v1/reset '{"fixture":"loadtest"}' >/dev/null
admin POST /admin/v1/products "{\"sku\":\"lt-hot\",\"name\":\"Load test hot item\",\"stock\":$STOCK,\"price_cents\":1000}" >/dev/null
admin POST /admin/v1/products '{"sku":"lt-order","name":"Load test order item","stock":10000000,"price_cents":100}' >/dev/null

echo "minting $USERS user tokens"
mkdir -p "$out"
# The scripts find user n at index n-1: put the parallel output in order.
seq 1 "$USERS" | xargs -P 8 -n 1 "$0" --token | sort -t: -k2,2n >"$out/tokens.jsonl"
{
	printf '['
	paste -sd, "$out/tokens.jsonl"
	printf ']\n'
} >"$out/tokens.json"
rm -f "$out/tokens.jsonl"

# k6 exits 99 when a threshold is crossed: expected with SHOP_LOCK_BACKEND=none,
# and the audit below says by how much, so it does not stop the script.
status=0
$COMPOSE --profile loadtest run --rm \
	-e SHOP_FLOWS="$FLOWS" -e SHOP_RATE="$RATE" -e SHOP_DURATION="$DURATION" \
	-e SHOP_STOCK="$STOCK" -e SHOP_BUYERS="$USERS" \
	k6 run --quiet /loadtest/shop.js || status=$?

echo "audit (every drift must be 0 with a lock):"
admin GET /admin/v1/audit
echo
rm -f "$out/tokens.json"
case "$status" in
0 | 99) exit 0 ;;
*) exit "$status" ;;
esac
