#!/usr/bin/env bash
# Mutation testing with mutmut (pip install -e ".[mutation]"), one module at a time.
#
#   scripts/mutation.sh src/fedforge/client/nar.py [more modules...]   # given modules
#   scripts/mutation.sh --since <git-rev>        # configured modules changed since <git-rev>
#   scripts/mutation.sh --all                    # every configured module
#   scripts/mutation.sh --list                   # show the modules and their test selections
#   scripts/mutation.sh --recheck <module>...    # a finished run's survivors against the
#                                                # current tests (one pytest per survivor)
#
# Each module runs in its own scratch copy of src/, tests/, pyproject.toml (so the working
# tree is never touched and mutmut's mutants/ folder stays out of it), under `nice`, with
# MUTATION_JOBS (default 2) workers and at most MUTATION_BUDGET seconds (default 1200) per
# module (MUTATION_TIMEOUT_MULTIPLIER, default 5, bounds a single mutant); a module cut short
# reports its unchecked mutants. Results go to MUTATION_OUT
# (default .mutation/): scores.tsv (module, killed, total, percent) and <module>.survivors.txt
# (the diff of every surviving mutant). Which tests run for a module is `tests_for` below:
# fast, targeted files, so a module finishes in minutes. MUTATION_REV=<git-rev> copies the
# files from that commit instead of the working tree (a run unaffected by uncommitted edits).
# Bash reads a script while it runs: for long runs, run a copy with MUTATION_ROOT=<repo>.
# MUTATION_DESELECT="<node id> ..." leaves out tests that fail on the copied commit.
set -euo pipefail

