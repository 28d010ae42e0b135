"""Triton caches packed into a few compressed parts, so that kernels compiled on one machine
travel to the next GPU call: carried in (a call's working tree is limited in size) or brought
back from a call's output folder (a few files of limited size each).

A GPU call spends most of its time compiling when its kernels are new to it: the mixed
workload's engine compiles for ~200-320 s before its first step, and each sampler GPU test
shard for 180-400 s. Triton keys each cache entry by the kernel's source and the compiler, so
a cache built once answers every later call of the same kernels, on any machine with the same
Triton and GPU architecture (H100 and H200 are both sm_90), whatever else changed.

    python3 -m benchmarks.cache_pack pack STEM DIR... [--preset 1] [--gzip] [--part-mib 15]
    python3 -m benchmarks.cache_pack unpack STEM [--into DIR]

`pack` prunes each cache folder to what a launch loads (`relocate`) and writes one tar.xz of
them (tar.gz with `--gzip`, or where Python lacks `lzma`), cut into parts `STEM.00`,
`STEM.01`, ... of at most `--part-mib` each; each folder is stored under its own name.
`unpack` joins the parts, extracts the folders into `--into` (default: here), merging into
folders already there (entries are named by their keys), and points their entries at where
they now lie. xz at preset 1 packs the sampler caches ~6x in seconds; preset 6 a third
smaller again, ten times slower (for packs built ahead, not on a GPU's time).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import sys
import tarfile
from pathlib import Path

try:
    import lzma
except ImportError:  # a Python built without it: packs are gzipped, which every build reads
    lzma = None

# What a launch loads from a cache entry: the metadata and the machine code (`CompiledKernel`).
KEPT_SUFFIXES = (".json", ".cubin")
PART_MIB = 15  # a call brings back files of up to 16 MiB
# What a broken or truncated pack raises.
_ERRORS = (OSError, ValueError, EOFError, tarfile.TarError) + ((lzma.LZMAError,) if lzma else ())


def relocate(cache_dir: Path) -> tuple[int, int]:
    """Point every cache entry's group file at `cache_dir` and delete the files a launch does not
    load; returns (entries, bytes left). Files outside entries (the launchers' modules) stay."""
    entries = 0
    for group in cache_dir.glob("*/__grp__*.json"):
        children = json.loads(group.read_text())["child_paths"]
        kept = {}
        for name in children:
            path = group.parent / name
            if path.suffix in KEPT_SUFFIXES:
                kept[name] = str(path.resolve())
            else:
                path.unlink(missing_ok=True)
        group.write_text(json.dumps({"child_paths": kept}))
        entries += 1
    size = sum(f.stat().st_size for f in cache_dir.rglob("*") if f.is_file())
    return entries, size


class _Parts(io.RawIOBase):
    """Write side: a stream cut into files `stem.00`, `stem.01`, ... of at most `limit` bytes."""

    def __init__(self, stem: Path, limit: int):
        self.stem, self.limit, self.paths, self._file, self._left = stem, limit, [], None, 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data)
        while view:
            if self._left == 0:
                self._next()
            n = min(self._left, len(view))
            self._file.write(view[:n])
            self._left -= n
            view = view[n:]
        return len(data)

    def _next(self) -> None:
        if self._file is not None:
            self._file.close()
        path = self.stem.with_name(f"{self.stem.name}.{len(self.paths):02d}")
        self._file, self._left = open(path, "wb"), self.limit
        self.paths.append(path)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        super().close()


def part_paths(stem: Path) -> list[Path]:
    """The parts of a pack, in order; raises if there are none or one is missing."""
    found = sorted(stem.parent.glob(f"{stem.name}.[0-9][0-9]"))
    if not found:
        raise FileNotFoundError(f"no pack {stem}.00")
    expected = [stem.with_name(f"{stem.name}.{i:02d}") for i in range(len(found))]
    if found != expected:
        raise FileNotFoundError(f"pack {stem}: parts {[p.name for p in found]} are not "
                                f"{stem.name}.00 to .{len(found) - 1:02d}")
    return found


