#!/bin/sh
# tools/release.sh [OUTDIR]: the source rock of the versioned rockspec, made offline. The
# source archive is `git archive` of tag v$VERSION (of HEAD when there is no such tag, as in CI),
# put next to a copy of rockspecs/cudalua-$VERSION-1.rockspec; `luarocks pack` then reads it
# and writes cudalua-$VERSION-1.src.rock into OUTDIR (default: build/release). Installing that
# rock needs no network: `luarocks install --tree T OUTDIR/cudalua-$VERSION-1.src.rock`.
set -e
cd "$(dirname "$0")/.."
spec=$(ls rockspecs/cudalua-*-1.rockspec | sort -V | tail -1)
version=$(sed -n 's/^version = "\(.*\)-1"/\1/p' "$spec")
out=${1:-build/release}
mkdir -p "$out"
out=$(cd "$out" && pwd)
ref=HEAD
git rev-parse -q --verify "refs/tags/v$version" >/dev/null && ref="v$version"
git archive --format=tar.gz --prefix="cudalua-$version/" -o "$out/cudalua-$version.tar.gz" "$ref"
# luarocks pack reads a relative url from a temporary folder of its own: the copy it packs
# names the archive by its absolute path (installing the rock never fetches it again)
sed "s|^  url = \"cudalua-$version.tar.gz\",|  url = \"file://$out/cudalua-$version.tar.gz\",|" "$spec" >"$out/$(basename "$spec")"
(cd "$out" && luarocks --lua-version=5.4 pack "$(basename "$spec")" >/dev/null)
echo "$out/cudalua-$version-1.src.rock (from $ref)"