ROOT="${MUTATION_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}"  # the repository
JOBS="${MUTATION_JOBS:-2}"
BUDGET="${MUTATION_BUDGET:-1200}"
OUT="${MUTATION_OUT:-$ROOT/.mutation}"
WORK="${MUTATION_WORK:-${TMPDIR:-/tmp}/fedforge-mutation}"
REV="${MUTATION_REV:-}"  # empty: the working tree
# a mutant running longer than this many times its tests' clean duration counts as killed
# (an endless loop); mutmut's own default of 15 lets one such mutant eat the whole budget
TIMEOUT_X="${MUTATION_TIMEOUT_MULTIPLIER:-5}"
# modules mutation testing is configured for (globs relative to the repository root)
CONFIGURED=(src/fedforge/algorithms/*.py src/fedforge/client/*.py src/fedforge/server/*.py
            src/fedforge/comm/*.py src/fedforge/sim/*.py src/fedforge/core/moments.py
            src/fedforge/protocol/{algorithm,step_batch}.py
            src/fedforge/schedulers/{fedast,multitask_sync,buffered,scheduler,serves}.py
            src/fedforge/schedulers/{allocation,allocation_code,task,client_selection}.py
            src/fedforge/engine/round.py src/fedforge/algorithms/personal/*.py
            src/fedforge/experiment/personal_eval.py src/fedforge/privacy/ledger.py
            src/fedforge/robust/aggregators.py)

# The pytest arguments (test files, -k filters) that exercise one module. Slow Monte Carlo
# and end-to-end tests are left out; the *_exact.py and *_factories.py files hold the fast exact
# checks.
tests_for() {
  case "$1" in
    src/fedforge/client/nar.py)
      echo "tests/client/test_nar.py tests/client/test_nar_exact.py" \
           "tests/algorithms/test_fednar_backbones.py" ;;
    src/fedforge/client/control_variates.py)
      echo "tests/algorithms/test_multiround_sgd.py tests/algorithms/test_multiround_adam.py" \
           "tests/algorithms/test_fedavg_family.py" ;;
    src/fedforge/client/optimizers.py)
      echo "tests/client/test_optimizers_exact.py" ;;
    src/fedforge/client/*)
      echo "tests/client tests/algorithms/test_fedavg_family.py" ;;
    src/fedforge/core/moments.py)
      echo "tests/client tests/server tests/algorithms/test_fedopt.py" ;;
    src/fedforge/comm/sketch.py)
      echo "tests/comm/test_sketch.py tests/comm/test_sketch_exact.py" \
           "tests/algorithms/test_safl.py -k 'not unbiased_mean_of_RtR'" ;;
    src/fedforge/comm/rng.py)
      echo "tests/comm/test_rng_reference.py" ;;
    src/fedforge/comm/compress.py)
      echo "tests/comm/test_compress.py tests/comm/test_compress_exact.py" ;;
    src/fedforge/comm/codec.py)
      echo "tests/comm/test_compress.py tests/comm/test_codec_exact.py" \
           "tests/algorithms/test_multiround_compressed.py" \
           "tests/algorithms/test_safl.py -k 'not baselines_run'" ;;
    src/fedforge/comm/*)
      echo "tests/comm tests/algorithms/test_safl.py" \
           "tests/algorithms/test_multiround_compressed.py -k 'not unbiased_mean_of_RtR'" ;;
    src/fedforge/server/chain.py)
      echo "tests/server/test_chain_exact.py tests/algorithms/test_fedexp.py" \
           "tests/algorithms/test_multiround_sgd.py::test_fedavgm_server_momentum" \
           "tests/algorithms/test_multiround_sgd.py::test_feddyn_four_rounds" ;;
    src/fedforge/server/buffered.py)
      echo "tests/server/test_buffered.py tests/server/test_buffered_exact.py" ;;
    src/fedforge/server/*)
      echo "tests/algorithms/test_fedopt.py tests/server" \
           "tests/algorithms/test_multiround_sgd.py" ;;
    src/fedforge/algorithms/scaffold.py)
      echo "tests/algorithms/test_fedavg_family.py tests/algorithms/test_multiround_sgd.py" \
           "tests/algorithms/test_defaults.py" ;;
    src/fedforge/algorithms/momentum.py)
      echo "tests/algorithms/test_multiround_adam.py::test_fedavg_m_four_rounds" \
           "tests/algorithms/test_multiround_adam.py::test_scaffold_m_four_rounds" \
           "tests/algorithms/test_momentum_exact.py tests/algorithms/test_defaults.py" ;;
    src/fedforge/algorithms/fadamgc.py)
      echo "tests/algorithms/test_fadamgc.py tests/algorithms/test_multiround_adam.py" \
           "tests/algorithms/test_fadamgc_exact.py tests/algorithms/test_defaults.py" ;;
    src/fedforge/algorithms/fedavg.py | src/fedforge/algorithms/fedopt.py)
      echo "tests/algorithms/test_fedopt.py tests/algorithms/test_fedavg_factories.py" \
           "tests/algorithms/test_defaults.py" ;;
    src/fedforge/algorithms/fedexp.py)
      echo "tests/algorithms/test_fedexp.py tests/algorithms/test_fedavg_factories.py" \
           "tests/algorithms/test_multiround_sgd.py::test_fedexp_step_size_and_eval_point" \
           "tests/algorithms/test_defaults.py" ;;
    src/fedforge/algorithms/feddyn.py | src/fedforge/algorithms/feddc.py)
      echo "tests/algorithms/test_feddyn_feddc.py tests/algorithms/test_fedavg_factories.py" \
           "tests/algorithms/test_multiround_sgd.py::test_feddyn_four_rounds" \
           "tests/algorithms/test_multiround_sgd.py::test_feddc_four_rounds" \
           "tests/algorithms/test_defaults.py" ;;
    src/fedforge/algorithms/compressed.py)
      echo "tests/algorithms/test_safl.py tests/algorithms/test_multiround_compressed.py" \
           "tests/algorithms/test_compressed_factories.py tests/algorithms/test_defaults.py" \
           "-k 'not baselines_run'" ;;
    src/fedforge/protocol/algorithm.py)
      echo "tests/algorithms/test_base_exact.py tests/algorithms/test_multiround_compressed.py" \
           "tests/algorithms/test_fadamgc.py::test_full_gradient_init_by_hand" \
           "tests/algorithms/test_multiround_sgd.py::test_feddyn_four_rounds" ;;
    src/fedforge/algorithms/fedptr.py)  # test_fedptr.py's end-to-end runs take minutes
      echo "tests/algorithms/test_fedptr_exact.py tests/algorithms/test_fedptr_diagnostics.py" \
           "tests/algorithms/test_fedptr.py::test_layer_adaptive_prox_gradient_has_norm_lambda_per_layer" \
           "tests/algorithms/test_fedptr.py::test_hparam_errors_name_the_field" \
           "tests/algorithms/test_defaults.py -k 'not a_run_logs_the_diagnostics'" ;;
    src/fedforge/algorithms/uplink_diagnostics.py)
      echo "tests/comm/test_sketch_diagnostics.py tests/algorithms/test_uplink_diagnostics_exact.py" \
           "-k 'not in_a_run'" ;;
    src/fedforge/algorithms/personal/apfl.py | src/fedforge/algorithms/personal/pfedme.py \
    | src/fedforge/algorithms/personal/fedrod.py | src/fedforge/algorithms/personal/fedala.py \
    | src/fedforge/algorithms/personal/fedbn.py | src/fedforge/algorithms/personal/perfedavg.py)
      local stem="${1##*/}"  # a method: its own file, the shared rules and the factories
      stem="${stem%.py}"
      [[ "$stem" == perfedavg ]] && stem=per_fedavg
      echo "tests/algorithms/test_personal_${stem}.py tests/algorithms/test_personal_exact.py" \
           "tests/privacy/test_personal_privacy.py" \
           "tests/algorithms/test_defaults.py" \
           "-k 'not extending_snippet and not fedbn_config and not quickstart'" ;;
    src/fedforge/protocol/step_batch.py | src/fedforge/algorithms/personal/*)  # the shared pieces: every method's exact tests
      # (the docs/extending.md snippet is not in the scratch copy; the example configs run slowly)
      echo "tests/algorithms/test_personal_*.py tests/algorithms/test_defaults.py" \
           "tests/privacy/test_personal_privacy.py" \
           "-k 'not extending_snippet and not fedbn_config and not quickstart'" ;;
    src/fedforge/algorithms/moon.py)  # MOON's three-round reference and its refusals
      echo "tests/algorithms/test_moon.py" ;;
    src/fedforge/algorithms/fedgen.py | src/fedforge/algorithms/generator.py)
      # the three-round reference with its wrong variants, and the pieces by hand
      echo "tests/algorithms/test_fedgen.py tests/algorithms/test_fedgen_exact.py" ;;
    src/fedforge/algorithms/fednova.py | src/fedforge/algorithms/fairness.py)  # four-round references
      echo "tests/algorithms/test_multiround_baselines.py tests/robust/test_upload_steps.py" \
           "tests/algorithms/test_fednova_exact.py tests/algorithms/test_fairness_exact.py" \
           "tests/algorithms/test_defaults.py" ;;
    src/fedforge/algorithms/flora.py)  # the stacking by hand, over a tiny BERT
      echo "tests/algorithms/test_flora.py tests/models/test_flora_lora.py" \
           "tests/algorithms/test_flora_exact.py" ;;
    src/fedforge/algorithms/clustered.py | src/fedforge/algorithms/clustered_spec.py)
      echo "tests/algorithms/test_clustered.py tests/algorithms/test_clustered_exact.py" ;;
    src/fedforge/algorithms/*)
      echo "tests/algorithms -k 'not fedptr and not backbone'" ;;
    src/fedforge/experiment/personal_eval.py)  # the pFL evaluation (held-out data per client)
      echo "tests/experiment/test_personal_eval.py tests/experiment/test_personal_eval_rules.py" ;;
    src/fedforge/privacy/ledger.py)  # the ledger's own checks (the runs that use it are slow)
      echo "tests/privacy/test_ledger.py" ;;
    src/fedforge/schedulers/allocation.py)  # the dynamic-allocation run takes a minute
      echo "tests/schedulers/test_allocation.py tests/schedulers/test_allocation_exact.py" \
           "-k 'not dynamic_allocation'" ;;
    src/fedforge/sim/delays.py | src/fedforge/sim/clock.py)
      local stem="${1##*/}"
      echo "tests/sim/test_${stem%.py}.py tests/sim/test_${stem%.py}_exact.py" ;;
    src/fedforge/schedulers/multitask_sync.py)
      echo "tests/schedulers/test_multitask_sync.py" ;;
    src/fedforge/schedulers/fedast.py)
      echo "tests/schedulers/test_allocation.py tests/schedulers/test_allocation_code.py" \
           "tests/sim/test_population.py" ;;
    src/fedforge/sim/selection.py | src/fedforge/sim/oort.py | src/fedforge/sim/samplers.py)
      echo "tests/sim/test_selection.py" ;;  # the samplers by hand (their runs: below)
    src/fedforge/sim/*)
      echo "tests/sim" ;;
    src/fedforge/schedulers/client_selection.py)  # a sampler fed from the round driver
      echo "tests/experiment/test_selection_run.py tests/experiment/test_client_selection_exact.py" ;;
    src/fedforge/schedulers/*)
      echo "tests/sim tests/schedulers --ignore=tests/schedulers/test_jobs.py" ;;
    src/fedforge/engine/round.py)
      echo "tests/algorithms tests/engine/test_parity.py -k 'not fedptr'" ;;
    src/fedforge/robust/aggregators.py)  # hand numbers, NumPy references, Flower's Bulyan
      echo "tests/robust/test_aggregators.py tests/robust/test_bulyan_meamed.py" \
           "tests/robust/test_aggregators_exact.py" ;;
    *)
      echo "" ;;
  esac
}

configured() {  # is $1 one of the configured modules?
  local m
  for m in "${CONFIGURED[@]}"; do [[ "$m" == "$1" ]] && return 0; done
  return 1
}

run_module() {
  local module="$1" slug dir selection
  slug="$(echo "${module#src/fedforge/}" | tr '/' '.')"
  slug="${slug%.py}"
  selection="$(tests_for "$module")"
  if [[ -z "$selection" ]]; then
    echo "mutation: $module is not configured (see tests_for in $0)" >&2
    return 1
  fi
  dir="$WORK/$slug"
  rm -rf "$dir"
  mkdir -p "$dir" "$OUT"
  if [[ -n "$REV" ]]; then
    (cd "$ROOT" && git archive "$REV" src tests pyproject.toml docs/algorithms.md README.md examples) \
      | tar -xf - -C "$dir"
  else
    (cd "$ROOT" && tar --exclude=__pycache__ -cf - src tests pyproject.toml docs/algorithms.md README.md examples) \
      | tar -xf - -C "$dir"
  fi
  case "$module" in  # their rules live in factories under @defaults_from, a decorator
    src/fedforge/algorithms/personal/*)  # mutmut never mutates through: unwrap them
      (cd "$dir" && unwrap_factories "$module") ;;
  esac
  # this module only, with its own test selection (globs expanded inside the copy)
  (cd "$dir" && MODULE="$module" SELECTION="$selection" TIMEOUT_MULTIPLIER="$TIMEOUT_X" \
     DESELECT="${MUTATION_DESELECT:-}" \
     python3 - <<'EOF'
import glob, os, shlex, tomllib, tomli_w
with open("pyproject.toml", "rb") as f:
    data = tomllib.load(f)
cfg = data.setdefault("tool", {}).setdefault("mutmut", {})
cfg["only_mutate"] = [os.environ["MODULE"]]
# docs/algorithms.md and README.md: test_defaults compares the one and counts methods in the
# other; examples/: the configs some tests start from
cfg["also_copy"] = ["docs", "README.md", "examples"]
cfg["timeout_multiplier"] = float(os.environ["TIMEOUT_MULTIPLIER"])  # a hung mutant is killed
args = []
for word in shlex.split(os.environ["SELECTION"]):
    if "*" in word:
        args.extend(sorted(glob.glob(word)))
    elif not word.startswith("tests/") or os.path.exists(word.split("::")[0]):  # skip absent
        args.append(word)
for node in shlex.split(os.environ.get("DESELECT", "")):  # tests known to fail for now
    args += ["--deselect", node]
cfg["pytest_add_cli_args_test_selection"] = args
with open("pyproject.toml", "wb") as f:
    tomli_w.dump(data, f)
EOF
  )
  echo "== $module${REV:+ at $REV}: pytest ${selection}"
  local start=$SECONDS status=0
  (cd "$dir" && OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 timeout --signal=INT "$BUDGET" \
     nice -n 10 mutmut run --max-children "$JOBS" >"$dir/run.log" 2>&1) || status=$?
  (cd "$dir" && mutmut results --all true 2>/dev/null) >"$dir/results.txt" || true
  report "$module" "$dir" "$dir/results.txt" "$start" "$status"
}

unwrap_factories() {  # in the scratch copy: f's body moves to an undecorated f__rule
  # (mutated), f keeps its decorator, signature and docstring and calls f__rule
  python3 - "$1" <<'EOF'
import ast, sys
path = sys.argv[1]
src = open(path).read()
lines = src.splitlines(keepends=True)
nodes = [n for n in ast.parse(src).body
         if isinstance(n, ast.FunctionDef) and len(n.decorator_list) == 1
         and isinstance(n.decorator_list[0], ast.Call)
         and getattr(n.decorator_list[0].func, "id", "") == "defaults_from"]
for n in reversed(nodes):
    first = n.body[0]
    doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    start, body = n.lineno - 1, first.lineno - 1
    sig = "".join(lines[start:body])
    docstring = "".join(lines[body:first.end_lineno]) if doc else ""
    a = n.args
    call = ", ".join(f"{x.arg}={x.arg}" for x in a.posonlyargs + a.args + a.kwonlyargs)
    wrapper = sig + docstring + f"    return {n.name}__rule({call})\n\n\n"
    lines[start:body] = [wrapper + sig.replace(f"def {n.name}(", f"def {n.name}__rule(", 1)]
open(path, "w").write("".join(lines))
EOF
}

selection_args() {  # a selection's pytest arguments inside $1 (globs expanded, absent skipped)
  (cd "$1" && SELECTION="$2" DESELECT="${MUTATION_DESELECT:-}" python3 -c '
import glob, os, shlex
for word in shlex.split(os.environ["SELECTION"]):
    if "*" in word:
        print("\n".join(sorted(glob.glob(word))))
    elif not word.startswith("tests/") or os.path.exists(word.split("::")[0]):
        print(word)
for node in shlex.split(os.environ.get("DESELECT", "")):
    print("--deselect")
    print(node)
')
}

recheck_module() {  # a finished run's survivors against the current tests, in one process
  local module="$1" slug dir start=$SECONDS
  slug="$(echo "${module#src/fedforge/}" | tr '/' '.')"
  slug="${slug%.py}"
  dir="$WORK/$slug"
  if [[ ! -f "$dir/results.txt" || ! -d "$dir/mutants/src" ]]; then
    echo "mutation: no finished run of $module in $dir to recheck" >&2
    return 1
  fi
  rm -rf "$dir/mutants/tests"
  if [[ -n "$REV" ]]; then
    (cd "$ROOT" && git archive "$REV" tests) | tar -xf - -C "$dir/mutants"
  else
    (cd "$ROOT" && tar --exclude=__pycache__ -cf - tests) | tar -xf - -C "$dir/mutants"
  fi
  local -a args
  # a survivor passed the whole selection once: MUTATION_TESTS may name just the new tests
  mapfile -t args < <(selection_args "$dir/mutants" "${MUTATION_TESTS:-$(tests_for "$module")}")
  echo "== recheck $module${REV:+ at $REV}: pytest ${args[*]}"
  # one pytest process: the trampolines read MUTANT_UNDER_TEST at every call, so each
  # survivor is one pytest.main; the clean pass first imports every test module unmutated
  (cd "$dir/mutants" && PYTHONPATH=src OMP_NUM_THREADS=1 nice -n 10 python3 -c '
import os, re, sys
import pytest
src, dst, args = sys.argv[1], sys.argv[2], sys.argv[3:]
base = ["-x", "-q", "-p", "no:cacheprovider", *args]
os.environ["MUTANT_UNDER_TEST"] = ""
if pytest.main(base) != 0:
    sys.exit("recheck: the tests fail without a mutant")
out = []
for line in open(src).read().splitlines():
    m = re.match(r"^\s*([^:]+): (survived|no tests)$", line)
    if m:
        os.environ["MUTANT_UNDER_TEST"] = m.group(1)
        if pytest.main(base) not in (0, 5):  # 5: nothing collected
            line = line.split(":")[0] + ": killed"
    out.append(line)
open(dst, "w").write("\n".join(out) + "\n")
' "$dir/results.txt" "$dir/results.recheck.txt" "${args[@]}" >"$dir/recheck.log" 2>&1) || {
    echo "   recheck failed; the end of $dir/recheck.log:" >&2
    tail -n 15 "$dir/recheck.log" >&2
    return 1
  }
  report "$module" "$dir" "$dir/results.recheck.txt" "$start" 0
}

report() {  # scores.tsv and the survivors file from a results listing
  local module="$1" dir="$2" results="$3" start="$4" status="$5" slug total killed survivors
  slug="$(basename "$dir")"
  total=$(grep -c ': ' "$results" || true)
  killed=$(grep -c -E ': (killed|timeout|caught by type check)$' "$results" || true)
  survivors=$(grep -v -E ': (killed|timeout|caught by type check)$' "$results" \
              | sed -E 's/^ *//' || true)
  {
    echo "# $module: surviving mutants (mutmut show NAME), $(date -u +%F)"
    while IFS= read -r line; do
      [[ -z "$line" ]] && continue
      echo "## $line"
      (cd "$dir" && mutmut show "${line%%:*}" 2>/dev/null) || true
    done <<<"$survivors"
  } >"$OUT/$slug.survivors.txt"
  if [[ "$total" -eq 0 ]]; then
    echo "   mutmut produced no results; the end of $dir/run.log:" >&2
    tr '\r' '\n' <"$dir/run.log" | tail -n 15 >&2
    return 1
  fi
  local pct="0.0"
  [[ "$total" -gt 0 ]] && pct=$(python3 -c "print(f'{100 * $killed / $total:.1f}')")
  touch "$OUT/scores.tsv"
  grep -v -P "^\Q$module\E\t" "$OUT/scores.tsv" >"$OUT/scores.tsv.tmp" || true
  printf '%s\t%s\t%s\t%s\n' "$module" "$killed" "$total" "$pct" >>"$OUT/scores.tsv.tmp"
  sort "$OUT/scores.tsv.tmp" >"$OUT/scores.tsv" && rm -f "$OUT/scores.tsv.tmp"
  echo "   $killed/$total killed ($pct %) in $((SECONDS - start)) s" \
       "$([[ $status -eq 124 ]] && echo "(budget of $BUDGET s reached)")" \
       "-> $OUT/$slug.survivors.txt"
}

