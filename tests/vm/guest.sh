#!/bin/sh
# The VM lab inside the guest: `guest.sh SHARE`, run by the image's roce-lab-boot.
# SHARE (the host's 9p share) holds bin/roce-agent, vm/ (these scripts), plan (the
# scenario names to run, one a line) and out/, where every scenario leaves its
# results in out/NAME/ and where `progress` tells the host what runs.
#
# The lab is the one of ../shared/TOOLCHAIN.md: rxe0 on veth0 (198.18.0.1), rxe1
# on veth1 (198.18.0.2), one veth pair, policy routing that sends the traffic
# between the two local addresses over the wire.
set -eu

SHARE=$1
OUT=$SHARE/out
AGENT=$SHARE/bin/roce-agent
API=127.0.0.1:9473
PIN_DIR=/sys/fs/bpf/roce
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

say() {
	echo "roce-lab: $*"
	echo "roce-lab: $*" >/dev/console 2>/dev/null || true
}

# A line for the host, which follows this file while the guest runs.
progress() {
	echo "$*" >>"$OUT/progress"
	say "$*"
}

uptime_s() { cut -d' ' -f1 /proc/uptime; }

# The GID index of DEV whose GID ends in ffff:TAIL (the IPv4-mapped address) and
# whose type is RoCE v2.
gid_index() {
	n=0
	while [ $n -lt 40 ]; do
		for f in /sys/class/infiniband/"$1"/ports/1/gids/*; do
			i=${f##*/}
			case $(cat "$f" 2>/dev/null) in
			*ffff:"$2")
				if [ "$(cat /sys/class/infiniband/"$1"/ports/1/gid_attrs/types/"$i" 2>/dev/null)" = "RoCE v2" ]; then
					echo "$i"
					return 0
				fi
				;;
			esac
		done
		n=$((n + 1))
		sleep 0.25
	done
	return 1
}

lab_setup() {
	modprobe rdma_rxe
	modprobe rdma_cm
	modprobe rdma_ucm
	modprobe sch_netem
	ip link add veth0 type veth peer name veth1
	for i in all default veth0 veth1; do
		sysctl -qw "net.ipv4.conf.$i.rp_filter=0" "net.ipv4.conf.$i.accept_local=1"
	done
	for i in veth0 veth1; do
		sysctl -qw "net.ipv6.conf.$i.disable_ipv6=1"
		# 3000 carries the RoCE path MTU 2048 (iboe_get_mtu): fewer frames under TCG
		# than 1500, and still native XDP (6.1's veth refuses it above about 3500).
		ip link set "$i" mtu 3000
	done
	ip addr add 198.18.0.1/32 dev veth0
	ip addr add 198.18.0.2/32 dev veth1
	ip link set veth0 up
	ip link set veth1 up
	ip rule add pref 1000 lookup local
	ip rule del pref 0
	ip rule add pref 50 iif veth0 lookup local
	ip rule add pref 51 iif veth1 lookup local
	ip rule add pref 100 to 198.18.0.2 lookup 100
	ip rule add pref 101 to 198.18.0.1 lookup 101
	ip route add 198.18.0.2 dev veth0 src 198.18.0.1 table 100
	ip route add 198.18.0.1 dev veth1 src 198.18.0.2 table 101
	ip neigh replace 198.18.0.2 lladdr "$(cat /sys/class/net/veth1/address)" dev veth0 nud permanent
	ip neigh replace 198.18.0.1 lladdr "$(cat /sys/class/net/veth0/address)" dev veth1 nud permanent
	rdma link add rxe0 type rxe netdev veth0
	rdma link add rxe1 type rxe netdev veth1
	G0=$(gid_index rxe0 c612:0001)
	G1=$(gid_index rxe1 c612:0002)
	# The rdma_cm default ToS (rping, ib_*_bw -R without -T): DSCP 26 + ECT(0).
	if [ -d /sys/kernel/config ] && ! mountpoint -q /sys/kernel/config; then
		mount -t configfs configfs /sys/kernel/config
	fi
	for d in rxe0 rxe1; do
		mkdir -p "/sys/kernel/config/rdma_cm/$d"
		echo 106 >"/sys/kernel/config/rdma_cm/$d/ports/1/default_roce_tos"
	done
	if ! mountpoint -q /sys/fs/bpf; then mount -t bpf bpf /sys/fs/bpf; fi
	say "lab up: rxe0 gid $G0, rxe1 gid $G1, kernel $(uname -r)"
}

# What a scenario starts in the background, killed after it whatever happened.
track() { echo "$1" >>"$D/.pids"; }

wait_for_text() { # TEXT FILE SECS
	n=0
	while ! grep -q "$1" "$2" 2>/dev/null; do
		n=$((n + 1))
		[ $n -lt $(($3 * 4)) ] || return 1
		sleep 0.25
	done
}

