#!/bin/sh
# Runs every examples/*.lua; fails if one fails. Without a GPU they run on cudalua's CPU
# device (CUDALUA_DEVICE=cpu: kernels built by the host C++ compiler), as it says; an example
# of what runs on a GPU only says so and counts as skipped.
LUA=${1:-lua5.4}
has_gpu() { $LUA -e 'package.cpath="./?.so;"..package.cpath; os.exit(require("cudalua").is_available() and 0 or 1)'; }
if [ "$CUDALUA_DEVICE" != cpu ] && ! has_gpu; then
  why=$($LUA -e 'package.cpath="./?.so;"..package.cpath; print(require("cudalua").driver_error())')
  echo "no GPU on this machine ($why): the examples run on cudalua's CPU device (CUDALUA_DEVICE=cpu)"
  export CUDALUA_DEVICE=cpu
fi
if [ "$CUDALUA_DEVICE" = cpu ] && ! { [ -n "$CXX" ] || command -v c++ || command -v g++ || command -v clang++; } >/dev/null 2>&1; then
  echo "the CPU device needs a C++ compiler (CXX, c++, g++ or clang++) and none was found: sh .ci/setup installs g++"
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
  if [ "$CUDALUA_DEVICE" = cpu ]; then   # it allocates with the CUDA runtime (cudaMalloc) itself
    echo "embed_host: skipped: the host program uses the CUDA runtime, which needs a GPU"; skip=$((skip + 1))
  elif [ -x build/embed_host ] && build/embed_host $mode; then pass=$((pass + 1)); else fail=$((fail + 1)); failed="$failed embed:$mode"; fi
done
echo "examples: $pass passed, $fail failed, $skip skipped${failed:+ ($failed )}"
[ "$fail" -eq 0 ]
