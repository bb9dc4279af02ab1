#!/usr/bin/env bash
# Two "nodes" on this one machine: a genuine multi-node DDP launch, rendezvous on 127.0.0.1.
#
#   bash scripts/two_nodes_localhost.sh [OUT] [-- options of python -m dpkit.ddp.train]
#   bash scripts/two_nodes_localhost.sh runs/two_nodes -- --model cnn --epochs 2
#
# It runs the same two commands one would type on two machines, each a torchrun with
# --nnodes=2 --nproc_per_node=2 and its own --node_rank, both pointing at node 0's address
# (here 127.0.0.1) and a free port. torchrun on node 0 hosts the rendezvous; the four ranks
# (RANK 0-3; LOCAL_RANK 0-1 on each node) then train dpkit.ddp.train over gloo. On two real
# machines: run each line on its machine, with --master_addr set to node 0's address.
# torchrun is started through python -m dpkit.ddp.nodes, torchrun itself but for two things
# with a loopback --master_addr: node 0's store listens on 127.0.0.1 alone (plain torchrun's
# listens on every interface of the machine, unauthenticated; docs/ddp_clusters.md), and
# each node gets GPUs of its own (0,1 and 2,3 where there are four; none, and so the CPU and
# gloo, where there are fewer: by LOCAL_RANK both nodes would take GPU 0).
#
# Writes OUT/node0.log, OUT/node1.log, and rank 0's model.pt, trace.json and ranks.json.
# Environment: PYTHON (default .venv/bin/python, else python3), PORT (default: a free one),
# LIMIT_S (default 180: each launch is stopped after this long; nothing is left running).
set -euo pipefail
cd "$(dirname "$0")/.."

out="${1:-runs/two_nodes}"
shift || true
[ "${1:-}" = "--" ] && shift
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
# torchrun is `python -m torch.distributed.run`: the module form needs no PATH entry.
torchrun=("$PYTHON" -m dpkit.ddp.nodes)  # torchrun, its store on 127.0.0.1 (see above)
# A free port, as dpkit.ddp.free_port picks it (the kernel's pick for port 0), without
# importing torch for it (2 s before either node starts).
free_port='import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
port="${PORT:-$("$PYTHON" -c "$free_port")}"
limit="${LIMIT_S:-180}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # dpkit from this checkout
# The ranks' own gloo connections on the loopback interface only (torchrun's rendezvous
# store, torch's TCPStore, listens on every interface: torch has no bind address for it).
if [ -z "${GLOO_SOCKET_IFNAME:-}" ]; then
  if [ -d /sys/class/net/lo ]; then export GLOO_SOCKET_IFNAME=lo; fi
fi

launch() {  # launch NODE_RANK: one node's torchrun, its output in OUT/nodeNODE_RANK.log
  timeout --kill-after=10 "$limit" "${torchrun[@]}" \
    --nnodes=2 --nproc_per_node=2 --node_rank="$1" \
    --master_addr=127.0.0.1 --master_port="$port" \
    -m dpkit.ddp.train --out "$out" "${@:2}" >"$out/node$1.log" 2>&1
}

launch 0 "$@" &
node0=$!
launch 1 "$@" &
node1=$!
# If this script is stopped, its launches stop too (torchrun stops its ranks on SIGTERM).
trap 'kill "$node0" "$node1" 2>/dev/null || true' EXIT INT TERM

status0=0 status1=0
wait "$node0" || status0=$?
wait "$node1" || status1=$?
trap - EXIT INT TERM
echo "node 0 (torchrun --node_rank=0): exit status $status0; log $out/node0.log"
echo "node 1 (torchrun --node_rank=1): exit status $status1; log $out/node1.log"
if [ "$status0" -ne 0 ] || [ "$status1" -ne 0 ]; then
  tail -n 30 "$out/node0.log" "$out/node1.log" >&2
  exit 1
fi
cat "$out/node0.log"