def _remove_parts(stem: Path) -> None:
    for old in stem.parent.glob(f"{stem.name}.[0-9][0-9]"):
        old.unlink()


def pack(stem: Path, dirs: list[Path], preset: int = 1, part_mib: float = PART_MIB,
         use_gzip: bool = False) -> list[Path]:
    """Prune each cache folder and write them all as parts of one tar.xz (tar.gz with
    `use_gzip` or without `lzma`); returns the parts."""
    if not dirs:
        raise ValueError("name at least one cache folder")
    if not part_mib > 0:
        raise ValueError(f"parts must hold more than 0 MiB, not {part_mib}")
    names = [d.resolve().name for d in dirs]
    if len(set(names)) != len(names):
        raise ValueError(f"cache folders must have distinct names, not {names}")
    missing = [str(d) for d in dirs if not d.is_dir()]
    if missing:
        raise FileNotFoundError(f"no cache folder {', '.join(missing)}")
    for d in dirs:
        relocate(d)
    stem.parent.mkdir(parents=True, exist_ok=True)
    _remove_parts(stem)
    parts = _Parts(stem, int(part_mib * 2**20))
    if use_gzip or lzma is None:
        compressed = gzip.GzipFile(fileobj=parts, mode="wb", compresslevel=max(preset, 1))
    else:
        compressed = lzma.open(parts, "wb", preset=preset)
    with compressed, tarfile.open(fileobj=compressed, mode="w|") as tar:
        for d, name in zip(dirs, names):
            tar.add(d, arcname=name)
    parts.close()
    return parts.paths


class _Joined(io.RawIOBase):
    """Read side: the parts of a pack as one stream."""

    def __init__(self, paths: list[Path]):
        self._paths, self._file = list(paths), None

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while True:
            if self._file is None:
                if not self._paths:
                    return 0
                self._file = open(self._paths.pop(0), "rb")
            n = self._file.readinto(buf)
            if n:
                return n
            self._file.close()
            self._file = None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        super().close()


def unpack(stem: Path, into: Path = Path(".")) -> dict[str, tuple[int, int]]:
    """Extract a pack's cache folders into `into` and point their entries there; returns
    {folder: (entries, bytes)}."""
    paths = part_paths(stem)
    into.mkdir(parents=True, exist_ok=True)
    folders = set()
    # "r|*": the compression (xz or gzip) is read from the stream.
    with _Joined(paths) as joined, tarfile.open(fileobj=joined, mode="r|*") as tar:
        for member in tar:
            folders.add(Path(member.name).parts[0])
            # The data filter refuses absolute paths, links out of `into` and device files.
            tar.extract(member, into, filter="data")
    return {name: relocate(into / name) for name in sorted(folders)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("pack", help="prune cache folders and pack them into parts STEM.NN")
    p.add_argument("stem", type=Path)
    p.add_argument("dirs", type=Path, nargs="+")
    p.add_argument("--preset", type=int, default=1, choices=range(10))
    p.add_argument("--gzip", action="store_true", help="gzip instead of xz")
    p.add_argument("--part-mib", type=float, default=PART_MIB)
    u = verbs.add_parser("unpack", help="extract a pack's cache folders and point them there")
    u.add_argument("stem", type=Path)
    u.add_argument("--into", type=Path, default=Path("."))
    opts = parser.parse_args(argv)
    try:
        if opts.verb == "pack":
            paths = pack(opts.stem, opts.dirs, opts.preset, opts.part_mib, opts.gzip)
            size = sum(p.stat().st_size for p in paths)
            print(f"{opts.stem}: {len(paths)} parts, {size / 2**20:.1f} MiB")
        else:
            for name, (entries, size) in unpack(opts.stem, opts.into).items():
                print(f"{opts.into / name}: {entries} cache entries, {size / 2**20:.1f} MiB")
    except _ERRORS as e:
        sys.exit(f"cache_pack {opts.verb}: {e}")


if __name__ == "__main__":
    main()
