#!/usr/bin/env bash
# tools/stress.sh SECONDS [THREADS [SEED [CHILD_SECONDS]]]: runs build/stress (tools/stress.c,
# several Lua states on threads running tools/stress.lua) in child processes, one after the
# other with consecutive seeds, until SECONDS have passed; tallies what ended badly:
#   crash (a signal), hang (the watchdog's status 3, or the child's time limit), wrong (status 1).
# STRESS_WRAP runs each child under a tool (compute-sanitizer); STRESS_HANG sets the watchdog's
# limit (default 60 s); STRESS_LOGS: where failed runs' whole output is kept (build/stress-logs).
# The last line: "stress: N runs (seeds A..B), S sequences, O operations, C crashes, H hangs,
# W wrong"; exit 1 if any of those is not 0.
set -u
total=${1:-60}; threads=${2:-3}; seed=${3:-$(( $(date +%s) % 100000 ))}; child=${4:-30}
hang=${STRESS_HANG:-60}
logs=${STRESS_LOGS:-build/stress-logs}
end=$(( $(date +%s) + total ))
first=$seed; runs=0; crashes=0; hangs=0; wrong=0; seqs=0; ops=0
log=$(mktemp)
trap 'rm -f "$log" "$log.sym"' EXIT
while [ "$(date +%s)" -lt "$end" ]; do
  left=$(( end - $(date +%s) )); t=$(( left < child ? left : child )); [ "$t" -lt 1 ] && t=1
  # the child's own limit: its run, its watchdog's, and the state's close
  timeout -k 10 $(( t + hang + 60 )) ${STRESS_WRAP:-} build/stress -t "$threads" -s "$t" -S "$seed" -w "$hang" tools/stress.lua >"$log" 2>&1
  rc=$?
  runs=$(( runs + 1 ))
  line=$(grep -E '^stress: seed' "$log" | tail -1)
  if [ -n "$line" ]; then
    seqs=$(( seqs + $(echo "$line" | sed -E 's/.* ([0-9]+) sequences.*/\1/') ))
    ops=$(( ops + $(echo "$line" | sed -E 's/.* ([0-9]+) operations.*/\1/') ))
  fi
  # stacks: addresses turned into functions and lines
  if grep -q '^bt: ' "$log"; then
    grep -o '^bt: 0x[0-9a-f]*' "$log" | cut -c5- | sort -u | while read -r a; do
      printf '%s %s\n' "$a" "$(addr2line -f -s -e build/stress "$a" 2>/dev/null | paste -sd' ')"
    done >"$log.sym"
    awk 'NR == FNR { sym[$1] = $2 " " $3; next } /^bt: / { a = substr($0, 5); print "  " (a in sym ? sym[a] : a); next } { print }' "$log.sym" "$log" >"$log.2"
    mv "$log.2" "$log"
  fi
  case $rc in
    0) ;;
    1) wrong=$(( wrong + 1 )); echo "stress: seed $seed: wrong results"; tail -5 "$log" ;;
    3|124|137) hangs=$(( hangs + 1 )); echo "stress: seed $seed: hang (status $rc)"; grep -A150 "HANG" "$log" | head -150 ;;
    *) crashes=$(( crashes + 1 )); echo "stress: seed $seed: crash (status $rc)"; grep -A40 "CRASH" "$log" | head -40 ;;
  esac
  # a failed run's whole output is kept (the lines above are its summary)
  if [ "$rc" -ne 0 ]; then
    mkdir -p "$logs" && cp "$log" "$logs/seed-$seed.log" && echo "stress: seed $seed: whole output in $logs/seed-$seed.log"
  fi
  seed=$(( seed + 1 ))
done
echo "stress: $runs runs (seeds $first..$(( seed - 1 )), $threads threads each), $seqs sequences, $ops operations, $crashes crashes, $hangs hangs, $wrong wrong"
[ $(( crashes + hangs + wrong )) -eq 0 ]
