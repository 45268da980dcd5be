#!/usr/bin/env bash
# Prints, as a Markdown table, what an uncontended acquire + release costs
# each Redis subject of internal/lockkit/lockbench in instruments that
# repeat on a shared machine:
#  - server instructions per cycle: callgrind on a private redis-server, the
#    same wall time idle subtracted (the server's timer);
#  - client instructions per cycle: callgrind on the rediscycles program
#    against a private redis-server, runs of 200 and 200 + CYCLES cycles,
#    their difference divided by CYCLES so that start-up cancels;
#  - calls per cycle, counted on the wire, and the client's allocations.
#
# usage: scripts/redis-instructions.sh LOCKBENCH_TEST_BINARY REDISCYCLES_BINARY [CYCLES] [RUNS]
set -euo pipefail
bin=$1 rediscycles=$2 cycles=${3:-1000} runs=${4:-2}
subjects=(shop-redis shop-redis-unfenced bsm-redislock redsync)
work=$(mktemp -d) client_server=
trap '[[ -z $client_server ]] || kill "$client_server"; rm -rf "$work"' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
await_server() { for _ in $(seq 150); do redis-cli -p "$1" ping >/dev/null 2>&1 && return; sleep 0.2; done; }

# measure SUBJECT: one private server under callgrind, one benchmark run;
# prints "instructions calls allocs".
measure() {
	local dir port vpid
	dir=$(mktemp -d "$work/run.XXXX")
	port=$(free_port)
	(cd "$dir" && exec valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" \
		redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no >"$dir/log" 2>&1) &
	vpid=$!
	await_server "$port"
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

# client SUBJECT: the client's instructions per cycle.
client() {
	local short long
	short=$(client_run "$1" 200)
	long=$(client_run "$1" $((200 + cycles)))
	echo $(((long - short) / cycles))
}

# client_run SUBJECT N: the instructions of one run of N cycles. Two Ps:
# with one, the runtime hands the P of a syscall that a loaded machine is
# slow to finish to another thread, and counts on a busy machine spread by
# 15 % instead of 5. No GC: its cost is the allocations column. No
# preemption signals: callgrind does not survive them. No RDTSCP, which the
# runtime reads its clock with where the CPU has it: valgrind stops at it
# with SIGILL on some CPUs (an AMD EPYC Turin VM here).
client_run() {
	GOMAXPROCS=2 GOGC=off GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off valgrind --tool=callgrind \
		--callgrind-out-file="$work/client.out" --log-file="$work/client.log" \
		"$rediscycles" -addr "127.0.0.1:$client_port" -subject "$1" -cycles "$2"
	awk '/Collected :/ {print $4}' "$work/client.log"
}

client_port=$(free_port)
redis-server --port "$client_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >"$work/client-server.log" 2>&1 &
client_server=$!
await_server "$client_port"

declare -A ins cins calls allocs
for r in $(seq "$runs"); do
	for s in "${subjects[@]}"; do # interleaved: a drift lands on every subject
		read -r i c a < <(measure "$s")
		ins[$s]+="$i " calls[$s]=$c allocs[$s]=$a
		cins[$s]+="$(client "$s") "
	done
done

range() { tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{v[NR]=$1} END {printf "%.1fk (%.1f-%.1fk)", v[int((NR+1)/2)]/1000, v[1]/1000, v[NR]/1000}'; }
median() { tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
bsm=$(echo "${ins[bsm-redislock]}" | median) rs=$(echo "${ins[redsync]}" | median)
cbsm=$(echo "${cins[bsm-redislock]}" | median)
echo "| subject | server instructions per cycle (callgrind on redis-server), median (range of $runs) | ÷ bsm/redislock | ÷ redsync | client instructions per cycle (callgrind on rediscycles), median (range of $runs) | ÷ bsm/redislock | calls per cycle (counted on the wire) | client allocs per cycle (testing.B) |"
echo "|---|---|---|---|---|---|---|---|"
for s in "${subjects[@]}"; do
	m=$(echo "${ins[$s]}" | median) cm=$(echo "${cins[$s]}" | median)
	printf '| %s | %s | %.2f | %.2f | %s | %.2f | %s | %s |\n' "$s" "$(echo "${ins[$s]}" | range)" \
		"$(echo "$m / $bsm" | bc -l)" "$(echo "$m / $rs" | bc -l)" \
		"$(echo "${cins[$s]}" | range)" "$(echo "$cm / $cbsm" | bc -l)" "${calls[$s]}" "${allocs[$s]}"
done
