#!/bin/sh
# bench/run.sh LUA: builds bench/raw.c, runs the raw CUDA baseline, bench/core.lua (cudalua) and
# bench/compare.py (CuPy, Numba), then prints one table and checks cudalua's targets.
# Run from the repository root (make bench). Needs a GPU. Outputs go to bench/out/.
# Env: CUDA_DIR (/usr/local/cuda), PYTHON (python3), BENCH_LAUNCHES, BENCH_REPS,
#      BENCH_REPORT_ONLY=1 (only print the table from the files already in bench/out/).
# Exit status: 0 all targets met, 1 a target missed, 2 a part did not run.
LUA=${1:-lua5.4}
CUDA_DIR=${CUDA_DIR:-/usr/local/cuda}
PY=${PYTHON:-python3}
OUT=bench/out
mkdir -p "$OUT"
start=$(date +%s)
broken=""

step() {   # step NAME SECONDS CMD...: runs CMD with a time limit, its stdout into $OUT/NAME.txt
  name=$1; limit=$2; shift 2
  t0=$(date +%s)
  echo "== $name: $*" >&2
  timeout "$limit" "$@" >"$OUT/$name.txt"
  rc=$?
  echo "== $name: exit $rc after $(( $(date +%s) - t0 )) s" >&2
  [ $rc -eq 0 ] || broken="$broken $name"
}

if [ -z "$BENCH_REPORT_ONLY" ]; then
  if ! $LUA -e 'package.cpath="./?.so;"..package.cpath; os.exit(require("cudalua").is_available() and 0 or 1)'; then
    why=$($LUA -e 'package.cpath="./?.so;"..package.cpath; print(require("cudalua").driver_error())')
    echo "no GPU on this machine ($why): the benchmark needs one"
    exit 2
  fi
  rm -f "$OUT/raw.txt" "$OUT/core.txt" "$OUT/compare.txt"
  if gcc -O2 -std=gnu11 -Wall -I"$CUDA_DIR/include" bench/raw.c -o "$OUT/raw" \
       -L"$CUDA_DIR/lib64" -L"$CUDA_DIR/lib64/stubs" -Wl,-rpath,"$CUDA_DIR/lib64" -lcuda -lnvrtc -lm ||
     nvcc -O2 bench/raw.c -o "$OUT/raw" -lcuda -lnvrtc; then
    step raw 60 "$OUT/raw"
  else
    echo "bench: cannot build bench/raw.c" >&2
    broken="$broken raw"
  fi
  # a cache directory of its own, so that no earlier run serves a compile
  rm -rf "$OUT/cache"
  CUDALUA_CACHE_DIR=$PWD/$OUT/cache step core 90 "$LUA" bench/core.lua
  rm -rf "$OUT/cache"
  PYTHONUNBUFFERED=1 step compare 60 "$PY" bench/compare.py
  echo "== all parts ran in $(( $(date +%s) - start )) s" >&2
fi

for f in raw core compare; do touch "$OUT/$f.txt"; done
grep -h '^info_\|^#' "$OUT/raw.txt" "$OUT/core.txt" "$OUT/compare.txt"

