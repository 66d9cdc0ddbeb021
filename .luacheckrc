-- luacheck (Debian lua-check): `luacheck .` from the repository root; CI runs it
std = "lua54"
max_line_length = 140
exclude_files = { ".devlua/**", ".scratch/**", "build/**", "docs/**" }
-- specs, benches and tools drop references on purpose (`x = nil` before collectgarbage) and
-- keep locals alive for the collector to see (311, 211); spec messages are long strings
files["spec"] = { std = "+busted", max_line_length = false, ignore = { "311", "211" } }
files["bench"] = { ignore = { "311", "211/a", "211/t", "211/l" } }
files["tools/fuzz.lua"] = { ignore = { "311", "212/w", "231" } }
-- run by examples/embed/host.c, which sets these globals
files["examples/embed/script.lua"] = { read_globals = { "buf", "stream", "job" }, globals = { "owned", "dl_in", "tripled" } }
