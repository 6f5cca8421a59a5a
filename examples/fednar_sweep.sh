#!/bin/bash
# FedNAR CPU-scale reproduction, reduced plan (see docs/reproductions.md#fednar).
set -u
while kill -0 ${WAIT_PID:-0} 2>/dev/null; do sleep 5; done
R=10
BASE="examples/fednar_cifar10.toml rounds=$R eval.every=$R engine.name=loop checkpoint.every=$R server.clients_per_round=10"
declare -A EXTRA=(
  [fedavg]="client.weight_decay=0.05"
  [fedprox]="client.weight_decay=0.05 algorithm.mu=0.001"
  [scaffold]="client.weight_decay=0.05"
  [fedexp]="client.weight_decay=0.01 algorithm.eps=0"
  [fedadam]='client.weight_decay=0.01 algorithm.server_lr=0.1 algorithm.adam_rule=fednar_code algorithm.tau={"schedule":"exponential","init":0.01,"gamma":0.996004}'
  [fedavgm]="client.weight_decay=0.01"
)
run() {  # name, config, rounds, overrides...
  local name=$1 cfg=$2 r=$3; shift 3
  [ -f runs/fednar/$name/metrics.jsonl ] && grep -q "\"round\": $r" runs/fednar/$name/metrics.jsonl && return
  echo "== $name $(date +%T)"
  OMP_NUM_THREADS=1 nice -n 5 fedforge run $cfg "$@" --out runs/fednar/$name -q 2>&1 | tail -1
}
for alg in fedavg fedprox scaffold fedexp fedadam fedavgm; do for nar in true false; do
  run ${alg}_a0.3_nar$nar "$BASE" $R algorithm.name=$alg client.nar=$nar ${EXTRA[$alg]}
done; done
SR=5
SBASE="examples/fednar_shakespeare.toml rounds=$SR eval.every=$SR checkpoint.every=$SR"
for nar in true false; do
  run shk_fedavg_nar$nar "$SBASE" $SR client.nar=$nar
done
for wd in 0.001 1.0; do for nar in true false; do
  run fedavg_a0.3_wd${wd}_nar$nar "$BASE" $R algorithm.name=fedavg client.nar=$nar client.weight_decay=$wd
done; done
for nar in true false; do
  run fedavg_a10_nar$nar "$BASE" $R algorithm.name=fedavg client.nar=$nar client.weight_decay=0.05 data.partition_options.alpha=10
done
for nar in true false; do
  run shk_fedadam_nar$nar "$SBASE" $SR algorithm.name=fedadam client.nar=$nar client.lr.init=0.01 algorithm.server_lr=0.1 algorithm.adam_rule=fednar_code
done
echo "== done $(date +%T)"
