rockspec_format = "3.0"
package = "cudalua"
version = "0.2.0-1"
source = {
  -- the archive of tag v0.2.0 (git archive --prefix=cudalua-0.2.0/), which tools/release.sh
  -- makes next to this rockspec before `luarocks pack` reads it: the source rock is built
  -- offline, and holds the archive
  url = "cudalua-0.2.0.tar.gz",
  dir = "cudalua-0.2.0",
}
description = {
  summary = "CUDA for Lua 5.4: device arrays, streams, events, NVRTC kernels, graphs",
  detailed = [[
    Device arrays, pinned/mapped/managed memory, streams, events, CUDA C++ kernels compiled at
    run time with NVRTC and launched with a grid/block configuration, Numba-style reduce,
    forall and random numbers, CUDA graphs, the CUDA Array Interface and a C embedding API.
    Needs the CUDA toolkit headers to build (CUDA_DIR, default /usr/local/cuda); libcuda and
    NVRTC are opened at run time.
  ]],
  license = "MIT",
}
dependencies = {
  "lua >= 5.4",
}
build = {
  type = "make",
  -- CUDA_DIR comes from the environment (the Makefile defaults it to /usr/local/cuda)
  build_variables = {
    CFLAGS = "$(CFLAGS)",
    LIBFLAG = "$(LIBFLAG)",
    LUA_INCDIR = "$(LUA_INCDIR)",
    LUA = "$(LUA)",
  },
  install_variables = {
    INST_LIBDIR = "$(LIBDIR)",
    INST_INCDIR = "$(PREFIX)/include",
    -- the job launcher's folder (a Makefile after 0.2.0 installs build/cudalua-run there; CI packs
    -- this rockspec with the sources of HEAD, and without it the launcher went to /usr/local/bin)
    INST_BINDIR = "$(BINDIR)",
  },
}
test = {
  type = "command",
  command = "make test",
}
