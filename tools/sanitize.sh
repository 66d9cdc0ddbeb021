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
# Logs go to build/sanitize/.
LUA=${1:-lua5.4}
CUDA_DIR=${CUDA_DIR:-/usr/local/cuda}
CS=${SANITIZER:-$(command -v compute-sanitizer || echo "$CUDA_DIR/bin/compute-sanitizer")}
TOOLS=${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}
EXAMPLES=${SANITIZE_EXAMPLES:-$(ls examples/*.lua)}
JOBS=${SANITIZE_JOBS:-$(( $(nproc) / 4 > 0 ? $(nproc) / 4 : 1 ))}
LIMIT=${SANITIZE_TIMEOUT:-600}
DEADLINE=${SANITIZE_DEADLINE:-}
LOG=build/sanitize
mkdir -p "$LOG"
if ! $LUA -e 'package.cpath="./?.so;"..package.cpath; os.exit(require("cudalua").is_available() and 0 or 1)'; then
  echo "no GPU on this machine: compute-sanitizer needs one"; exit 1
fi
[ -x "$CS" ] || { echo "no compute-sanitizer ($CS)"; exit 1; }

BUSTED="package.path='./?.lua;'..package.path; package.cpath='./?.so;'..package.cpath; require 'busted.runner'({standalone=false})"
rows=()       # "name|tools|command..." in table order
for f in $EXAMPLES; do rows+=("$f|$TOOLS|$LUA $f"); done
if [ -x build/embed_host ]; then
  for mode in single threads; do rows+=("embed_host $mode|$TOOLS|build/embed_host $mode"); done
fi
if [ -n "$SANITIZE_SPECS" ]; then   # a row per spec file, so that they run at once too
  for f in spec/*_spec.lua; do
    rows+=("$f|memcheck|env CUDALUA_CACHE_DIR=$PWD/build/sanitize/cache $LUA -e \"$BUSTED\" /dev/null -o spec/output.lua --exclude-tags=nogpu,cudaerror $f")
  done
fi

key() { echo "$1" | tr '/ ()' '____'; }

# one run: its log, and a cell for the table in $LOG/NAME.TOOL.cell
one() {
  local name=$1 tool=$2 cmd=$3 base
  base="$LOG/$(key "$name").$tool"
  local extra=""
  [ "$tool" = memcheck ] && extra="--leak-check full"
  # --error-exitcode: the sanitizer's verdict; examples that skip (77) are still checked
  eval "timeout -k 10 $LIMIT \"$CS\" --tool $tool $extra --target-processes all --error-exitcode 9 $cmd" >"$base.log" 2>&1
  local rc=$? errs leak=""
  errs=$(grep -E "ERROR SUMMARY: [0-9]+ error" "$base.log" | tail -1 | sed -E 's/.*ERROR SUMMARY: ([0-9]+) error.*/\1/')
  [ -z "$errs" ] && errs=$(grep -E "RACECHECK SUMMARY: [0-9]+ hazard" "$base.log" | tail -1 | sed -E 's/.*\(([0-9]+) error.*/\1/')
  [ -z "$errs" ] && errs="?"
  if [ "$tool" = memcheck ]; then
    leak=$(grep -E "LEAK SUMMARY: [0-9]+ bytes" "$base.log" | tail -1 | sed -E 's/.*LEAK SUMMARY: ([0-9]+) bytes.*/\1/')
    leak="/${leak:-0}B"
  fi
  local cell="$errs$leak"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then cell="timeout"
  elif [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then cell="$cell(rc $rc)"; fi
  echo "$cell" >"$base.cell"
}

running=0
start=$SECONDS
for r in "${rows[@]}"; do
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

bad=0
header=$(printf "%-34s" "program")
for t in $TOOLS; do
  if [ "$t" = memcheck ]; then header="$header $(printf "%-16s" "memcheck/leaked")"; else header="$header $(printf "%-16s" "$t")"; fi
done
echo "$header"
for r in "${rows[@]}"; do
  IFS='|' read -r name tools cmd <<<"$r"
  line=$(printf "%-34s" "$name")
  for t in $TOOLS; do
    cell="-"
    case " $tools " in *" $t "*) cell=$(cat "$LOG/$(key "$name").$t.cell" 2>/dev/null || echo "?") ;; esac
    case "$cell" in -|0|0/0B) ;; *) bad=1 ;; esac
    line="$line $(printf "%-16s" "$cell")"
  done
  echo "$line"
done
[ "$bad" -eq 0 ] && echo "sanitize: every program clean" || echo "sanitize: errors, leaks or timeouts above (logs in $LOG)"
exit $bad
