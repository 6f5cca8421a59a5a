#!/usr/bin/env bash
# Re-measure every CPU speed target of benchmarks/RESULTS.md (their history: the entry
# "CPU targets on a quiet machine" of benchmarks/history/2026-11.md) in one go:
#   1-4. W1 throughput (client updates/s, GFLOP/s, % of GEMM peak, ratio to the plain PyTorch
#        loop) of the CNN, LeNet-5, MLP and logistic regression at cohorts 10/100/1000, with
#        the plain loop, VmapEngine, AutoEngine, Flower's simulation engine, bf16 and
#        two-process rows;
#   5.   profiler traces of LeNet-5 (vmap, auto) in runs/bench_profile/;
#   6.   compile-cache reuse: a compiled round's compile time in a first and a second process
#        (python -m fedforge.bench.compile_cache);
#   7.   async engine cost per 1000 updates, FedAST against the sync round
#        (python -m fedforge.bench.async_cost, one JSON line, kept in the log);
#   8.   W3: wall time to 80 % test accuracy on FEMNIST.
# Each table's record goes to benchmarks/results/ and replaces the one it re-measures; the
# page benchmarks/RESULTS.md is regenerated from them (async_cost prints a JSON line only,
# kept in the log); the output is also logged to runs/cpu_targets/log.txt.
#
# Run it on a quiet machine with nothing else running: every number is a wall-clock time,
# and another process on the cores changes them (small models by far more than the load
# average suggests). It refuses to start when the 1-minute load average is above 1.5,
# unless --force is given.
#
# Estimated run time on a 2-core CPU with native bf16 (AVX-512-BF16 or AMX), from the rates
# measured there: about 2 hours with Flower installed (its rows at cohort 1000 take about an
# hour), about 1 hour without; bf16 rows on a CPU without native bf16 take far longer.
# --quick runs the same commands with the smallest settings (cohort 10, one repetition, a
# tiny compile, one async repetition, W3 on the synthetic quickstart config) in about
# 12 minutes, to check that the script and the environment work; its tables and log go to
# runs/cpu_targets_quick/.
#
# Flower's rows need Flower's simulation engine (pip install "fedforge[bench]"); without it
# they are skipped with a notice and everything else runs. W3 needs FEMNIST and the async
# cost needs MNIST under the data root ($FEDFORGE_DATA).
#
# Usage: bash benchmarks/cpu_targets.sh [--quick] [--force]
set -euo pipefail

usage() { sed -n 's/^# Usage: //p' "$0"; }

quick=0
force=0
for arg in "$@"; do
    case "$arg" in
        --quick) quick=1 ;;
        --force) force=1 ;;
        -h|--help) sed -n '2,/^set -euo/{s/^# \{0,1\}//p}' "$0"; exit 0 ;;
        *) echo "cpu_targets.sh: unknown argument '$arg'; usage: $(usage)" >&2; exit 2 ;;
    esac
done

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}

read -r load1 _ < /proc/loadavg
if [ "$force" -eq 0 ] && awk -v l="$load1" 'BEGIN { exit !(l > 1.5) }'; then
    echo "cpu_targets.sh: 1-minute load average is $load1 (> 1.5): the machine is not quiet;" \
         "stop other jobs or pass --force" >&2
    exit 1
fi

if [ "$quick" -eq 1 ]; then
    out=runs/cpu_targets_quick
    results=(--results "$out/results")
    cohorts=10 repeats=1 profile_cohort=10 reps=1
    compile_args=(--model logreg --cohort 2 "${results[@]}")
    w3_args=(--config examples/quickstart.toml --target 0.5 --out "$out/w3" "${results[@]}")
    profile_out=$out/profile
else
    out=runs/cpu_targets
    results=()
    cohorts=10,100,1000 repeats=2 profile_cohort=100 reps=3
    compile_args=()
    w3_args=()
    profile_out=runs/bench_profile
fi
mkdir -p "$out"
exec > >(tee -a "$out/log.txt") 2>&1

# without Flower's simulation engine the flower rows are dropped (one notice, not an error)
if reason=$("$PYTHON" -m fedforge.bench.flower_w1); then
    flower=1
else
    flower=0
    echo "notice: skipping the flower rows: $reason"
fi
# bf16 rows only where the CPU has bf16 units: emulated bf16 runs about 500x slower than
# fp32 and would take hours at cohort 1000 without telling anything new
if grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
    bf16=1
else
    bf16=0
    echo "notice: skipping the bf16 rows: this CPU has no native bf16 (avx512_bf16/amx_bf16)"
fi
engines() {  # the engine list, without the rows this machine cannot run
    local list
    list=$(echo "$1" | tr , '\n')
    [ "$flower" -eq 1 ] || list=$(echo "$list" | grep -vx flower)
    [ "$bf16" -eq 1 ] || list=$(echo "$list" | grep -v ':bf16')
    echo "$list" | paste -sd, -
}

start=$SECONDS
step() {  # print the command, run it, print its time
    echo "+ $*"
    local t0=$SECONDS
    "$@"
    echo "  ($((SECONDS - t0)) s)"
}

step fedforge bench w1 --model cnn --cohorts "$cohorts" --engines \
    "$(engines plain,vmap,auto,flower,vmap:bf16,plain:bf16)" --repeats "$repeats" "${results[@]}"
step fedforge bench w1 --model lenet5 --cohorts "$cohorts" --engines \
    "$(engines plain,vmap,auto,flower,plain:procs2,auto:procs2)" --repeats "$repeats" \
    "${results[@]}"
step fedforge bench w1 --model mlp --cohorts "$cohorts" --engines \
    "$(engines plain,vmap,auto,flower)" --repeats "$repeats" "${results[@]}"
step fedforge bench w1 --model logreg --cohorts "$cohorts" --engines \
    "$(engines plain,vmap,auto,flower)" --repeats "$repeats" "${results[@]}"
step fedforge bench w1 --model lenet5 --cohorts "$profile_cohort" --engines vmap,auto \
    --profile --out "$profile_out" "${results[@]}"
step "$PYTHON" -m fedforge.bench.compile_cache "${compile_args[@]}"
step "$PYTHON" -m fedforge.bench.async_cost --reps "$reps"
step fedforge bench w3 --engines "$(engines fedforge,plain,flower)" "${w3_args[@]}"

total=$((SECONDS - start))
echo "total elapsed: $((total / 60)) min $((total % 60)) s" \
     "(tables: ${results[1]:-benchmarks/results}; log: $out/log.txt)"
