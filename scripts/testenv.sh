#!/usr/bin/env bash
# testenv.sh: install and start, on loopback, every server the shop tests need.
#
# Usage:
#   scripts/testenv.sh up [--with-sentinel]   install what is missing, start what is not running
#   scripts/testenv.sh down                   stop what `up` started, remove its data dirs
#   scripts/testenv.sh status                 one line per server: address, up/down, owner
#
# Runs as root on Debian 12 (bookworm). No Docker; the only network access is
# Debian's apt repositories, and apt is touched only when something is missing
# (one `apt-get update`, then `apt-get install --no-install-recommends`).
#
# Servers (all on 127.0.0.1):
#   MariaDB        3306          reused if it answers (root, empty password), else started
#   Redis          6379          reused if it answers PING, else started (data in $SHOP_TESTENV_DIR)
#   Redis Cluster  17001-17006   3 masters (17001-17003 when created), a replica
#                                each (17004-17006); cluster bus on port+10000
#   Redlock Redis  17101-17103   3 independent masters
#   ZooKeeper      12181         standalone, minSessionTimeout=1000, 4lw commands enabled
#   etcd           12379/12380   client/peer
#   ZooKeeper ensemble 12281-12283  3 members (quorum 2), peer ports 12291-12293,
#                                election ports 12294-12296, minSessionTimeout=1000
#   etcd cluster   12471-12473   3 members (quorum 2), peer ports 12481-12483
#   memcached      11311
#   nats-server    14222         JetStream, file store (monitoring on 14224)
#   NATS cluster   14231-14233   3 JetStream nodes, routes 14241-14243,
#                                monitoring 14251-14253
#                  both built from the nats-server/v2 version go.mod pins
#                  (`go build`, cached by version), never Debian's package
#   with --with-sentinel:
#   Redis master   17201, replica 17202 (replicaof 17201)
#   Sentinels      17301-17303   master name "shopmaster", quorum 2,
#                                down-after 1000 ms, failover-timeout 3000 ms
#
# After `up`, $SHOP_TESTENV_DIR/env holds `export VAR='value'` lines (also
# printed) that the Go tests read:
#   SHOP_TEST_REDIS_ADDR SHOP_TEST_REDIS_CLUSTER_ADDRS SHOP_TEST_REDLOCK_ADDRS
#   SHOP_TEST_MYSQL_DSN SHOP_TEST_ZK_ADDRS SHOP_TEST_ETCD_ENDPOINTS
#   SHOP_TEST_MEMCACHED_ADDR SHOP_TEST_PROMTOOL (a path)
#   SHOP_TEST_ZK_ENSEMBLE_ADDRS SHOP_TEST_ETCD_CLUSTER_ENDPOINTS (every member,
#   comma-separated)
#   SHOP_TEST_NATS_URL SHOP_TEST_NATS_CLUSTER_URLS (every node, comma-separated)
#   SHOP_TEST_NATS_SERVER (a path: the nats-server binary, for tests that
#   start and stop their own)
#   and with sentinel: SHOP_TEST_SENTINEL_ADDRS SHOP_TEST_SENTINEL_MASTER
#   SHOP_TEST_SENTINEL_MASTER_ADDR SHOP_TEST_SENTINEL_REPLICA_ADDR
#
# Bring your own server: pre-set any of those variables (to something other
# than the default value) and that server is used as given: it is neither
# installed, started, checked nor stopped here. SHOP_TEST_SENTINEL_ADDRS covers
# the whole Sentinel group (master/replica variables then default to the
# values listed above unless also set). A variable equal to its default
# (e.g. because you sourced the env file) is treated as unset.
#
# Knobs:
#   SHOP_TESTENV_DIR          state, data, logs, pid files (default /tmp/shop-testenv)
#   SHOP_TESTENV_PORT_OFFSET  added to every private port above (not to 3306/6379),
#                             e.g. 1000 for a second, independent environment
#   SHOP_TESTENV_CLUSTER_PORT (first of six), SHOP_TESTENV_REDLOCK_PORT (first of three),
#   SHOP_TESTENV_SENTINEL_REDIS_PORT (master; replica is +1),
#   SHOP_TESTENV_SENTINEL_PORT (first of three), SHOP_TESTENV_ZK_PORT,
#   SHOP_TESTENV_ETCD_PORT, SHOP_TESTENV_ETCD_PEER_PORT, SHOP_TESTENV_MEMCACHED_PORT,
#   SHOP_TESTENV_ZK_ENSEMBLE_PORT (first client port of three; peer ports +10..+12,
#   election ports +13..+15), SHOP_TESTENV_ETCD_CLUSTER_PORT (first client port of
#   three; peer ports +10..+12)
#                             per-server port overrides
#   SHOP_TESTENV_NATS_PORT (client port of the lone server; monitoring +2),
#   SHOP_TESTENV_NATS_CLUSTER_PORT (first client port of three; routes +10..+12,
#   monitoring +20..+22)
#   SHOP_TESTENV_BIN_CACHE    where built server binaries are kept, one per
#                             version (default ~/.cache/shop-testenv)
#   SHOP_TESTENV_TIMEOUT      seconds to wait for each server (default 60)
#   SHOP_TESTENV_RUN_FILE     if set, `up` also writes there what this very
#                             invocation started, and `down` stops only what
#                             that file lists (scripts/with-testenv.sh uses it)
#
# Ownership: $SHOP_TESTENV_DIR/started lists the servers started by `up` in this
# directory that were not already running (one tab-separated line each:
# name, address, pid file, data dir, cmdline marker). `down` stops only those,
# and only if the pid still belongs to the expected process. Servers that were
# already answering (yours, a colleague's, the system MariaDB/Redis) are reused
# and never stopped.
set -euo pipefail

