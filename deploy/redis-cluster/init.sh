#!/bin/sh
# Joins the redis-cluster-N services into one 3-master cluster, once.
#
# CLUSTER MEET takes only IP addresses (redis/redis#11148), so the names
# compose gives the nodes are resolved here first. Clients still see host
# names: each node announces its service name
# (cluster-preferred-endpoint-type hostname), which survives a container
# getting a new IP address.
#
# Idempotent: a second `make up` finds the cluster formed and exits 0, so
# the shop services that wait for this job still start.
set -eu

nodes="${CLUSTER_NODES:-redis-cluster-1:6379 redis-cluster-2:6379 redis-cluster-3:6379}"

addrs=""
for node in $nodes; do
	host="${node%:*}"
	port="${node##*:}"
	tries=0
	until redis-cli -h "$host" -p "$port" ping 2>/dev/null | grep -q PONG; do
		tries=$((tries + 1))
		if [ "$tries" -ge 60 ]; then
			echo "redis-cluster-init: $node does not answer PING" >&2
			exit 1
		fi
		sleep 1
	done
	ip="$(getent hosts "$host" | awk '{print $1; exit}')"
	if [ -z "$ip" ]; then
		echo "redis-cluster-init: cannot resolve $host" >&2
		exit 1
	fi
	addrs="$addrs $ip:$port"
done

first="${nodes%% *}"
if redis-cli -h "${first%:*}" -p "${first##*:}" cluster info | grep -q '^cluster_state:ok'; then
	echo "redis-cluster-init: cluster already formed"
	exit 0
fi

# shellcheck disable=SC2086 # one argument per node on purpose
redis-cli --cluster create $addrs --cluster-replicas 0 --cluster-yes

# create returns once the slots are assigned; wait until every node agrees,
# or the first shop request could meet CLUSTERDOWN.
for node in $nodes; do
	tries=0
	until redis-cli -h "${node%:*}" -p "${node##*:}" cluster info | grep -q '^cluster_state:ok'; do
		tries=$((tries + 1))
		if [ "$tries" -ge 60 ]; then
			echo "redis-cluster-init: $node never reached cluster_state:ok" >&2
			exit 1
		fi
		sleep 1
	done
done
echo "redis-cluster-init: cluster formed:$addrs"
