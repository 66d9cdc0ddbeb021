#!/bin/sh
# tools/sanitize.sh LUA: every example (and the embedding host) under compute-sanitizer's
# memcheck (with the leak check), racecheck, synccheck and initcheck; prints one table of the
# errors each tool reported (memcheck: and the bytes leaked) and exits 1 unless all are zero.
# GPU machine only (make sanitize). Env: SANITIZE_TOOLS (default all four), SANITIZE_EXAMPLES
# (default examples/*.lua), SANITIZER (compute-sanitizer, else $CUDA_DIR/bin/compute-sanitizer),
# SANITIZE_SPECS=1 also runs the specs (not those tagged #cudaerror, which plant CUDA errors on
# purpose) under memcheck. Logs go to build/sanitize/.
LUA=${1:-lua5.4}
CUDA_DIR=${CUDA_DIR:-/usr/local/cuda}
CS=${SANITIZER:-$(command -v compute-sanitizer || echo "$CUDA_DIR/bin/compute-sanitizer")}
TOOLS=${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}
EXAMPLES=${SANITIZE_EXAMPLES:-$(ls examples/*.lua)}
LOG=build/sanitize
mkdir -p "$LOG"
if ! $LUA -e 'package.cpath="./?.so;"..package.cpath; os.exit(require("cudalua").is_available() and 0 or 1)'; then
  echo "no GPU on this machine: compute-sanitizer needs one"; exit 1
fi
[ -x "$CS" ] || { echo "no compute-sanitizer ($CS)"; exit 1; }

bad=0
row() {   # row NAME CMD...: one line of the table
  name=$1; shift
  line=$(printf "%-34s" "$name")
  for t in $TOOLS; do
    f="$LOG/$(echo "$name" | tr '/ ' '__').$t.log"
    extra=""
    [ "$t" = memcheck ] && extra="--leak-check full"
    # --error-exitcode: the sanitizer's verdict; examples that skip (77) are still checked
    "$CS" --tool "$t" $extra --target-processes all --error-exitcode 9 "$@" >"$f" 2>&1
    rc=$?
    errs=$(grep -E "ERROR SUMMARY: [0-9]+ error" "$f" | tail -1 | sed -E 's/.*ERROR SUMMARY: ([0-9]+) error.*/\1/')
    [ -z "$errs" ] && errs=$(grep -E "RACECHECK SUMMARY: [0-9]+ hazard" "$f" | tail -1 | sed -E 's/.*\(([0-9]+) error.*/\1/')
    [ -z "$errs" ] && errs="?"
    leak=""
    if [ "$t" = memcheck ]; then
      leak=$(grep -E "LEAK SUMMARY: [0-9]+ bytes" "$f" | tail -1 | sed -E 's/.*LEAK SUMMARY: ([0-9]+) bytes.*/\1/')
      leak="/${leak:-0}B"
    fi
    cell="$errs$leak"
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then cell="$cell(rc $rc)"; bad=1; fi
    [ "$errs" = 0 ] || bad=1
    case "$leak" in ""|/0B) ;; *) bad=1 ;; esac
    line="$line $(printf "%-16s" "$cell")"
  done
  echo "$line"
}

header=$(printf "%-34s" "program")
for t in $TOOLS; do
  if [ "$t" = memcheck ]; then header="$header $(printf "%-16s" "memcheck/leaked")"; else header="$header $(printf "%-16s" "$t")"; fi
done
echo "$header"
for f in $EXAMPLES; do row "$f" $LUA "$f"; done
if [ -x build/embed_host ]; then
  for mode in single threads; do row "embed_host $mode" build/embed_host $mode; done
fi
if [ -n "$SANITIZE_SPECS" ]; then
  TOOLS=memcheck row "specs (make test)" $LUA -e "package.path='./?.lua;'..package.path; package.cpath='./?.so;'..package.cpath; require 'busted.runner'({standalone=false})" /dev/null -o spec/output.lua --exclude-tags=nogpu,cudaerror spec
fi
[ "$bad" -eq 0 ] && echo "sanitize: every program clean" || echo "sanitize: errors or leaks above (logs in $LOG)"
exit $bad
