#!/bin/sh
# Runs every examples/*.lua; fails if one fails. Needs a GPU: says so plainly without one.
LUA=${1:-lua5.4}
if ! $LUA -e 'package.cpath="./?.so;"..package.cpath; os.exit(require("cudalua").is_available() and 0 or 1)'; then
  why=$($LUA -e 'package.cpath="./?.so;"..package.cpath; print(require("cudalua").driver_error())')
  echo "no GPU on this machine ($why): the examples need one; 'make test' runs the rest"
  exit 1
fi
pass=0; fail=0; failed=""
for f in examples/*.lua; do
  echo "== $f"
  if $LUA "$f"; then pass=$((pass + 1)); else fail=$((fail + 1)); failed="$failed $f"; fi
done
for mode in single threads; do   # the C host program embedding cudalua (examples/embed)
  echo "== build/embed_host $mode"
  if [ -x build/embed_host ] && build/embed_host $mode; then pass=$((pass + 1)); else fail=$((fail + 1)); failed="$failed embed:$mode"; fi
done
echo "examples: $pass passed, $fail failed${failed:+ ($failed )}"
[ "$fail" -eq 0 ]
