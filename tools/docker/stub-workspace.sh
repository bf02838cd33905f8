#!/bin/sh
# The Dockerfile's dependency layer holds the workspace's manifests and no sources. Cargo will not
# load a workspace whose members declare targets that do not exist, so this gives every member an
# empty src/main.rs and src/lib.rs, and every [[bin]], [[test]], [[bench]] and [[example]] it
# declares an empty file at its path (the one given, or Cargo's default for the name). The layer
# then builds the dependencies alone; the sources replace the stubs in the next layer.
set -eu
members=$(sed -n '/^members *=/{s/.*\[\(.*\)\].*/\1/;s/[",]/ /g;p;}' Cargo.toml)
[ -n "$members" ] || { echo "stub-workspace: no members in Cargo.toml" >&2; exit 1; }
for crate in $members; do
  [ -f "$crate/Cargo.toml" ] || { echo "stub-workspace: $crate/Cargo.toml was not copied" >&2; exit 1; }
  mkdir -p "$crate/src"
  echo 'fn main() {}' > "$crate/src/main.rs"
  : > "$crate/src/lib.rs"
  awk '
    function flush() {
      if (kind == "") return
      if (path == "") path = (kind == "bin" ? "src/bin/" : kind == "test" ? "tests/" : kind == "bench" ? "benches/" : "examples/") name ".rs"
      print path
    }
    /^\[\[(bin|test|bench|example)\]\]/ { flush(); kind = $0; gsub(/[][]/, "", kind); name = ""; path = ""; next }
    /^\[/ { flush(); kind = ""; next }
    kind != "" && /^name *=/ { name = $0; sub(/^name *= *"/, "", name); sub(/".*/, "", name) }
    kind != "" && /^path *=/ { path = $0; sub(/^path *= *"/, "", path); sub(/".*/, "", path) }
    END { flush() }
  ' "$crate/Cargo.toml" | while read -r target; do
    mkdir -p "$crate/$(dirname "$target")"
    [ -s "$crate/$target" ] || echo 'fn main() {}' > "$crate/$target"
  done
done
