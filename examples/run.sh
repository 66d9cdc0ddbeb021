#!/bin/sh
# Runs every examples/*.lua; fails if one fails. Needs a GPU: says so plainly without one.
LUA=${1:-lua5.4}
if ! $LUA -e 'package.cpath="./?.so;"..package.cpath; os.exit(require("cudalua").is_available() and 0 or 1)'; then
  why=$($LUA -e 'package.cpath="./?.so;"..package.cpath; print(require("cudalua").driver_error())')
  echo "no GPU on this machine ($why): the examples need one; 'make test' runs the rest"
  exit 1
fi
pass=0; fail=0; skip=0; failed=""
for f in examples/*.lua; do   # exit status 77: skipped (an optional library, such as NCCL, is missing)
  echo "== $f"
  $LUA "$f"; rc=$?
  if [ $rc -eq 0 ]; then pass=$((pass + 1)); elif [ $rc -eq 77 ]; then skip=$((skip + 1)); else fail=$((fail + 1)); failed="$failed $f"; fi
done
for mode in single threads; do   # the C host program embedding cudalua (examples/embed)
  echo "== build/embed_host $mode"
  if [ -x build/embed_host ] && build/embed_host $mode; then pass=$((pass + 1)); else fail=$((fail + 1)); failed="$failed embed:$mode"; fi
done
echo "examples: $pass passed, $fail failed, $skip skipped${failed:+ ($failed )}"
[ "$fail" -eq 0 ]
