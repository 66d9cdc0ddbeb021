# cudalua: make (build), make test, make examples, make bench (GPU machine), make install;
# make docs, make asan and make fuzz (CI), make sanitize (GPU machine). build/cudalua-run: the
# job launcher (tools/cudalua-run.c), installed into bin/.
# Builds against the CUDA toolkit's headers only: libcuda and NVRTC are opened at run time.
LUA        ?= lua5.4
LUA_INCDIR ?= /usr/include/lua5.4
CUDA_DIR   ?= /usr/local/cuda
CC         ?= gcc
CFLAGS     ?= -O2 -g
WERROR     ?=
WARN        = -Wall -Wextra $(WERROR)
ALL_CFLAGS  = $(CFLAGS) $(WARN) -fPIC -fvisibility=hidden -std=gnu11 -I$(LUA_INCDIR) -I$(CUDA_DIR)/include -Isrc
LIBFLAG    ?= -shared
LIBS        = -ldl -lpthread -lm

SRCS    = $(wildcard src/*.c)
OBJS    = $(SRCS:src/%.c=build/%.o) build/embedded.o
PARTS   = $(wildcard lua/cudalua/*.lua)
HEADERS = $(wildcard kernels/cudalua/*.cuh kernels/cudalua/nvrtc/*.h kernels/cudalua/cpu/*.h)

# install locations (LuaRocks passes its own)
PREFIX     ?= /usr/local
INST_LIBDIR ?= $(PREFIX)/lib/lua/5.4
INST_INCDIR ?= $(PREFIX)/include
INST_BINDIR ?= $(PREFIX)/bin

# the Lua library a host program links (the packed Lua of the GPU machine has no -dev symlink)
LUA_LIB ?= $(firstword $(wildcard $(LUA_INCDIR)/../lib/liblua5.4.so.0) -llua5.4)

# the busted runner under Lua 5.4, whatever `busted` runs by default
BUSTED = $(LUA) -e "package.path='./?.lua;'..package.path; package.cpath='./?.so;'..package.cpath; require 'busted.runner'({standalone=false})" /dev/null

.PHONY: all test test-cpu examples bench install clean libs asan fuzz sanitize docs stress layers lengths
all: cudalua.so libs build/cudalua-run

# the C embedding API (src/cudalua.h) as a static and a shared library
libs: libcudalua.a libcudalua.so

libcudalua.a: $(OBJS)
	ar rcs $@ $(OBJS)

libcudalua.so: $(OBJS)
	$(CC) -shared -Wl,-soname,libcudalua.so -o $@ $(OBJS) $(LIBS)

build/%.o: src/%.c src/cl.h src/cudalua.h src/cpu_dev.h kernels/cudalua/cpu/abi.h | build
	$(CC) $(ALL_CFLAGS) -c $< -o $@

# always regenerated (cheap); embed.lua rewrites it only when its content changes
build/embedded.c: tools/embed.lua $(PARTS) $(HEADERS) FORCE | build
	$(LUA) tools/embed.lua $@ $(PARTS) -- $(HEADERS)

FORCE:

build/embedded.o: build/embedded.c
	$(CC) $(ALL_CFLAGS) -c $< -o $@

build:
	mkdir -p build

cudalua.so: $(OBJS)
	$(CC) $(LIBFLAG) -o $@ $(OBJS) $(LIBS)

# the job launcher: a program of its own (POSIX processes, pipes and signals; no Lua linked)
build/cudalua-run: tools/cudalua-run.c | build
	$(CC) $(CFLAGS) $(WARN) -std=gnu11 -o $@ $<

# every C file calls only downward: the layers listed at the top of src/cl.h, checked
# against what the object files define and use (tools/layers.lua; CI runs it)
layers: cudalua.so
	@$(LUA) tools/layers.lua src/cl.h $(OBJS)

# no function over 80 lines without a comment saying why (tools/lengths.lua; CI runs it)
lengths:
	@$(LUA) tools/lengths.lua src/*.c lua/cudalua/*.lua tools/cudalua-run.c

# the specs get a compile cache of their own, emptied first. With a GPU, the specs of the
# driver-less behaviour (#nogpu) run in a second pass with the driver hidden. Without one, the
# #gpu specs run in the second pass, on the CPU device (CUDALUA_DEVICE=cpu, when a C++ compiler
# is here; make CPU_PASS=0 leaves it out): those it cannot run are #gpuonly, skipped with the
# reason. The last line adds the passes up. make test-cpu: the CPU device's pass alone.
HAS_GPU = $(LUA) -e "package.cpath='./?.so;'..package.cpath; os.exit(require('cudalua').is_available() and 0 or 1)"
HAS_CXX = { [ -n "$$CXX" ] || command -v c++ || command -v g++ || command -v clang++; } >/dev/null 2>&1
TEST_ENV = CUDALUA_CACHE_DIR=$(CURDIR)/build/test-cache CUDALUA_SPEC_TALLY=$(CURDIR)/build/spec-tally
CPU_ENV = CUDALUA_DEVICE=cpu CUDALUA_CPU_MEMORY=1G
CPU_PASS ?= 1
TALLY = awk '{p += $$1; f += $$2; s += $$3} END {printf "%d passed, %d failed, %d skipped\n", p, f, s}' build/spec-tally
test: cudalua.so build/cudalua-run
	@rm -rf build/test-cache build/spec-tally
	@if $(HAS_GPU) 2>/dev/null; then \
	  $(TEST_ENV) $(BUSTED) -o spec/output.lua --exclude-tags=nogpu spec; st=$$?; \
	  echo "== the driver-less specs, with the driver hidden (CUDALUA_LIBCUDA=/nonexistent)"; \
	  $(TEST_ENV) CUDALUA_LIBCUDA=/nonexistent/libcuda.so.1 $(BUSTED) -o spec/output.lua --tags=nogpu spec || st=1; \
	elif [ "$(CPU_PASS)" = 1 ] && $(HAS_CXX); then \
	  $(TEST_ENV) $(BUSTED) -o spec/output.lua --exclude-tags=gpu spec; st=$$?; \
	  echo "== no GPU here: the #gpu specs on the CPU device (CUDALUA_DEVICE=cpu)"; \
	  $(TEST_ENV) $(CPU_ENV) $(BUSTED) -o spec/output.lua --tags=gpu spec || st=1; \
	else $(TEST_ENV) $(BUSTED) -o spec/output.lua spec; st=$$?; fi; \
	echo "== the passes together"; $(TALLY); exit $$st

test-cpu: cudalua.so
	@rm -rf build/test-cache build/spec-tally
	@echo "== the #gpu specs on the CPU device (CUDALUA_DEVICE=cpu)"
	@$(TEST_ENV) $(CPU_ENV) $(BUSTED) -o spec/output.lua --tags=gpu spec

# the embedding example links the static library, the Lua library and the CUDA runtime
build/embed_host: examples/embed/host.c src/cudalua.h libcudalua.a
	$(CC) $(CFLAGS) -std=gnu11 -Isrc -I$(LUA_INCDIR) -I$(CUDA_DIR)/include -o $@ $< libcudalua.a \
	  $(LUA_LIB) -L$(CUDA_DIR)/lib64 -lcudart -Wl,-rpath,$(CUDA_DIR)/lib64 $(LIBS)

# (a host program that cannot be built, without the CUDA runtime, is reported by run.sh)
examples: cudalua.so
	-@$(MAKE) -s build/embed_host
	@sh examples/run.sh $(LUA)

# tools/stress.c: several Lua states on threads running tools/stress.lua under a watchdog
build/stress: tools/stress.c src/cudalua.h libcudalua.a
	$(CC) $(CFLAGS) -std=gnu11 -no-pie -Isrc -I$(LUA_INCDIR) -o $@ $< libcudalua.a $(LUA_LIB) $(LIBS)

# make stress (GPU machine): random seeded sequences for STRESS_SECONDS, in child processes
STRESS_SECONDS ?= 60
STRESS_THREADS ?= 3
stress: cudalua.so build/stress
	@bash tools/stress.sh $(STRESS_SECONDS) $(STRESS_THREADS) $(STRESS_SEED)

bench: cudalua.so
	@LUA_INCDIR=$(LUA_INCDIR) CUDA_DIR=$(CUDA_DIR) sh bench/run.sh $(LUA)

# the reference: docs/api.lua (LDoc comments) -> docs/html (LDoc) and docs/API.md (checked in)
docs:
	cd docs && ldoc -c config.ld . >/dev/null
	$(LUA) tools/apidoc.lua docs/api.lua docs/API.md

# compute-sanitizer (GPU machine): every example under memcheck with the leak check,
# racecheck, synccheck and initcheck, as a table (tools/sanitize.sh)
sanitize: cudalua.so build/embed_host build/stress
	@CUDA_DIR=$(CUDA_DIR) bash tools/sanitize.sh $(LUA)

# tools/fuzz.lua: hostile calls of every public function and method, in child processes
FUZZ_CASES ?= 20000
FUZZ_SECONDS ?= 150
fuzz: cudalua.so
	@$(LUA) tools/fuzz.lua --cases $(FUZZ_CASES) --seconds $(FUZZ_SECONDS) $(FUZZ_ARGS)

# make asan: everything built again with AddressSanitizer and UBSan, then the specs (the
# driver-less ones, without a GPU) and the fuzzer run under them; any report fails. ASan's
# runtime must be in the main program: build/sanlua is a lua5.4 built with the same flags.
# It ends with `make clean` (the objects are instrumented): run `make` after it. The CPU
# device's pass is left out (CPU_PASS=0): spec 40 runs the CPU device under ASan in the first.
SAN_FLAGS = -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
SAN_CFLAGS = -O1 -g $(SAN_FLAGS)
SAN_ENV = ASAN_OPTIONS=detect_leaks=1:exitcode=23 UBSAN_OPTIONS=print_stacktrace=1 \
  LSAN_OPTIONS=suppressions=$(CURDIR)/tools/lsan.supp:print_suppressions=0:use_tls=0 \
  CUDALUA_SPEC_CFLAGS="$(SAN_FLAGS)"
# LSan stops every thread to scan for leaks. This LSan (gcc 12) misreads the dynamic TLS of
# libraries opened with dlopen (cudalua, NVRTC) and its tracer crashes ("Tracer caught signal
# 11", "DTLS ... at 0x980"): use_tls=0 leaves thread-local storage out of the scan (lsan.supp
# then names glibc's thread-specific blocks).
build/sanlua: tools/sanlua.c | build
	$(CC) $(SAN_CFLAGS) -I$(LUA_INCDIR) -o $@ $< $(LUA_LIB) -lm -ldl

asan:
	$(MAKE) -s clean
	$(MAKE) -s all build/sanlua CFLAGS="$(SAN_CFLAGS)" LIBFLAG="-shared -Wl,-z,nodelete"
	$(SAN_ENV) $(MAKE) -s test LUA=$(CURDIR)/build/sanlua CPU_PASS=0
	$(SAN_ENV) $(MAKE) -s fuzz LUA=$(CURDIR)/build/sanlua
	$(MAKE) -s clean

install: cudalua.so libs build/cudalua-run
	mkdir -p $(INST_LIBDIR) $(INST_INCDIR) $(INST_BINDIR)
	cp cudalua.so $(INST_LIBDIR)/
	cp src/cudalua.h $(INST_INCDIR)/
	cp libcudalua.a libcudalua.so $(INST_LIBDIR)/
	cp build/cudalua-run $(INST_BINDIR)/

clean:
	rm -rf build cudalua.so libcudalua.a libcudalua.so
