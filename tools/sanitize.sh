#!/bin/bash
# tools/sanitize.sh LUA: every example (and the embedding host) under compute-sanitizer's
# memcheck (with the leak check), racecheck, synccheck and initcheck; prints one table of the
# errors each tool reported (memcheck: and the bytes leaked) and exits 1 unless all are zero.
# GPU machine only (make sanitize). The runs are mostly host work, so several go at once.
# Env: SANITIZE_TOOLS (default all four), SANITIZE_EXAMPLES (default examples/*.lua),
#      SANITIZE_JOBS (runs at once, default a quarter of the CPUs), SANITIZE_TIMEOUT (seconds a
#      run may take, default 600; one that takes longer shows "timeout"), SANITIZE_DEADLINE
#      (seconds after which no new run starts; those show "not run"), SANITIZER
#      (compute-sanitizer, else $CUDA_DIR/bin/compute-sanitizer), SANITIZE_SPECS=1 also runs each spec
#      file (not the specs tagged #cudaerror, which plant CUDA errors on purpose) under memcheck.
#      SANITIZE_SPEC_FILES: which spec files (default all). SANITIZE_SPLIT: spec files run as one
#      row per top-level describe (and one for the rest), so that a slow file's parts run at once.
#      SANITIZE_SLOW: files whose rows start first. SANITIZE_ALONE: files run before the others,
#      one at a time (they take a share of the free device memory, which the runs beside them
#      would then miss; beside many others, the sanitizer named nccl_pi's records wrongly).
#      Records that NCCL's own code causes are shown apart as "+N nccl" (tools/sanitize.awk).
#      examples/nccl_launch.lua and spec 21's one-process-per-GPU row start their ranks under a
#      sanitizer each (CUDALUA_WORKER_WRAP); their summaries add up in the row.
#      SANITIZE_LOG: where the logs go (default build/sanitize). SANITIZE_KNOWN: rows whose
#      records are marked "known" and not counted (default examples/graph_while.lua: README). SANITIZE_STRESS: seconds of
#      build/stress (3 Lua states on threads) under memcheck and synccheck (default 60, 0: none),
#      without the sequences SANITIZE_STRESS_SKIP names (default while,cond: conditional nodes).
#      Stopping this script (Ctrl-C, a timeout around make sanitize) stops the runs it started.
LUA=${1:-lua5.4}
CUDA_DIR=${CUDA_DIR:-/usr/local/cuda}
CS=${SANITIZER:-$(command -v compute-sanitizer || echo "$CUDA_DIR/bin/compute-sanitizer")}
TOOLS=${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}
EXAMPLES=${SANITIZE_EXAMPLES-$(ls examples/*.lua)}
SPEC_FILES=${SANITIZE_SPEC_FILES:-$(ls spec/*_spec.lua)}
SLOW_SPECS="spec/14-graph_spec.lua spec/21-multigpu_spec.lua spec/22-ipc_nccl_spec.lua"
SPLIT=${SANITIZE_SPLIT:-$SLOW_SPECS}
ALONE=${SANITIZE_ALONE:-"spec/04-device_array_spec.lua examples/nccl_pi.lua"}
JOBS=${SANITIZE_JOBS:-$(( $(nproc) / 4 > 0 ? $(nproc) / 4 : 1 ))}
LIMIT=${SANITIZE_TIMEOUT:-600}
DEADLINE=${SANITIZE_DEADLINE:-}
LOG=${SANITIZE_LOG:-build/sanitize}
# rows whose failures are the sanitizer's known fault with conditional nodes (README): shown, marked
# "known", not counted
KNOWN=${SANITIZE_KNOWN-examples/graph_while.lua}
mkdir -p "$LOG"
# set here, not with env(1) in the row: under --target-processes application-only the
# sanitizer attaches to the command it starts, and env(1) is not the program
export CUDALUA_CACHE_DIR=$PWD/$LOG/cache
# examples/nccl_launch.lua ends its workers itself, before this script's limit ends it
export CUDALUA_WORKER_LIMIT=$(( LIMIT > 60 ? LIMIT - 30 : LIMIT ))
if ! $LUA -e 'package.cpath="./?.so;"..package.cpath; os.exit(require("cudalua").is_available() and 0 or 1)'; then
  echo "no GPU on this machine: compute-sanitizer needs one"; exit 1
fi
[ -x "$CS" ] || { echo "no compute-sanitizer ($CS)"; exit 1; }

BUSTED="package.path='./?.lua;'..package.path; package.cpath='./?.so;'..package.cpath; require 'busted.runner'({standalone=false})"
rows=()       # "name|tools|command..." in table order
for f in $EXAMPLES; do
  tools=$TOOLS
  # racecheck, synccheck and initcheck refuse dynamic parallelism ("CUDA Dynamic Parallelism is
  # not supported by the selected tool", compute-sanitizer 2025.3.1): memcheck only there
  case "$f" in *cdp_*) tools=""; for t in $TOOLS; do [ "$t" = memcheck ] && tools="$tools $t"; done ;; esac
  [ -n "${tools// /}" ] && rows+=("$f|${tools# }|$LUA $f")
done
if [ -x build/embed_host ]; then
  for mode in single threads; do rows+=("embed_host $mode|$TOOLS|build/embed_host $mode"); done
fi
# several Lua states on threads with host functions, captures and frees (tools/stress.c)
if [ -x build/stress ] && [ "${SANITIZE_STRESS:-60}" -gt 0 ]; then
  # without the sequences that make conditional nodes: memcheck faults on those in plain CUDA C
  # too (README, tools/while_repro.cu); make stress runs them
  export STRESS_SKIP=${SANITIZE_STRESS_SKIP-while,cond}
  rows+=("stress ${SANITIZE_STRESS:-60} s 3 states|memcheck synccheck|build/stress -t 3 -s ${SANITIZE_STRESS:-60} -S 7 -w 400 tools/stress.lua")
fi
if [ -n "$SANITIZE_SPECS" ]; then   # a row per spec file, so that they run at once too
  for f in $SPEC_FILES; do
    # 08 measures memory growth, which the sanitizer's own allocations make meaningless
    case "$f" in *08-leaks*) continue ;; esac
    run="$LUA -e \"$BUSTED\" /dev/null -o spec/output.lua --exclude-tags=nogpu,cudaerror"
    case " $SPLIT " in
      *" $f "*)
        # busted's --filter takes a Lua pattern of the test's full name, which starts with
        # its describe's; the names hold no quote or bar
        rest=""
        while IFS= read -r d; do
          pat="^$(printf '%s' "$d" | sed 's/[][^$().%*+?-]/%&/g') "
          rows+=("$f [$d]|memcheck|$run --filter='$pat' $f")
          rest="$rest --filter-out='$pat'"
        done < <(sed -n 's/^describe("\([^"]*\)".*/\1/p' "$f")
        rows+=("$f [rest]|memcheck|$run$rest $f") ;;
      *) rows+=("$f|memcheck|$run $f") ;;
    esac
  done
fi

key() { echo "$1" | tr '/ ()' '____'; }

# one run: its log, and a cell for the table in $LOG/NAME.TOOL.cell
one() {
  local name=$1 tool=$2 cmd=$3 base
  base="$LOG/$(key "$name").$tool"
  local extra=""
  [ "$tool" = memcheck ] && extra="--leak-check full"
  # ranks started as processes of their own (NCCL) wait for each other, which one sanitizer
  # following every child does not let them do (they hung in NCCL's bootstrap): each rank runs
  # under a sanitizer of its own instead (CUDALUA_WORKER_WRAP), and its summary is in the log
  # (no --error-exitcode there: NCCL's own records would fail the rank; the log's count decides)
  local procs="--target-processes all" wrap=""
  case "$name" in
    examples/nccl_launch.lua|*"[NCCL with one process per GPU]")
      procs="--target-processes application-only"
      wrap="CUDALUA_WORKER_WRAP='$CS --tool $tool $extra --print-limit 1000000'" ;;
  esac
  # examples/ipc.lua's second process scales memory the first one filled: initcheck there knows
  # nothing of another process's writes and named each of its million reads (a 1 GB log, and a
  # run past the limit). The first process is still checked, the second by the other tools.
  [ "$tool" = initcheck ] && [ "$name" = examples/ipc.lua ] && procs="--target-processes application-only"
  # --error-exitcode: the sanitizer's verdict; examples that skip (77) are still checked.
  # timeout puts the run in a process group of its own, which a signal to this script's group
  # does not reach: its id (timeout's pid, exec'd in the subshell) is kept for stop() below
  ( [ -n "$wrap" ] && eval "export $wrap"
    eval "exec timeout -k 10 $LIMIT \"$CS\" --tool $tool $extra --print-limit 1000000 $procs --error-exitcode 9 $cmd" ) >"$base.log" 2>&1 &
  local pid=$!
  echo "$pid" >"$base.pid"
  wait "$pid"
  local rc=$? errs leak="" nccl=0
  rm -f "$base.pid"
  # every process's summary counts (a wrapped rank prints its own)
  errs=$(grep -aE "ERROR SUMMARY: [0-9]+ error" "$base.log" | grep -v "not printed" | sed -E 's/.*ERROR SUMMARY: ([0-9]+) error.*/\1/' | awk '{ s += $1; n++ } END { if (n) print s }')
  [ -z "$errs" ] && errs=$(grep -aE "RACECHECK SUMMARY: [0-9]+ hazard" "$base.log" | sed -E 's/.*\(([0-9]+) error.*/\1/' | awk '{ s += $1; n++ } END { if (n) print s }')
  [ -z "$errs" ] && errs="?"
  # the records NCCL's own code caused are counted apart; the rest count as cudalua's (a
  # record awk cannot place, such as a tool's warning, is never taken for NCCL's)
  if [ "$errs" != "?" ] && [ "$errs" -gt 0 ] && [ "$tool" != racecheck ]; then
    nccl=$(awk -f tools/sanitize.awk "$base.log")
    if [ "$nccl" -le "$errs" ]; then errs=$((errs - nccl)); else nccl=0; fi
  fi
  if [ "$tool" = memcheck ]; then
    leak=$(grep -aE "LEAK SUMMARY: [0-9]+ bytes" "$base.log" | sed -E 's/.*LEAK SUMMARY: ([0-9]+) bytes.*/\1/' | awk '{ s += $1 } END { print s + 0 }')
    leak="/${leak:-0}B"
  fi
  local cell="$errs$leak"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then cell="timeout"
  elif [ "$rc" -eq 9 ] && [ "$nccl" -gt 0 ] && [ "$errs" = 0 ]; then :   # only NCCL's own
  elif [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then cell="$cell(rc $rc)"; fi
  [ "$nccl" -gt 0 ] && cell="$cell+${nccl}nccl"
  echo "$cell" >"$base.cell"
}

# stopped: the runs still going end too (else they would keep the GPU busy for up to $LIMIT s)
stop() {
  local f pids=()
  for f in "$LOG"/*.pid; do [ -f "$f" ] && pids+=("$(cat "$f")"); done
  echo "sanitize: stopped; ending the ${#pids[@]} runs still going" >&2
  for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done
  sleep 2
  for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done
  exit 130
}
rm -f "$LOG"/*.pid
trap stop INT TERM HUP

# the slowest runs start first, so that the others fill in around them
SLOW=${SANITIZE_SLOW:-"$SLOW_SPECS examples/nccl_launch.lua"}
alone=() slow=() rest=()
for r in "${rows[@]}"; do
  n=${r%%|*}; f=" ${n%% \[*} "   # a split row's file
  case " $ALONE " in *"$f"*) alone+=("$r"); continue ;; esac
  case " $SLOW " in *"$f"*) slow+=("$r") ;; *) rest+=("$r") ;; esac
done
order=("${slow[@]}" "${rest[@]}")
start=$SECONDS
for r in "${alone[@]}"; do
  IFS='|' read -r name tools cmd <<<"$r"
  for t in $tools; do one "$name" "$t" "$cmd"; done
done
running=0
for r in "${order[@]}"; do
  IFS='|' read -r name tools cmd <<<"$r"
  for t in $tools; do
    if [ -n "$DEADLINE" ] && [ $((SECONDS - start)) -ge "$DEADLINE" ]; then
      echo "not run" >"$LOG/$(key "$name").$t.cell"; continue
    fi
    one "$name" "$t" "$cmd" &
    running=$((running + 1))
    if [ "$running" -ge "$JOBS" ]; then wait -n; running=$((running - 1)); fi
  done
done
wait

bad=0 nccl_seen="" known_seen=""
header=$(printf "%-52s" "program")
for t in $TOOLS; do
  if [ "$t" = memcheck ]; then header="$header $(printf "%-16s" "memcheck/leaked")"; else header="$header $(printf "%-16s" "$t")"; fi
done
echo "$header"
for r in "${rows[@]}"; do
  IFS='|' read -r name tools cmd <<<"$r"
  line=$(printf "%-52s" "$name")
  for t in $TOOLS; do
    cell="-"
    case " $tools " in *" $t "*) cell=$(cat "$LOG/$(key "$name").$t.cell" 2>/dev/null || echo "?") ;; esac
    case "$cell" in
      -|0|0/0B|0+*nccl|0/0B+*nccl) ;;
      *) case " $KNOWN " in *" $name "*) cell="$cell known"; known_seen=1 ;; *) bad=1 ;; esac ;;
    esac
    case "$cell" in *nccl) nccl_seen=1 ;; esac
    line="$line $(printf "%-16s" "$cell")"
  done
  echo "$line"
done
echo "-: not run under that tool (the stress row: memcheck and synccheck; dynamic parallelism: memcheck only)"
[ -n "$known_seen" ] && echo "known: the fault of conditional nodes under compute-sanitizer, in plain CUDA C too (README, tools/while_repro.cu); not counted"
[ -n "$nccl_seen" ] && echo "+N nccl: records inside NCCL's own code (its API probes, reads of its own buffers), counted apart"
[ "$bad" -eq 0 ] && echo "sanitize: every program clean" || echo "sanitize: errors, leaks or timeouts above (logs in $LOG)"
exit $bad