# label | raw C key | cudalua key | CuPy key | Numba key | target on cudalua/raw ("le 1.15")
awk -F'|' -v out="$OUT" -v broken="$broken" '
function load(file, pre,   line, f) {
  while ((getline line < file) > 0) {
    split(line, f, " ")
    if (f[1] !~ /^(info_|#)/ && f[2] ~ /^[-0-9.eE+]+$/) v[pre f[1]] = f[2] + 0
  }
  close(file)
}
function num(x) {
  if (x == "") return "-"
  if (x < 10) return sprintf("%.3f", x)
  if (x < 100) return sprintf("%.2f", x)
  return sprintf("%.1f", x)
}
function get(pre, k) { return (k != "-" && (pre k) in v) ? v[pre k] : "" }
BEGIN {
  load(out "/raw.txt", "r:"); load(out "/core.txt", "l:"); load(out "/compare.txt", "p:")
  printf "\n| %-50s | %9s | %9s | %8s | %9s | %9s |\n", "measurement", "raw C", "cudalua", "ratio", "CuPy", "Numba"
  printf "|%s|%s|%s|%s|%s|%s|\n", "----------------------------------------------------", "-----------", "-----------", "----------", "-----------", "-----------"
}
/^#/ || NF < 6 { next }
{
  r = get("r:", $2); l = get("l:", $3); c = get("p:", $4); nb = get("p:", $5)
  ratio = (r != "" && l != "" && r > 0) ? l / r : ""
  printf "| %-50s | %9s | %9s | %8s | %9s | %9s |\n", $1, num(r), num(l),
         ratio == "" ? "-" : sprintf("%.2fx", ratio), num(c), num(nb)
  if ($6 != "") {
    split($6, t, " ")
    nt++
    if (ratio == "") { res[nt] = "FAIL"; why[nt] = "no number" }
    else {
      ok = (t[1] == "le" && ratio <= t[2]) || (t[1] == "ge" && ratio >= t[2]) || (t[1] == "gt" && ratio > t[2])
      res[nt] = ok ? "PASS" : "FAIL"
      why[nt] = sprintf("%.2fx raw (target %s %sx)", ratio, t[1] == "le" ? "<=" : t[1] == "ge" ? ">=" : ">", t[2])
    }
    lab[nt] = $1
    if (!ok || ratio == "") fails++
  }
}
END {
  printf "\ntargets (cudalua / raw C):\n"
  for (i = 1; i <= nt; i++) printf "%s  %-50s %s\n", res[i], lab[i], why[i]
  printf "\ndiagnostics (pieces timed apart):\n"
  for (k in v) if (k ~ /^[rl]:diag_/) d[++nd] = k
  for (i = 1; i <= nd; i++) for (j = i + 1; j <= nd; j++) if (d[j] < d[i]) { x = d[i]; d[i] = d[j]; d[j] = x }
  for (i = 1; i <= nd; i++) printf "  %-8s %-40s %s\n", substr(d[i], 1, 1) == "r" ? "raw C" : "cudalua", substr(d[i], 8), num(v[d[i]])
  if (broken != "") printf "\nparts that failed:%s\n", broken
  printf "\ntargets: %d passed, %d failed\n", nt - fails, fails
  exit broken != "" ? 2 : fails ? 1 : 0
}' <<'EOF'
launch empty, k[{1,1}]() each time (us)|launch_empty_us|launch_empty_us|cupy_launch_empty_us|numba_launch_empty_us|le 1.15
launch empty, launcher made once (us)|launch_empty_us|launch_empty_launcher_us|cupy_launch_empty_us|numba_launch_empty_cfg_us|le 1.15
launch 4 args, k[{1,1}](...) each time (us)|launch_four_us|launch_four_us|cupy_launch_four_us|numba_launch_four_us|le 1.15
launch 4 args, launcher made once (us)|launch_four_us|launch_four_launcher_us|cupy_launch_four_us|numba_launch_four_cfg_us|le 1.15
H2D 256 MiB pinned (GB/s)|h2d_pinned_gbs|h2d_pinned_gbs|cupy_h2d_pinned_gbs|-|ge 0.95
D2H 256 MiB pinned (GB/s)|d2h_pinned_gbs|d2h_pinned_gbs|cupy_d2h_pinned_gbs|-|ge 0.95
H2D 256 MiB pageable; cuda.array steady (GB/s)|h2d_pageable_gbs|h2d_default_gbs|cupy_h2d_pageable_gbs|-|gt 1
D2H 256 MiB pageable; cuda.array steady (GB/s)|d2h_pageable_gbs|d2h_default_gbs|cupy_d2h_pageable_gbs|-|gt 1
H2D 256 MiB pageable; cuda.array 1st copy (GB/s)|h2d_pageable_gbs|h2d_default_first_gbs|cupy_h2d_pageable_gbs|-|
D2H 256 MiB pageable; cuda.array 1st copy (GB/s)|d2h_pageable_gbs|d2h_default_first_gbs|cupy_d2h_pageable_gbs|-|
alloc+free 1 MiB async; <close> (us)|alloc_free_us|alloc_free_close_us|cupy_alloc_free_us|numba_alloc_free_us|le 1.5
alloc+free 1 MiB async; garbage collected (us)|alloc_free_us|alloc_free_gc_us|cupy_alloc_free_us|numba_alloc_free_us|le 1.5
cold NVRTC compile, vecadd sm_90 (ms)|compile_ms|compile_ms|-|-|le 1.1
EOF