PROG=${0##*/}

DIR=${SHOP_TESTENV_DIR:-/tmp/shop-testenv}
case $DIR in /*) ;; *) DIR=$PWD/$DIR ;; esac
STARTED=$DIR/started
ENVFILE=$DIR/env
RUNFILE=${SHOP_TESTENV_RUN_FILE:-}
TIMEOUT=${SHOP_TESTENV_TIMEOUT:-60}

OFF=${SHOP_TESTENV_PORT_OFFSET:-0}
[[ $OFF =~ ^[0-9]+$ ]] || { echo "$PROG: SHOP_TESTENV_PORT_OFFSET must be a number" >&2; exit 2; }
CLUSTER_PORT=${SHOP_TESTENV_CLUSTER_PORT:-$((17001 + OFF))}
REDLOCK_PORT=${SHOP_TESTENV_REDLOCK_PORT:-$((17101 + OFF))}
SENT_REDIS_PORT=${SHOP_TESTENV_SENTINEL_REDIS_PORT:-$((17201 + OFF))}
SENTINEL_PORT=${SHOP_TESTENV_SENTINEL_PORT:-$((17301 + OFF))}
ZK_PORT=${SHOP_TESTENV_ZK_PORT:-$((12181 + OFF))}
ETCD_PORT=${SHOP_TESTENV_ETCD_PORT:-$((12379 + OFF))}
ETCD_PEER_PORT=${SHOP_TESTENV_ETCD_PEER_PORT:-$((ETCD_PORT + 1))}
MEMCACHED_PORT=${SHOP_TESTENV_MEMCACHED_PORT:-$((11311 + OFF))}
ZKE_PORT=${SHOP_TESTENV_ZK_ENSEMBLE_PORT:-$((12281 + OFF))}
ETCDC_PORT=${SHOP_TESTENV_ETCD_CLUSTER_PORT:-$((12471 + OFF))}
NATS_PORT=${SHOP_TESTENV_NATS_PORT:-$((14222 + OFF))}
NATSC_PORT=${SHOP_TESTENV_NATS_CLUSTER_PORT:-$((14231 + OFF))}
BIN_CACHE=${SHOP_TESTENV_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shop-testenv}
MODULE_DIR=$(cd "$(dirname "$0")/.." && pwd)
SENTINEL_MASTER_NAME=shopmaster

H=127.0.0.1
list3() { echo "$H:$1,$H:$(($1 + 1)),$H:$(($1 + 2))"; }

# Default value of every variable the tests read.
DEF_REDIS_ADDR=$H:6379
DEF_CLUSTER_ADDRS=$(list3 "$CLUSTER_PORT")
DEF_REDLOCK_ADDRS=$(list3 "$REDLOCK_PORT")
DEF_MYSQL_DSN="root:@tcp($H:3306)/?parseTime=true&loc=UTC&multiStatements=true"
DEF_ZK_ADDRS=$H:$ZK_PORT
DEF_ETCD_ENDPOINTS=$H:$ETCD_PORT
DEF_MEMCACHED_ADDR=$H:$MEMCACHED_PORT
DEF_ZK_ENSEMBLE_ADDRS=$(list3 "$ZKE_PORT")
DEF_ETCD_CLUSTER_ENDPOINTS=$(list3 "$ETCDC_PORT")
DEF_SENTINEL_ADDRS=$(list3 "$SENTINEL_PORT")
DEF_NATS_URL=nats://$H:$NATS_PORT
DEF_NATS_CLUSTER_URLS=nats://$H:$NATSC_PORT,nats://$H:$((NATSC_PORT + 1)),nats://$H:$((NATSC_PORT + 2))
REDIS_PKGS=redis-server:/usr/bin/redis-server,redis-tools:redis-cli,redis-sentinel:/usr/bin/redis-sentinel

# The servers `up` starts, in order, one line each: the SHOP_TEST_* variable
# the tests read, the variable holding its default, the packages it needs
# (PACKAGE:PROBE, comma-separated, or - for none) and the function that starts it or
# reuses one already answering. The server of a new lock backend is one
# more line here (its registry entry in internal/lockkit/registry names the
# variable; docs/backends.md). Sentinel is opt-in (--with-sentinel) and
# kept apart.
SERVERS=(
	"SHOP_TEST_MYSQL_DSN DEF_MYSQL_DSN mariadb-server:/usr/sbin/mariadbd,mariadb-client:mariadb up_mariadb"
	"SHOP_TEST_REDIS_ADDR DEF_REDIS_ADDR $REDIS_PKGS up_redis"
	"SHOP_TEST_REDIS_CLUSTER_ADDRS DEF_CLUSTER_ADDRS $REDIS_PKGS ensure_cluster"
	"SHOP_TEST_REDLOCK_ADDRS DEF_REDLOCK_ADDRS $REDIS_PKGS up_redlock"
	"SHOP_TEST_ZK_ADDRS DEF_ZK_ADDRS zookeeper:/usr/share/java/zookeeper.jar,zookeeper:/usr/share/zookeeper/bin/zkServer.sh ensure_zookeeper"
	"SHOP_TEST_ETCD_ENDPOINTS DEF_ETCD_ENDPOINTS etcd-server:etcd,etcd-client:etcdctl ensure_etcd"
	"SHOP_TEST_MEMCACHED_ADDR DEF_MEMCACHED_ADDR memcached:memcached ensure_memcached"
	"SHOP_TEST_ZK_ENSEMBLE_ADDRS DEF_ZK_ENSEMBLE_ADDRS zookeeper:/usr/share/java/zookeeper.jar ensure_zk_ensemble"
	"SHOP_TEST_ETCD_CLUSTER_ENDPOINTS DEF_ETCD_CLUSTER_ENDPOINTS etcd-server:etcd,etcd-client:etcdctl ensure_etcd_cluster"
	"SHOP_TEST_NATS_URL DEF_NATS_URL - ensure_nats"
	"SHOP_TEST_NATS_CLUSTER_URLS DEF_NATS_CLUSTER_URLS - ensure_nats_cluster"
)
DEF_SENTINEL_MASTER_ADDR=$H:$SENT_REDIS_PORT
DEF_SENTINEL_REPLICA_ADDR=$H:$((SENT_REDIS_PORT + 1))

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: ERROR: %s\n' "$PROG" "$*" >&2; exit 1; }

# user_set VAR DEFAULT: true if VAR is set by the user to a non-default value.
user_set() {
	local v=${!1:-}
	[[ -n $v && $v != "$2" ]]
}

# ---------------------------------------------------------------- probes

port_busy() { [[ -n $(ss -Hltn "sport = :$1" 2>/dev/null) ]]; }

rcli() { # rcli PORT ARGS...: redis-cli against loopback, never hangs
	local p=$1
	shift
	timeout 5 redis-cli -h "$H" -p "$p" "$@" 2>/dev/null | tr -d '\r'
}
redis_ok() { [[ $(rcli "$1" ping) == PONG ]]; }

# tcp_say PORT TEXT: send TEXT, print the reply until the server closes.
tcp_say() {
	# shellcheck disable=SC2016 # expanded by the inner bash
	timeout 3 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && printf "%b" "$2" >&3 && cat <&3' _ "$1" "$2" 2>/dev/null
}
zk_ok() { [[ $(tcp_say "$1" ruok) == imok ]]; }
# zk_serving PORT: a member of an ensemble that has a leader (ruok answers imok without one).
zk_serving() { tcp_say "$1" srvr | grep -Eq '^Mode: (leader|follower)'; }
memcached_ok() { [[ $(tcp_say "$1" 'version\r\nquit\r\n') == VERSION* ]]; }
etcd_ok() {
	ETCDCTL_API=3 timeout 10 etcdctl --endpoints="$H:$1" --dial-timeout=2s \
		--command-timeout=3s endpoint health >/dev/null 2>&1
}
mysql_tcp_ok() { timeout 10 mariadb -uroot -h"$H" -P3306 --connect-timeout=3 -e 'select 1' >/dev/null 2>&1; }
mysql_sock_ok() { timeout 10 mariadb -uroot --protocol=socket --connect-timeout=3 -e 'select 1' >/dev/null 2>&1; }
cluster_ok() { rcli "$1" cluster info | grep -qx 'cluster_state:ok'; }
cluster_blank() {
	local info
	info=$(rcli "$1" cluster info)
	grep -qx 'cluster_known_nodes:1' <<<"$info" && grep -qx 'cluster_slots_assigned:0' <<<"$info"
}
repl_ok() { # repl_ok MASTERPORT: of the pair PORT, PORT+1 one is a replica with its link up
	local p info replicas=0
	for p in "$1" $(($1 + 1)); do
		info=$(rcli "$p" info replication)
		if grep -qx 'role:slave' <<<"$info"; then
			grep -qx 'master_link_status:up' <<<"$info" || return 1
			replicas=$((replicas + 1))
		fi
	done
	((replicas >= 1))
}
sentinel_ok() { # all three Sentinels see each other and a master with a replica
	local p out
	for p in "$@"; do
		out=$(rcli "$p" sentinel ckquorum "$SENTINEL_MASTER_NAME")
		[[ $out == "OK 3 usable Sentinels"* ]] || return 1
		out=$(rcli "$p" sentinel master "$SENTINEL_MASTER_NAME" | awk 'prev == "num-slaves" { print; exit } { prev = $0 }')
		[[ ${out:-0} -ge 1 ]] || return 1
	done
}

# wait_for WHAT LOGFILE CMD...: poll CMD for up to $TIMEOUT s, else fail with the log tail.
wait_for() {
	local what=$1 logf=$2 deadline=$((SECONDS + TIMEOUT))
	shift 2
	until "$@"; do
		if ((SECONDS >= deadline)); then
			log "$what not ready after ${TIMEOUT}s"
			if [[ -f $logf ]]; then
				log "last lines of $logf:"
				tail -n 30 "$logf" >&2 || true
			fi
			exit 1
		fi
		sleep 0.5
	done
}

# ---------------------------------------------------------------- ownership

# pid_matches PIDFILE MARKER: the pid in PIDFILE is alive and its command line contains MARKER.
pid_matches() {
	local pid
	[[ -f $1 ]] || return 1
	pid=$(tr -dc '0-9' <"$1")
	[[ -n $pid && -r /proc/$pid/cmdline ]] || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$2"
}

# entry NAME [FILE]: print the ownership line for NAME.
entry() { [[ -f ${2:-$STARTED} ]] && awk -F'\t' -v n="$1" '$1 == n' "${2:-$STARTED}" | tail -n 1; }

owned() { # owned NAME: started by `up` in this dir and still running
	local name addr pidf data marker
	IFS=$'\t' read -r name addr pidf data marker <<<"$(entry "$1")" || return 1
	[[ -n ${name:-} ]] && pid_matches "$pidf" "$marker"
}

drop_entry() { # drop_entry NAME FILE
	[[ -f $2 ]] || return 0
	awk -F'\t' -v n="$1" '$1 != n' "$2" >"$2.tmp" && mv "$2.tmp" "$2"
}

STARTED_NOW=()
record() { # record NAME ADDR PIDFILE DATADIR MARKER
	local f
	for f in "$STARTED" ${RUNFILE:+"$RUNFILE"}; do
		drop_entry "$1" "$f"
		printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$f"
	done
	STARTED_NOW+=("$1")
}

note_reused() { # note_reused NAME ADDR
	if owned "$1"; then
		log "$2 ($1): already running, started earlier by testenv.sh up"
	else
		log "$2 ($1): already running, reusing it"
	fi
}

# ---------------------------------------------------------------- packages

APT_UPDATED=0
INSTALLED_NOW=" "
ensure_packages() {
	local -a need=()
	local spec pkg probe
	# each spec is PACKAGE:PROBE, PROBE being a path or a command that proves it is installed
	for spec in "$@"; do
		pkg=${spec%%:*}
		probe=${spec#*:}
		if [[ $probe == /* ]]; then
			[[ -e $probe ]] && continue
		else
			command -v "$probe" >/dev/null 2>&1 && continue
		fi
		dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' && continue
		[[ " ${need[*]} " == *" $pkg "* ]] || need+=("$pkg")
	done
	((${#need[@]})) || return 0
	[[ $(id -u) == 0 ]] || die "missing packages (${need[*]}) and not root; install them or run as root"
	log "installing: ${need[*]}"
	if ((!APT_UPDATED)); then
		apt-get update -q >&2
		APT_UPDATED=1
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >&2
	INSTALLED_NOW+="${need[*]} "
}

# ---------------------------------------------------------------- starters

spawn() { # spawn LOGFILE PIDFILE CMD...: run CMD detached (own session), record its pid
	local logf=$1 pidf=$2
	shift 2
	nohup setsid "$@" >>"$logf" 2>&1 </dev/null 9>&- &
	echo $! >"$pidf"
}

# redis_conf DIR PORT EXTRA-LINES...
redis_conf() {
	local d=$1 p=$2
	shift 2
	{
		echo "port $p"
		echo "bind $H"
		echo "protected-mode yes"
		echo "daemonize yes"
		echo "supervised no"
		echo "pidfile $d/redis.pid"
		echo "logfile $d/redis.log"
		echo "dir $d"
		echo 'save ""'
		echo "appendonly no"
		echo "enable-debug-command local"
		printf '%s\n' "$@"
	} >"$d/redis.conf"
}

# ensure_redis NAME PORT KEEPDATA EXTRA-LINES...: reuse or start a redis-server.
ensure_redis() {
	local name=$1 p=$2 keep=$3
	shift 3
	local d=$DIR/$name
	if redis_ok "$p"; then
		note_reused "$name" "$H:$p"
		return 0
	fi
	port_busy "$p" && die "$H:$p is in use but does not answer Redis PING; free the port or set SHOP_TESTENV_PORT_OFFSET"
	((keep)) || rm -rf "$d"
	mkdir -p "$d"
	redis_conf "$d" "$p" "$@"
	log "$H:$p ($name): starting redis-server"
	detach redis-server "$d/redis.conf" >>"$d/redis.log" 2>&1 </dev/null
	wait_for "redis $H:$p" "$d/redis.log" redis_ok "$p"
	record "$name" "$H:$p" "$d/redis.pid" "$d" ":$p"
}

ensure_sentinel() { # ensure_sentinel PORT MASTERPORT
	local p=$1 mp=$2 name=sentinel-$1
	local d=$DIR/$name
	if redis_ok "$p"; then
		note_reused "$name" "$H:$p"
		return 0
	fi
	port_busy "$p" && die "$H:$p is in use but does not answer PING; free the port or set SHOP_TESTENV_PORT_OFFSET"
	rm -rf "$d"
	mkdir -p "$d"
	{
		echo "port $p"
		echo "bind $H"
		echo "daemonize yes"
		echo "pidfile $d/redis.pid"
		echo "logfile $d/redis.log"
		echo "dir $d"
		echo "sentinel monitor $SENTINEL_MASTER_NAME $H $mp 2"
		echo "sentinel down-after-milliseconds $SENTINEL_MASTER_NAME 1000"
		echo "sentinel failover-timeout $SENTINEL_MASTER_NAME 3000"
		echo "sentinel parallel-syncs $SENTINEL_MASTER_NAME 1"
	} >"$d/sentinel.conf"
	log "$H:$p ($name): starting redis-sentinel"
	detach redis-sentinel "$d/sentinel.conf" >>"$d/redis.log" 2>&1 </dev/null
	wait_for "sentinel $H:$p" "$d/redis.log" redis_ok "$p"
	record "$name" "$H:$p" "$d/redis.pid" "$d" ":$p"
}

up_mariadb() {
	ensure_mariadb
	raise_mysql_connections
}

up_redis() {
	if redis_ok 6379; then
		note_reused redis-6379 "$H:6379"
	else
		port_busy 6379 && die "$H:6379 is in use but does not answer Redis PING; stop it or set SHOP_TEST_REDIS_ADDR"
		ensure_redis redis-6379 6379 0
	fi
}

up_redlock() {
	local p
	for p in "$REDLOCK_PORT" $((REDLOCK_PORT + 1)) $((REDLOCK_PORT + 2)); do
		ensure_redis "redlock-$p" "$p" 0
	done
}

# Three shop processes, each with its pool and a mysql-forupdate pool of
# held connections, plus parallel test packages, pass the default 151
# connections; the setting lasts until the server restarts.
raise_mysql_connections() {
	timeout 10 mariadb -uroot -h"$H" -P3306 -e 'SET GLOBAL max_connections = GREATEST(@@max_connections, 1000)' >/dev/null 2>&1 ||
		log "could not raise max_connections on $H:3306 (continuing)"
}

ensure_mariadb() {
	local name=mariadb logf=$DIR/mariadb.log started=0
	if mysql_tcp_ok; then
		note_reused "$name" "$H:3306"
		return 0
	fi
	if ! port_busy 3306; then
		if [[ ! -d /var/lib/mysql/mysql ]]; then
			log "initialising /var/lib/mysql (mariadb-install-db)"
			mariadb-install-db --user=mysql --datadir=/var/lib/mysql >>"$logf" 2>&1 ||
				{ tail -n 30 "$logf" >&2; die "mariadb-install-db failed"; }
		fi
		install -d -o mysql -g mysql -m 0755 /run/mysqld
		log "$H:3306 ($name): starting mariadbd"
		detach start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- \
			--user=mysql --pid-file=/run/mysqld/mysqld.pid --log-error="$logf" </dev/null
		started=1
		wait_for "mariadb (socket)" "$logf" mysql_sock_ok
	fi
	if ! mysql_tcp_ok && ((started)) || [[ $INSTALLED_NOW == *" mariadb-server "* ]]; then
		# Debian's root@localhost authenticates via unix_socket only; the
		# tests connect over TCP as root with an empty password. Only done
		# for a server this script started or installed.
		if mysql_sock_ok && ! mysql_tcp_ok; then
			log "allowing root with an empty password over TCP (test server)"
			mariadb -uroot --protocol=socket -e "
				ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket;
				CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
				GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
				FLUSH PRIVILEGES;"
		fi
	fi
	if ! mysql_tcp_ok; then
		port_busy 3306 || wait_for "mariadb $H:3306" "$logf" mysql_tcp_ok
		mysql_tcp_ok || die "something listens on $H:3306 but \`mariadb -uroot -h$H -e 'select 1'\` fails; allow root with an empty password over TCP or set SHOP_TEST_MYSQL_DSN"
	fi
	((started)) && record "$name" "$H:3306" /run/mysqld/mysqld.pid - mariadbd
	return 0
}

ensure_cluster() {
	# Three masters and a replica for each: a test fails a shard over
	# (CLUSTER FAILOVER on its replica) and checks every client can still lock.
	local p0=$CLUSTER_PORT p i alive=0 name
	local masters=("$p0" $((p0 + 1)) $((p0 + 2))) replicas=($((p0 + 3)) $((p0 + 4)) $((p0 + 5)))
	local ports=("${masters[@]}" "${replicas[@]}")
	for p in "${ports[@]}"; do redis_ok "$p" && alive=$((alive + 1)); done
	for p in "${ports[@]}"; do
		# When some nodes are still up, keep nodes.conf so a restarted node rejoins.
		ensure_redis "redis-cluster-$p" "$p" $((alive > 0)) \
			"cluster-enabled yes" "cluster-config-file nodes.conf" \
			"cluster-node-timeout 5000" "cluster-require-full-coverage yes"
	done
	for p in "${ports[@]}"; do
		rcli "$p" cluster info | grep -q '^cluster_state:' ||
			die "$H:$p answers PING but is not a cluster-enabled Redis; free the port or set SHOP_TESTENV_PORT_OFFSET"
	done
	local all_ok=1 all_blank=1
	for p in "${ports[@]}"; do
		cluster_ok "$p" || all_ok=0
		cluster_blank "$p" || all_blank=0
	done
	if ((!all_ok && all_blank)); then
		log "creating Redis Cluster on ${ports[*]} (3 masters, 1 replica each)"
		local addrs=()
		for p in "${ports[@]}"; do addrs+=("$H:$p"); done
		timeout 60 redis-cli --cluster create "${addrs[@]}" \
			--cluster-replicas 1 --cluster-yes >"$DIR/redis-cluster-create.log" 2>&1 ||
			{ tail -n 30 "$DIR/redis-cluster-create.log" >&2; die "redis-cli --cluster create failed"; }
	fi
	# A cluster made by an older testenv.sh has no replicas: give each
	# master the blank node of the same rank.
	for i in 0 1 2; do
		p=${replicas[i]}
		cluster_blank "$p" || continue
		cluster_ok "${masters[i]}" || die "cannot add $H:$p as a replica: $H:${masters[i]} is not in a healthy cluster"
		log "adding $H:$p as a replica of $H:${masters[i]}"
		timeout 60 redis-cli --cluster add-node "$H:$p" "$H:${masters[i]}" --cluster-slave \
			--cluster-master-id "$(rcli "${masters[i]}" cluster myid)" >>"$DIR/redis-cluster-create.log" 2>&1 ||
			{ tail -n 30 "$DIR/redis-cluster-create.log" >&2; die "redis-cli --cluster add-node failed"; }
	done
	for p in "${ports[@]}"; do
		wait_for "redis cluster node $H:$p (cluster_state:ok)" "$DIR/redis-cluster-$p/redis.log" cluster_ok "$p"
	done
}

# zk_files DIR CLIENTPORT [EXTRA-LINES]: zoo.cfg and log4j.properties of a
# ZooKeeper server whose state lives in DIR.
zk_files() {
	local d=$1 p=$2
	mkdir -p "$d/conf" "$d/data"
	cat >"$d/conf/zoo.cfg" <<-EOF
		tickTime=${ZK_TICK:-2000}
		initLimit=10
		syncLimit=5
		dataDir=$d/data
		clientPort=$p
		clientPortAddress=$H
		minSessionTimeout=1000
		maxSessionTimeout=60000
		maxClientCnxns=0
		admin.enableServer=false
		4lw.commands.whitelist=*
		${3:-}
	EOF
	cat >"$d/conf/log4j.properties" <<-EOF
		log4j.rootLogger=INFO, FILE
		log4j.appender.FILE=org.apache.log4j.FileAppender
		log4j.appender.FILE.File=$d/zookeeper.log
		log4j.appender.FILE.layout=org.apache.log4j.PatternLayout
		log4j.appender.FILE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n
	EOF
}

# zk_spawn NAME DIR HEAP: start the ZooKeeper server of DIR, without waiting.
zk_spawn() {
	local name=$1 d=$2 heap=$3 java
	java=$(command -v java || true)
	[[ -n $java ]] || java=/usr/lib/jvm/default-java/bin/java
	[[ -x $java ]] || die "no java found (the zookeeper package should have pulled in a JRE)"
	# Debian's zkEnv.sh uses CLASSPATH=/etc/zookeeper/conf:/usr/share/java/zookeeper.jar;
	# zookeeper.jar's manifest Class-Path pulls in its dependencies. We put our
	# own conf dir first and add the slf4j->log4j binding so logs land in $d.
	local cp=$d/conf:/usr/share/java/zookeeper.jar jar
	for jar in /usr/share/java/slf4j-log4j12.jar /usr/share/java/log4j-1.2.jar; do
		[[ -f $jar ]] && cp+=:$jar
	done
	log "$name: starting ZooKeeper"
	spawn "$d/zookeeper.out" "$d/zookeeper.pid" "$java" -Xms32m -Xmx"$heap" \
		-Dzookeeper.log.dir="$d" -Dlog4j.configuration="file:$d/conf/log4j.properties" \
		-cp "$cp" org.apache.zookeeper.server.quorum.QuorumPeerMain "$d/conf/zoo.cfg"
}

ensure_zookeeper() {
	local p=$ZK_PORT name=zookeeper-$ZK_PORT
	local d=$DIR/$name
	if zk_ok "$p"; then
		note_reused "$name" "$H:$p"
		return 0
	fi
	port_busy "$p" && die "$H:$p is in use but does not answer ZooKeeper ruok; free the port or set SHOP_TESTENV_PORT_OFFSET"
	rm -rf "$d"
	zk_files "$d" "$p"
	zk_spawn "$name" "$d" 256m
	wait_for "zookeeper $H:$p" "$d/zookeeper.out" zk_ok "$p"
	record "$name" "$H:$p" "$d/zookeeper.pid" "$d" "$d/conf/zoo.cfg"
}

# Servers started without waiting (the members of the ZooKeeper ensemble
# and of the etcd cluster come up together: a member is ready only once a
# quorum is), each line NAME ADDR PIDFILE DATADIR MARKER PROBE PORT LOGFILE,
# waited for and recorded by await_pending.
# UNREADY lists members reused while still unready (NAME PROBE PORT): they
# are waited for too.
PENDING=()
UNREADY=()
await_pending() {
	local line name addr pidf data marker probe p logf
	for line in "${PENDING[@]}"; do
		IFS=$'\t' read -r name addr pidf data marker probe p logf <<<"$line"
		wait_for "$name $addr" "$logf" "$probe" "$p"
		record "$name" "$addr" "$pidf" "$data" "$marker"
	done
	for line in "${UNREADY[@]}"; do
		read -r name probe p <<<"$line"
		logf=$(find "$DIR/$name" -maxdepth 1 -name '*.log' | head -n 1)
		wait_for "$name $H:$p" "$logf" "$probe" "$p"
	done
	PENDING=() UNREADY=()
}

# cluster_start KIND FIRSTPORT NAMEPREFIX HEALTHY-PROBE STARTER: for each of
# three members (client port FIRSTPORT+i), reuse it if it is healthy or
# still ours, otherwise start it with STARTER I PORT DIR FRESH. A member
# rejoins with its data when another member is still ours; when none is,
# every member starts afresh.
cluster_start() {
	local kind=$1 p0=$2 prefix=$3 probe=$4 starter=$5 i p name ours=0 fresh
	for i in 0 1 2; do owned "$prefix-$((p0 + i))" && ours=$((ours + 1)); done
	fresh=$((ours == 0))
	for i in 0 1 2; do
		p=$((p0 + i))
		name=$prefix-$p
		if "$probe" "$p"; then
			note_reused "$name" "$H:$p"
			continue
		fi
		if owned "$name"; then
			# ours and running, but without a quorum yet: rejoining
			note_reused "$name" "$H:$p"
			UNREADY+=("$name $probe $p")
			continue
		fi
		port_busy "$p" && die "$H:$p is in use but is not a healthy $kind member; free the port or set SHOP_TESTENV_PORT_OFFSET"
		"$starter" "$i" "$p" "$DIR/$name" "$fresh"
	done
}

ensure_zk_ensemble() {
	cluster_start ZooKeeper "$ZKE_PORT" zookeeper-ensemble zk_serving zk_member
}

# zk_member I PORT DIR FRESH: member I+1 of the ensemble; peer and election
# ports are the client port + 10 and + 13. A short tick (500 ms) so that a
# leader's loss is noticed, and a new one elected, within seconds.
zk_member() {
	local i=$1 p=$2 d=$3 fresh=$4 j servers=""
	for j in 0 1 2; do
		servers+="server.$((j + 1))=$H:$((ZKE_PORT + 10 + j)):$((ZKE_PORT + 13 + j))"$'\n'
	done
	port_busy $((ZKE_PORT + 10 + i)) && die "ZooKeeper peer port $H:$((ZKE_PORT + 10 + i)) is in use; set SHOP_TESTENV_ZK_ENSEMBLE_PORT"
	((fresh)) && rm -rf "$d"
	ZK_TICK=500 zk_files "$d" "$p" "$servers"
	echo $((i + 1)) >"$d/data/myid"
	zk_spawn "zookeeper-ensemble-$p" "$d" 128m
	PENDING+=("zookeeper-ensemble-$p"$'\t'"$H:$p"$'\t'"$d/zookeeper.pid"$'\t'"$d"$'\t'"$d/conf/zoo.cfg"$'\t'zk_serving$'\t'"$p"$'\t'"$d/zookeeper.out")
}

ensure_etcd() {
	local p=$ETCD_PORT pp=$ETCD_PEER_PORT name=etcd-$ETCD_PORT
	local d=$DIR/$name
	if etcd_ok "$p"; then
		note_reused "$name" "$H:$p"
		return 0
	fi
	port_busy "$p" && die "$H:$p is in use but etcd is not healthy there; free the port or set SHOP_TESTENV_PORT_OFFSET"
	port_busy "$pp" && die "etcd peer port $H:$pp is in use; set SHOP_TESTENV_ETCD_PEER_PORT"
	rm -rf "$d"
	mkdir -p "$d"
	log "$H:$p ($name): starting etcd"
	spawn "$d/etcd.log" "$d/etcd.pid" etcd --name shop-testenv --data-dir "$d/data" \
		--listen-client-urls "http://$H:$p" --advertise-client-urls "http://$H:$p" \
		--listen-peer-urls "http://$H:$pp" --initial-advertise-peer-urls "http://$H:$pp" \
		--initial-cluster "shop-testenv=http://$H:$pp" --initial-cluster-state new \
		--initial-cluster-token "shop-testenv-$p" --logger zap --log-outputs stderr
	wait_for "etcd $H:$p" "$d/etcd.log" etcd_ok "$p"
	record "$name" "$H:$p" "$d/etcd.pid" "$d" "$d/data"
}

ensure_etcd_cluster() {
	cluster_start etcd "$ETCDC_PORT" etcd-cluster etcd_ok etcd_member
}

# etcd_member I PORT DIR FRESH: member I of the cluster; its peer port is the
# client port + 10.
etcd_member() {
	local i=$1 p=$2 d=$3 fresh=$4 j cluster=""
	for j in 0 1 2; do
		cluster+="${cluster:+,}shop-etcd-$j=http://$H:$((ETCDC_PORT + 10 + j))"
	done
	local pp=$((p + 10))
	port_busy "$pp" && die "etcd peer port $H:$pp is in use; set SHOP_TESTENV_ETCD_CLUSTER_PORT"
	((fresh)) && rm -rf "$d"
	mkdir -p "$d"
	log "$H:$p (etcd-cluster-$p): starting etcd"
	spawn "$d/etcd.log" "$d/etcd.pid" etcd --name "shop-etcd-$i" --data-dir "$d/data" \
		--listen-client-urls "http://$H:$p" --advertise-client-urls "http://$H:$p" \
		--listen-peer-urls "http://$H:$pp" --initial-advertise-peer-urls "http://$H:$pp" \
		--initial-cluster "$cluster" --initial-cluster-state new \
		--initial-cluster-token "shop-testenv-cluster-$ETCDC_PORT" --logger zap --log-outputs stderr
	PENDING+=("etcd-cluster-$p"$'\t'"$H:$p"$'\t'"$d/etcd.pid"$'\t'"$d"$'\t'"$d/data"$'\t'etcd_ok$'\t'"$p"$'\t'"$d/etcd.log")
}

ensure_memcached() {
	local p=$MEMCACHED_PORT name=memcached-$MEMCACHED_PORT
	local d=$DIR/$name
	if memcached_ok "$p"; then
		note_reused "$name" "$H:$p"
		return 0
	fi
	port_busy "$p" && die "$H:$p is in use but does not answer memcached 'version'; free the port or set SHOP_TESTENV_PORT_OFFSET"
	rm -rf "$d"
	mkdir -p "$d"
	log "$H:$p ($name): starting memcached"
	# -u root: memcached writes the pid file after dropping privileges, and
	# the memcache user cannot write into our root-owned directory.
	detach memcached -d -P "$d/memcached.pid" -l "$H" -p "$p" -U 0 -m 64 -u root >>"$d/memcached.log" 2>&1 </dev/null
	wait_for "memcached $H:$p" "$d/memcached.log" memcached_ok "$p"
	record "$name" "$H:$p" "$d/memcached.pid" "$d" "-p $p"
}

# nats_server_bin: the nats-server built from the version go.mod pins (the
# one the service embeds), built once per version into $BIN_CACHE. Debian's
# package (2.9) predates JetStream's fixes to deduplication across leader
# changes, so it is never used.
NATS_BIN=
nats_server_bin() {
	if [[ -z $NATS_BIN ]]; then
		command -v go >/dev/null 2>&1 || die "go is not on PATH: needed to build nats-server from go.mod's version"
		local ver
		ver=$(cd "$MODULE_DIR" && go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2) ||
			die "cannot read the nats-server/v2 version from $MODULE_DIR/go.mod"
		NATS_BIN=$BIN_CACHE/nats-server-$ver
		if [[ ! -x $NATS_BIN ]]; then
			mkdir -p "$BIN_CACHE"
			log "building nats-server $ver into $NATS_BIN"
			# build beside, then rename: a concurrent build never leaves a half-written binary
			(cd "$MODULE_DIR" && go build -o "$NATS_BIN.tmp.$$" github.com/nats-io/nats-server/v2) >&2 ||
				die "go build github.com/nats-io/nats-server/v2 failed"
			mv -f "$NATS_BIN.tmp.$$" "$NATS_BIN"
		fi
	fi
	echo "$NATS_BIN"
}

# /healthz answers 200 only once JetStream is ready (on a cluster: a meta
# leader elected and this node current).
nats_health() { timeout 3 curl -sf "http://$H:$1/healthz" >/dev/null 2>&1; }
nats_ok() { nats_health $(($1 + 2)); }
nats_cluster_ok() { nats_health $(($1 + 20)); }

# nats_conf DIR NAME CLIENTPORT MONITORPORT [EXTRA-LINES]
nats_conf() {
	local d=$1 name=$2 p=$3 mp=$4
	mkdir -p "$d/jetstream"
	cat >"$d/nats.conf" <<-EOF
		server_name: $name
		listen: $H:$p
		http: $H:$mp
		jetstream {
		  store_dir: "$d/jetstream"
		  max_memory_store: 64MB
		  max_file_store: 1GB
		}
		${5:-}
	EOF
}

ensure_nats() {
	local p=$NATS_PORT name=nats-$NATS_PORT bin
	local d=$DIR/$name
	if nats_ok "$p"; then
		note_reused "$name" "$H:$p"
		return 0
	fi
	port_busy "$p" && die "$H:$p is in use but is not a healthy nats-server; free the port or set SHOP_TESTENV_PORT_OFFSET"
	port_busy $((p + 2)) && die "nats monitoring port $H:$((p + 2)) is in use; set SHOP_TESTENV_NATS_PORT"
	bin=$(nats_server_bin)
	rm -rf "$d"
	nats_conf "$d" "shop-$p" "$p" $((p + 2))
	log "$H:$p ($name): starting nats-server"
	spawn "$d/nats.log" "$d/nats.pid" "$bin" -c "$d/nats.conf"
	wait_for "nats-server $H:$p" "$d/nats.log" nats_ok "$p"
	record "$name" "$H:$p" "$d/nats.pid" "$d" "$d/nats.conf"
}

ensure_nats_cluster() {
	cluster_start nats-server "$NATSC_PORT" nats-cluster nats_cluster_ok nats_member
}

# nats_member I PORT DIR FRESH: node I of the JetStream cluster; its route
# port is the client port + 10, its monitoring port + 20.
nats_member() {
	local i=$1 p=$2 d=$3 fresh=$4 j routes="" bin
	for j in 0 1 2; do
		routes+="${routes:+, }nats-route://$H:$((NATSC_PORT + 10 + j))"
	done
	port_busy $((p + 10)) && die "nats route port $H:$((p + 10)) is in use; set SHOP_TESTENV_NATS_CLUSTER_PORT"
	port_busy $((p + 20)) && die "nats monitoring port $H:$((p + 20)) is in use; set SHOP_TESTENV_NATS_CLUSTER_PORT"
	bin=$(nats_server_bin)
	((fresh)) && rm -rf "$d"
	nats_conf "$d" "shop-c$i-$p" "$p" $((p + 20)) "cluster {
		  name: shop-testenv-$NATSC_PORT
		  listen: $H:$((p + 10))
		  routes: [$routes]
		}"
	log "$H:$p (nats-cluster-$p): starting nats-server"
	spawn "$d/nats.log" "$d/nats.pid" "$bin" -c "$d/nats.conf"
	PENDING+=("nats-cluster-$p"$'\t'"$H:$p"$'\t'"$d/nats.pid"$'\t'"$d"$'\t'"$d/nats.conf"$'\t'nats_cluster_ok$'\t'"$p"$'\t'"$d/nats.log")
}

ensure_sentinel_group() {
	local mp=$SENT_REDIS_PORT sp=$SENTINEL_PORT
	# repl-diskless-sync-delay 0: a (re)attaching replica syncs at once
	# instead of after the default 5 s, which matters for failover tests.
	ensure_redis "sentinel-redis-$mp" "$mp" 0 "repl-diskless-sync-delay 0"
	ensure_redis "sentinel-redis-$((mp + 1))" $((mp + 1)) 0 "repl-diskless-sync-delay 0" "replicaof $H $mp"
	wait_for "replication $H:$mp -> $H:$((mp + 1))" "$DIR/sentinel-redis-$((mp + 1))/redis.log" repl_ok "$mp"
	local p
	for p in "$sp" $((sp + 1)) $((sp + 2)); do ensure_sentinel "$p" "$mp"; done
	wait_for "sentinels $sp-$((sp + 2)) (quorum, replica known)" "$DIR/sentinel-$sp/redis.log" \
		sentinel_ok "$sp" $((sp + 1)) $((sp + 2))
	local cur
	cur=$(rcli "$sp" sentinel get-master-addr-by-name "$SENTINEL_MASTER_NAME" | paste -sd:)
	[[ $cur == "$H:$mp" ]] || log "note: Sentinel reports the current master of $SENTINEL_MASTER_NAME as $cur (after a failover), not $H:$mp"
}

# ---------------------------------------------------------------- commands

# lock_dir: serialise up/down on one directory. The lock lives on fd 9, and
# every server is started through `detach`, which closes fd 9, so no daemon
# inherits (and holds) the lock.
lock_dir() {
	mkdir -p "$DIR"
	exec 9>>"$DIR/testenv.lock"
	flock -w 600 9 || die "another testenv.sh holds $DIR/testenv.lock"
}
detach() { "$@" 9>&-; }

cmd_up() {
	local with_sentinel=0 a
	for a in "$@"; do
		case $a in
		--with-sentinel) with_sentinel=1 ;;
		*) die "unknown option for up: $a" ;;
		esac
	done
	lock_dir
	mkdir -p "$DIR"
	touch "$STARTED"
	[[ -z $RUNFILE ]] || : >"$RUNFILE"

	local use_sent=$with_sentinel line var def pkgs start spec
	local -a run=()
	user_set SHOP_TEST_SENTINEL_ADDRS "$DEF_SENTINEL_ADDRS" && use_sent=0

	# promtool (Debian's prometheus package) tests deploy/prometheus's
	# alert rules, and chromium renders the load-test report; tools, not
	# servers: nothing to start.
	local -a pk=(iproute2:ss netcat-openbsd:nc prometheus:promtool chromium:chromium)
	for line in "${SERVERS[@]}"; do
		read -r var def pkgs start <<<"$line"
		user_set "$var" "${!def}" && continue
		if [[ $pkgs != - ]]; then
			IFS=, read -ra spec <<<"$pkgs"
			pk+=("${spec[@]}")
		fi
		run+=("$start")
	done
	if ((use_sent)); then
		IFS=, read -ra spec <<<"$REDIS_PKGS"
		pk+=("${spec[@]}")
	fi
	ensure_packages "${pk[@]}"

	for start in "${run[@]}"; do
		"$start"
	done
	await_pending
	((use_sent)) && ensure_sentinel_group

	local q="'"
	{
		for line in "${SERVERS[@]}"; do
			read -r var def _ <<<"$line"
			printf 'export %s=%s%s%s\n' "$var" "$q" "${!var:-${!def}}" "$q"
		done
		printf "export SHOP_TEST_PROMTOOL='%s'\n" "${SHOP_TEST_PROMTOOL:-$(command -v promtool)}"
		printf "export SHOP_TEST_CHROMIUM='%s'\n" "${SHOP_TEST_CHROMIUM:-$(command -v chromium)}"
		printf "export SHOP_TEST_NATS_SERVER='%s'\n" "${SHOP_TEST_NATS_SERVER:-$(nats_server_bin)}"
		if ((with_sentinel)) || user_set SHOP_TEST_SENTINEL_ADDRS "$DEF_SENTINEL_ADDRS"; then
			printf "export SHOP_TEST_SENTINEL_ADDRS='%s'\n" "${SHOP_TEST_SENTINEL_ADDRS:-$DEF_SENTINEL_ADDRS}"
			printf "export SHOP_TEST_SENTINEL_MASTER='%s'\n" "${SHOP_TEST_SENTINEL_MASTER:-$SENTINEL_MASTER_NAME}"
			printf "export SHOP_TEST_SENTINEL_MASTER_ADDR='%s'\n" "${SHOP_TEST_SENTINEL_MASTER_ADDR:-$DEF_SENTINEL_MASTER_ADDR}"
			printf "export SHOP_TEST_SENTINEL_REPLICA_ADDR='%s'\n" "${SHOP_TEST_SENTINEL_REPLICA_ADDR:-$DEF_SENTINEL_REPLICA_ADDR}"
		fi
	} >"$ENVFILE.tmp"
	mv "$ENVFILE.tmp" "$ENVFILE"
	if ((${#STARTED_NOW[@]})); then
		log "started now: ${STARTED_NOW[*]}"
	else
		log "started now: nothing (everything was already running)"
	fi
	log "env file: $ENVFILE"
	cat "$ENVFILE"
}

# stop_wave LINE...: SIGTERM every listed server that is still ours, wait up
# to 10 s for all of them, SIGKILL what is left, then remove their data dirs.
stop_wave() {
	local line name addr pidf data marker pid i left
	local -a pids=() dirs=()
	for line in "$@"; do
		IFS=$'\t' read -r name addr pidf data marker <<<"$line"
		[[ -n ${name:-} ]] || continue
		if pid_matches "$pidf" "$marker"; then
			pid=$(tr -dc '0-9' <"$pidf")
			log "stopping $addr ($name, pid $pid)"
			kill -TERM "$pid" 2>/dev/null || true
			pids+=("$pid")
		else
			log "$addr ($name) is not running (or its pid is no longer ours); nothing to stop"
		fi
		[[ $data != - && $data == "$DIR"/* ]] && dirs+=("$data")
	done
	for ((i = 0; i < 200; i++)); do
		left=0
		for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left=1; done
		((left)) || break
		((i == 100)) && for pid in "${pids[@]}"; do
			kill -0 "$pid" 2>/dev/null && { log "pid $pid did not exit after SIGTERM; sending SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; }
		done
		sleep 0.1
	done
	((${#dirs[@]} == 0)) || rm -rf -- "${dirs[@]}"
}

cmd_down() {
	[[ $# -eq 0 ]] || die "down takes no arguments"
	[[ -d $DIR ]] || { log "nothing to do ($DIR does not exist)"; return 0; }
	lock_dir
	local list=$STARTED
	[[ -n $RUNFILE ]] && list=$RUNFILE
	if [[ ! -s $list ]]; then
		log "nothing was started by testenv.sh up ($list is empty or missing)"
	else
		local -a lines=() first=() rest=()
		local line name
		mapfile -t lines <"$list"
		# Sentinels first (so they do not start a failover while their Redis
		# goes away), then everything else at once.
		for line in "${lines[@]}"; do
			name=${line%%$'\t'*}
			[[ -n $name ]] || continue
			if [[ $name == sentinel-[0-9]* ]]; then first+=("$line"); else rest+=("$line"); fi
		done
		((${#first[@]} == 0)) || stop_wave "${first[@]}"
		((${#rest[@]} == 0)) || stop_wave "${rest[@]}"
		for line in "${lines[@]}"; do drop_entry "${line%%$'\t'*}" "$STARTED"; done
	fi
	[[ -z $RUNFILE ]] || rm -f "$RUNFILE"
	if [[ ! -s $STARTED ]]; then
		# nothing of ours is left running; the directory keeps only testenv.lock
		rm -f "$STARTED" "$ENVFILE" "$DIR/redis-cluster-create.log" "$DIR/mariadb.log"
	fi
}

status_line() { # status_line NAME ADDR CHECK-CMD...
	local name=$1 addr=$2 state=down who=-
	shift 2
	if "$@"; then
		state=up
		if owned "$name"; then who="started-by-us"; else who=reused; fi
	fi
	printf '%-22s %-5s %-14s %s\n' "$addr" "$state" "$who" "$name"
}

cmd_status() {
	[[ $# -eq 0 ]] || die "status takes no arguments"
	local p
	printf '%-22s %-5s %-14s %s\n' ADDRESS STATE OWNER NAME
	if user_set SHOP_TEST_MYSQL_DSN "$DEF_MYSQL_DSN"; then
		printf '%-22s %-5s %-14s %s\n' "(SHOP_TEST_MYSQL_DSN)" - user-provided mariadb
	else
		status_line mariadb "$H:3306" mysql_tcp_ok
	fi
	if user_set SHOP_TEST_REDIS_ADDR "$DEF_REDIS_ADDR"; then
		printf '%-22s %-5s %-14s %s\n' "$SHOP_TEST_REDIS_ADDR" - user-provided redis
	else
		status_line redis-6379 "$H:6379" redis_ok 6379
	fi
	for p in $(seq "$CLUSTER_PORT" $((CLUSTER_PORT + 5))); do
		status_line "redis-cluster-$p" "$H:$p" cluster_ok "$p"
	done
	for p in "$REDLOCK_PORT" $((REDLOCK_PORT + 1)) $((REDLOCK_PORT + 2)); do
		status_line "redlock-$p" "$H:$p" redis_ok "$p"
	done
	status_line "zookeeper-$ZK_PORT" "$H:$ZK_PORT" zk_ok "$ZK_PORT"
	status_line "etcd-$ETCD_PORT" "$H:$ETCD_PORT" etcd_ok "$ETCD_PORT"
	status_line "memcached-$MEMCACHED_PORT" "$H:$MEMCACHED_PORT" memcached_ok "$MEMCACHED_PORT"
	for p in "$ZKE_PORT" $((ZKE_PORT + 1)) $((ZKE_PORT + 2)); do
		status_line "zookeeper-ensemble-$p" "$H:$p" zk_serving "$p"
	done
	for p in "$ETCDC_PORT" $((ETCDC_PORT + 1)) $((ETCDC_PORT + 2)); do
		status_line "etcd-cluster-$p" "$H:$p" etcd_ok "$p"
	done
	status_line "nats-$NATS_PORT" "$H:$NATS_PORT" nats_ok "$NATS_PORT"
	for p in "$NATSC_PORT" $((NATSC_PORT + 1)) $((NATSC_PORT + 2)); do
		status_line "nats-cluster-$p" "$H:$p" nats_cluster_ok "$p"
	done
	for p in "$SENT_REDIS_PORT" $((SENT_REDIS_PORT + 1)); do
		status_line "sentinel-redis-$p" "$H:$p" redis_ok "$p"
	done
	for p in "$SENTINEL_PORT" $((SENTINEL_PORT + 1)) $((SENTINEL_PORT + 2)); do
		status_line "sentinel-$p" "$H:$p" redis_ok "$p"
	done
}

usage() {
	sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
	exit 2
}

main() {
	[[ $# -ge 1 ]] || usage
	local cmd=$1
	shift
	case $cmd in
	up) cmd_up "$@" ;;
	down) cmd_down "$@" ;;
	status) cmd_status "$@" ;;
	-h | --help | help) usage ;;
	*) usage ;;
	esac
}

main "$@"
