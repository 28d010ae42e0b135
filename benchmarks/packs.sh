# Sourced by the device-call scripts (`tip_call.sh`, `ablations/call_setup.sh`): Triton caches
# carried in and brought back as packs (`benchmarks.cache_pack`), so that what one call compiled
# the next does not compile again. Needs $OUT and $log; run from the repository root.
# To carry packs in: copy a call's $OUT/0pack_NAME.NN files to .triton_pack/NAME.NN here, carry
# .triton_pack and set PACKS=".triton_pack/NAME ..." (each unpacked into the root, where its
# cache folder lies under the name it had).

# unpack_pack STEM [INTO]: the pack STEM unpacked into INTO (default: the root), logged.
unpack_pack() {
  python3 -m benchmarks.cache_pack unpack "$1" --into "${2:-.}" >> "$log" 2>&1 \
    || echo "unpack $1 failed" >> "$log"
}

# unpack_packs: each stem of PACKS unpacked into the root.
unpack_packs() {
  local stem
  for stem in ${PACKS:-}; do unpack_pack "$stem"; done
}

# cache_entries DIR: the number of entries of the Triton cache DIR.
cache_entries() { compgen -G "$1/*/__grp__*.json" | wc -l; }

# bring_back NAME DIR BEFORE: where the cache DIR now holds more entries than BEFORE, pack it
# into $OUT/0pack_NAME.00, .01, ... (parts of at most 15 MiB: a call brings back a few files, the
# alphabetically first, of at most 16 MiB each), logged.
bring_back() {
  local now
  now=$(cache_entries "$2")
  if (( now > $3 )); then
    python3 -m benchmarks.cache_pack pack "$OUT/0pack_$1" "$2" >> "$log" 2>&1
  else
    echo "bring back $1: $now entries, none new" >> "$log"
  fi
}