modules=()
recheck=0
case "${1:-}" in
  ""|-h|--help)
    sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
    exit 0 ;;
  --list)
    cd "$ROOT"
    for m in "${CONFIGURED[@]}"; do printf '%-45s %s\n' "$m" "$(tests_for "$m")"; done
    exit 0 ;;
  --all)
    cd "$ROOT"
    modules=("${CONFIGURED[@]}") ;;
  --since)
    rev="${2:?--since needs a git revision}"
    cd "$ROOT"
    while IFS= read -r f; do
      configured "$f" && modules+=("$f")
    done < <(git diff --name-only "$rev" -- src/fedforge)
    if [[ ${#modules[@]} -eq 0 ]]; then
      echo "mutation: no configured module changed since $rev"
      exit 0
    fi ;;
  --recheck)
    shift
    recheck=1 ;&
  *)
    cd "$ROOT"
    for m in "$@"; do
      [[ "$m" == src/* ]] || m="src/fedforge/$m"
      configured "$m" || { echo "mutation: $m is not a configured module (--list)" >&2; exit 2; }
      modules+=("$m")
    done ;;
esac

failed=0
command -v mutmut >/dev/null || { echo 'mutation: install mutmut: pip install -e ".[mutation]"' >&2
                                 exit 2; }
for m in "${modules[@]}"; do
  case "$m" in  # the do_not_mutate of [tool.mutmut]: registries, data tables, benchmarks
    */__init__.py | */algorithms/defaults.py | */comm/bench.py) continue ;;
  esac
  if [[ $recheck -eq 1 ]]; then
    recheck_module "$m" || failed=1
  else
    run_module "$m" || failed=1
  fi
done
echo "scores: $OUT/scores.tsv"
column -t -s $'\t' "$OUT/scores.tsv" 2>/dev/null || cat "$OUT/scores.tsv"
exit "$failed"
