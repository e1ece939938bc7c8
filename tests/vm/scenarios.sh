# The VM lab's scenarios, sourced by guest.sh: one function sc_NAME per line of
# scenarios.list. Each runs with D (its output directory), G0 and G1 (the RoCE v2
# GID indexes of rxe0 and rxe1) set, and set -eu. Servers run on rxe0
# (198.18.0.1), clients on rxe1 unless a scenario says otherwise.
# Message counts stay small: soft-RoCE under TCG moves 10-30k frames/s.
# shellcheck shell=sh disable=SC2154

# --tclass=106: DSCP 26 (the lossless class) + ECT(0), what a deployment sends.
TCLASS=106

perf() { # TOOL ARGS: the server and client command lines of a perftest run
	PERF_SERVER="$1 -d rxe0 -x $G0 -F --tclass=$TCLASS $2"
	PERF_CLIENT="$1 -d rxe1 -x $G1 -F --tclass=$TCLASS $2 198.18.0.1"
}

sc_write_bw() {
	perf ib_write_bw "-n 200 -s 65536"
	standard ib_write_bw "$PERF_SERVER" "$PERF_CLIENT"
}

sc_send_bw() {
	perf ib_send_bw "-n 200 -s 16384"
	standard ib_send_bw "$PERF_SERVER" "$PERF_CLIENT"
}

sc_read_bw() {
	perf ib_read_bw "-n 100 -s 65536"
	standard ib_read_bw "$PERF_SERVER" "$PERF_CLIENT"
}

sc_atomic_bw() {
	perf ib_atomic_bw "-n 500"
	standard ib_atomic_bw "$PERF_SERVER" "$PERF_CLIENT"
}

sc_write_bw_cm() {
	standard ib_write_bw \
		"ib_write_bw -R -d rxe0 -F -T $TCLASS -n 200 -s 65536" \
		"ib_write_bw -R -d rxe1 -F -T $TCLASS -n 200 -s 65536 198.18.0.1"
}

sc_send_lat() {
	perf ib_send_lat "-n 500 -s 64"
	standard ib_send_lat "$PERF_SERVER" "$PERF_CLIENT"
}

# rping takes its ToS from the rdma_cm default (default_roce_tos, set by lab_setup).
sc_rping() {
	standard rping "rping -s -a 198.18.0.1 -C 50 -S 1024" "rping -c -a 198.18.0.1 -C 50 -S 1024"
}

# The libibverbs pingpongs set no traffic class (no flag for it): DSCP 0, Not-ECT.
sc_ud_pingpong() {
	standard ibv_ud_pingpong "ibv_ud_pingpong -d rxe0 -g $G0 -n 200 -s 1024" \
		"ibv_ud_pingpong -d rxe1 -g $G1 -n 200 -s 1024 198.18.0.1"
}

sc_uc_pingpong() {
	standard ibv_uc_pingpong "ibv_uc_pingpong -d rxe0 -g $G0 -n 200 -s 4096" \
		"ibv_uc_pingpong -d rxe1 -g $G1 -n 200 -s 4096 198.18.0.1"
}

# The default policy in enforce mode: RoCE sent with DSCP 0 leaves with DSCP 26.
# The tc egress programs rewrite on veth0 and veth1; both captures (taken after
# tc egress) and the peer's XDP see the rewritten header.
sc_qos_enforce() {
	standard ib_write_bw \
		"ib_write_bw -d rxe0 -x $G0 -F --tclass=0 -n 200 -s 65536" \
		"ib_write_bw -d rxe1 -x $G1 -F --tclass=0 -n 200 -s 65536 198.18.0.1" \
		--mode enforce
}

# 1 % loss on veth0's root qdisc, the client (requester) on rxe0: requests are lost
# after tc egress (the agent's veth0 egress counts them, the captures do not),
# rxe1 sees PSN gaps and answers with NAKs (sequence error), rxe0 resends.
sc_netem_loss() {
	tc qdisc add dev veth0 root netem loss 1%
	standard ib_write_bw \
		"ib_write_bw -d rxe1 -x $G1 -F --tclass=$TCLASS -n 200 -s 65536" \
		"ib_write_bw -d rxe0 -x $G0 -F --tclass=$TCLASS -n 200 -s 65536 198.18.0.2"
	tc -s qdisc show dev veth0 >"$D/netem.txt"
}

check() { # NAME CONDITION-COMMAND...: a line of $D/checks
	name=$1
	shift
	if "$@" >/dev/null 2>&1; then echo "$name PASS" >>"$D/checks"; else echo "$name FAIL" >>"$D/checks"; fi
}

no_match() { # PATTERN FILE: true when FILE has no line matching PATTERN
	! grep -q "$1" "$2"
}

datapath_state() { # SUFFIX: what the kernel holds for the agent, in files
	ip -d link show veth0 >"$D/link-$1.txt" 2>&1 || true
	ip -d link show veth1 >>"$D/link-$1.txt" 2>&1 || true
	{
		tc qdisc show dev veth0
		tc qdisc show dev veth1
		tc filter show dev veth0 egress
		tc filter show dev veth1 egress
	} >"$D/tc-$1.txt" 2>&1 || true
	ls -R "$PIN_DIR" >"$D/pins-$1.txt" 2>&1 || true
	# Type and name of each program, type of each link (ids change, names stay).
	bpftool prog show 2>&1 | awk '/^[0-9]+:/ { print $2, $4 }' | sort >"$D/progs-$1.txt" || true
	bpftool link show 2>&1 | awk '/^[0-9]+:/ { print $2 }' | sort >"$D/links-$1.txt" || true
}

# Pinned agent: attach, traffic, kill -9, traffic while no agent runs, restart,
# traffic again (counts continue: the flows at the end equal the capture of the
# three runs), then stop and `roce-agent detach`, which must leave nothing behind.
sc_lifecycle() {
	perf ib_write_bw "-n 100 -s 65536"
	datapath_state before
	capture_start veth0 veth1
	agent_start agent.log --pin-dir "$PIN_DIR"
	datapath_state attached
	check xdp_attached grep -q xdp "$D/link-attached.txt"
	check pins_made test -n "$(ls -A "$PIN_DIR" 2>/dev/null)"
	pair run1 "$PERF_SERVER" "$PERF_CLIENT"
	agent_flows flows-run1.json
	kill -KILL "$AGENT_PID"
	wait "$AGENT_PID" 2>/dev/null || true
	datapath_state killed
	check xdp_survives_kill grep -q xdp "$D/link-killed.txt"
	check pins_survive_kill test -n "$(ls -A "$PIN_DIR" 2>/dev/null)"
	pair run2 "$PERF_SERVER" "$PERF_CLIENT"
	agent_start agent-restarted.log --pin-dir "$PIN_DIR"
	datapath_state restarted
	pair run3 "$PERF_SERVER" "$PERF_CLIENT"
	rdma_stats after
	agent_flows flows.json
	agent_stop
	datapath_state stopped
	"$AGENT" detach --pin-dir "$PIN_DIR" --json >"$D/detach.json" 2>"$D/detach.log"
	datapath_state detached
	capture_stop
	check detach_no_xdp no_match xdp "$D/link-detached.txt"
	check detach_no_clsact no_match clsact "$D/tc-detached.txt"
	check detach_no_tc_filter no_match bpf "$D/tc-detached.txt"
	check detach_no_pins test -z "$(ls -A "$PIN_DIR" 2>/dev/null)"
	check detach_programs_as_before cmp "$D/progs-before.txt" "$D/progs-detached.txt"
	check detach_links_as_before cmp "$D/links-before.txt" "$D/links-detached.txt"
}