# tcpdump on each of IF..., RoCE only (UDP destination port 4791), headers only,
# into tmpfs (writing to the 9p share is slow enough under TCG that tcpdump falls
# behind its ring and loses the tail at SIGINT); moved into $D when stopped.
capture_start() {
	for i in "$@"; do
		tcpdump -Z root -i "$i" -w "/dev/shm/$i.pcap" -s 256 -B 16384 -n --immediate-mode 'udp dst port 4791' 2>"$D/tcpdump-$i.txt" &
		track $!
		echo "$i $!" >>"$D/.captures"
	done
	for i in "$@"; do wait_for_text "listening on" "$D/tcpdump-$i.txt" 30; done
}

capture_stop() {
	sleep 1
	while read -r _ p; do kill -INT "$p" 2>/dev/null || true; done <"$D/.captures"
	while read -r i p; do
		wait "$p" 2>/dev/null || true
		mv "/dev/shm/$i.pcap" "$D/$i.pcap"
	done <"$D/.captures"
	rm -f "$D/.captures"
}

# roce-agent run on both veths, its log in $D/LOG; waits for its API. The poll
# interval is 0.5 s (AGENT_INTERVAL overrides it).
agent_start() { # LOG ARGS...
	log=$1
	shift
	"$AGENT" run --iface veth0 --iface veth1 --listen "$API" --interval "${AGENT_INTERVAL:-0.5}" --mtu 3000 "$@" >"$D/$log" 2>&1 &
	AGENT_PID=$!
	track $AGENT_PID
	n=0
	until "$AGENT" flows --json --api "$API" >/dev/null 2>&1; do
		if ! kill -0 "$AGENT_PID" 2>/dev/null; then
			say "the agent exited at start:"
			tail -n 20 "$D/$log"
			return 1
		fi
		n=$((n + 1))
		[ $n -lt 240 ] || return 1
		sleep 0.5
	done
}

# The agent's flows (two intervals after the traffic) in $D/FILE, its metrics beside.
agent_flows() {
	sleep 1.5
	"$AGENT" flows --json --api "$API" >"$D/$1"
	curl -sS "http://$API/metrics" >"$D/${1%.json}.metrics" || true
}

agent_stop() {
	kill -TERM "$AGENT_PID" 2>/dev/null || true
	wait "$AGENT_PID" 2>/dev/null || true
}

rdma_stats() { rdma statistic show >"$D/rdma-$1.txt" 2>&1 || true; }

# Runs a server and its client (each a command line, split on spaces): the client
# is tried again while it cannot connect (the server not listening yet under TCG).
pair() { # NAME SERVER CLIENT
	# shellcheck disable=SC2086
	timeout 240 $2 >"$D/$1-server.txt" 2>&1 &
	sp=$!
	track $sp
	sleep 1
	n=0
	# shellcheck disable=SC2086
	until timeout 240 $3 >"$D/$1-client.txt" 2>&1; do
		n=$((n + 1))
		if [ $n -ge 10 ] || ! kill -0 $sp 2>/dev/null || ! grep -qi connect "$D/$1-client.txt"; then
			say "$1: the client failed:"
			tail -n 5 "$D/$1-client.txt"
			wait $sp || true
			return 1
		fi
		sleep 1
	done
	wait $sp
}

# The plain scenario: captures on both veths, the agent, one server/client run.
standard() { # NAME SERVER CLIENT [AGENT ARGS...]
	name=$1 server=$2 client=$3
	shift 3
	capture_start veth0 veth1
	agent_start agent.log --no-pin "$@"
	rdma_stats before
	pair "$name" "$server" "$client"
	rdma_stats after
	agent_flows flows.json
	agent_stop
	capture_stop
}

run_scenario() { # NAME
	D=$OUT/$1
	rm -rf "$D"
	mkdir -p "$D"
	start=$(uptime_s)
	progress "START $1"
	set +e
	(
		set -eu
		"sc_$1"
	) >"$D/scenario.log" 2>&1
	rc=$?
	set -e
	# Whatever the scenario left running.
	if [ -f "$D/.pids" ]; then
		while read -r p; do kill -KILL "$p" 2>/dev/null || true; done <"$D/.pids"
		rm -f "$D/.pids"
	fi
	tc qdisc del dev veth0 root 2>/dev/null || true
	tc qdisc del dev veth1 root 2>/dev/null || true
	echo "$rc" >"$D/rc"
	progress "END $1 $rc $(awk -v a="$start" -v b="$(uptime_s)" 'BEGIN { printf "%.1f", b - a }')"
}

. "$SHARE/vm/scenarios.sh"

: >"$OUT/progress"
progress "BOOTED $(uname -r) $(uptime_s)"
{
	uname -r
	"$AGENT" --version 2>&1 || true
	ib_write_bw --version 2>&1 | head -n 2 || true
	rdma -V 2>&1 || true
} >"$OUT/versions.txt"
# A failing step ends the script here (set -e): the host finds no LAB_UP and shows lab.log.
lab_setup >"$OUT/lab.log" 2>&1
progress "LAB_UP"
while read -r name; do
	[ -n "$name" ] || continue
	run_scenario "$name"
done <"$SHARE/plan"
progress "DONE"
