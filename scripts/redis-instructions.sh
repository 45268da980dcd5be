#!/usr/bin/env bash
# Prints, as a Markdown table, what an uncontended acquire + release costs
# each Redis subject of internal/lockkit/lockbench in instruments that
# repeat on a shared machine: server instructions per cycle (callgrind on a
# private redis-server, the same wall time idle subtracted: the server's
# timer), calls per cycle counted on the wire, and client allocations.
#
# usage: scripts/redis-instructions.sh LOCKBENCH_TEST_BINARY [CYCLES] [RUNS]
set -euo pipefail
bin=$1 cycles=${2:-1000} runs=${3:-2}
subjects=(shop-redis shop-redis-unfenced bsm-redislock redsync)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# measure SUBJECT: one private server under callgrind, one benchmark run;
# prints "instructions calls allocs".
measure() {
	local dir port vpid
	dir=$(mktemp -d "$work/run.XXXX")
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	(cd "$dir" && exec valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" \
		redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no >"$dir/log" 2>&1) &
	vpid=$!
	for _ in $(seq 150); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
	SHOP_BENCH_CALLGRIND_ADDR=127.0.0.1:$port SHOP_BENCH_CALLGRIND_PID=$vpid \
		"$bin" -test.run '^$' -test.bench "^BenchmarkRedisInstructions/$1\$" -test.benchtime="${cycles}x" >"$dir/bench.txt"
	redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
	wait "$vpid" 2>/dev/null || true
	# Each call of the benchmark function dumps twice (the cycles, then as
	# long idle); the last call ran the requested cycles.
	local dumps run idle
	mapfile -t dumps < <(ls "$dir"/cg.out.* | sort -t. -k3 -n | tail -2)
	run=$(awk '/^summary:|^totals:/ {print $2; exit}' "${dumps[0]}")
	idle=$(awk '/^summary:|^totals:/ {print $2; exit}' "${dumps[1]}")
	awk -v ins=$(((run - idle) / cycles)) '/^BenchmarkRedisInstructions/ {
		for (i = 3; i < NF; i += 2) m[$(i+1)] = $i
		print ins, m["calls/op"], m["allocs/op"] }' "$dir/bench.txt"
}

declare -A ins calls allocs
for r in $(seq "$runs"); do
	for s in "${subjects[@]}"; do # interleaved: a drift lands on every subject
		read -r i c a < <(measure "$s")
		ins[$s]+="$i " calls[$s]=$c allocs[$s]=$a
	done
done

range() { tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{v[NR]=$1} END {printf "%.1fk (%.1f-%.1fk)", v[int((NR+1)/2)]/1000, v[1]/1000, v[NR]/1000}'; }
median() { tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
bsm=$(echo "${ins[bsm-redislock]}" | median) rs=$(echo "${ins[redsync]}" | median)
echo "| subject | server instructions per cycle, median (range of $runs) | ÷ bsm/redislock | ÷ redsync | calls per cycle (wire) | client allocs per cycle |"
echo "|---|---|---|---|---|---|"
for s in "${subjects[@]}"; do
	m=$(echo "${ins[$s]}" | median)
	printf '| %s | %s | %.2f | %.2f | %s | %s |\n' "$s" "$(echo "${ins[$s]}" | range)" \
		"$(echo "$m / $bsm" | bc -l)" "$(echo "$m / $rs" | bc -l)" "${calls[$s]}" "${allocs[$s]}"
done
