"""`benchmarks.cache_pack`: Triton cache folders packed into parts of bounded size and unpacked
elsewhere hold what a launch loads, pointed at where they now lie."""

import io
import json
import lzma
import os
import tarfile
from pathlib import Path

import pytest

from benchmarks import cache_pack


def _entry(cache: Path, key: str, name: str, size: int = 3000) -> None:
    """A cache entry as Triton writes one: the machine code, its metadata, intermediates and a
    group file naming them all by absolute path."""
    d = cache / key
    d.mkdir(parents=True)
    children = {}
    for suffix in (".cubin", ".json", ".ptx", ".ttir"):
        path = d / f"{name}{suffix}"
        path.write_bytes(os.urandom(size))  # incompressible: the pack needs several parts
        children[path.name] = str(path)
    (d / f"__grp__{name}.json").write_text(json.dumps({"child_paths": children}))


def _cache(root: Path, name: str, keys: list[str]) -> Path:
    cache = root / name
    for key in keys:
        _entry(cache, key, "_scan_kernel")
    launcher = cache / "LAUNCHER" / "cuda_utils.so"  # not an entry: kept as it is
    launcher.parent.mkdir(parents=True, exist_ok=True)
    launcher.write_bytes(b"\x7fELF" + os.urandom(100))
    return cache


def _files(folder: Path) -> dict[str, bytes]:
    return {str(f.relative_to(folder)): f.read_bytes() for f in folder.rglob("*")
            if f.is_file() and not f.name.startswith("__grp__")}


def test_packs_in_bounded_parts_and_unpacks_what_a_launch_loads_pointed_where_it_lies(tmp_path):
    a = _cache(tmp_path / "src", ".triton_cache_a", ["K1", "K2", "K3"])
    b = _cache(tmp_path / "src", ".triton_cache_b", ["K4"])
    limit_mib = 8 / 1024
    parts = cache_pack.pack(tmp_path / "out" / "pk", [a, b], part_mib=limit_mib)
    assert [p.name for p in parts] == [f"pk.{i:02d}" for i in range(len(parts))]
    assert len(parts) > 1 and all(p.stat().st_size <= limit_mib * 2**20 for p in parts)
    # The sources were pruned to what a launch loads.
    assert not list(a.rglob("*.ptx")) and not list(a.rglob("*.ttir"))

    got = cache_pack.unpack(tmp_path / "out" / "pk", tmp_path / "dst")
    assert got == {".triton_cache_a": (3, pytest.approx(cache_pack.relocate(a)[1])),
                   ".triton_cache_b": (1, pytest.approx(cache_pack.relocate(b)[1]))}
    for src in (a, b):
        dst = tmp_path / "dst" / src.name
        assert _files(dst) == _files(src)
        assert not list(dst.rglob("*.ptx"))
        for group in dst.glob("*/__grp__*.json"):
            paths = json.loads(group.read_text())["child_paths"]
            assert sorted(paths) == ["_scan_kernel.cubin", "_scan_kernel.json"]
            assert all(Path(p).parent == group.parent.resolve() and Path(p).is_file()
                       for p in paths.values())


def test_unpack_merges_into_a_cache_already_there_and_a_new_pack_replaces_old_parts(tmp_path):
    stem = tmp_path / "pk"
    first = cache_pack.pack(stem, [_cache(tmp_path / "one", "c", ["K1"])], part_mib=2 / 1024)
    assert len(first) > 2
    # Packed again into fewer parts: none of the first pack's is left to join.
    second = cache_pack.pack(stem, [_cache(tmp_path / "two", "c", ["K2"])], part_mib=1)
    assert second == [tmp_path / "pk.00"] and cache_pack.part_paths(stem) == second
    cache_pack.unpack(stem, tmp_path / "dst")
    cache_pack.pack(stem, [tmp_path / "one" / "c"])
    assert cache_pack.unpack(stem, tmp_path / "dst") == {"c": (2, pytest.approx(
        sum(f.stat().st_size for f in (tmp_path / "dst" / "c").rglob("*") if f.is_file())))}
    assert {d.name for d in (tmp_path / "dst" / "c").iterdir()} == {"K1", "K2", "LAUNCHER"}


def test_gzip_packs_unpack_alike_and_a_truncated_pack_is_refused(tmp_path):
    cache = _cache(tmp_path / "src", "c", ["K1", "K2"])
    parts = cache_pack.pack(tmp_path / "pk", [cache], part_mib=4 / 1024, use_gzip=True)
    assert parts[0].read_bytes()[:2] == b"\x1f\x8b"  # gzip's magic
    assert cache_pack.unpack(tmp_path / "pk", tmp_path / "dst")["c"][0] == 2
    assert _files(tmp_path / "dst" / "c") == _files(cache)
    # The last part cut short: the stream ends inside a member.
    parts[-1].write_bytes(parts[-1].read_bytes()[:100])
    with pytest.raises(SystemExit, match="cache_pack unpack: "):
        cache_pack.main(["unpack", str(tmp_path / "pk"), "--into", str(tmp_path / "again")])


def test_refuses_missing_parts_folders_and_names(tmp_path):
    cache = _cache(tmp_path, "c", ["K1"])
    with pytest.raises(FileNotFoundError, match="no pack"):
        cache_pack.part_paths(tmp_path / "pk")
    parts = cache_pack.pack(tmp_path / "pk", [cache], part_mib=2 / 1024)
    parts[1].unlink()
    with pytest.raises(FileNotFoundError, match="are not pk.00 to"):
        cache_pack.unpack(tmp_path / "pk", tmp_path / "dst")
    assert not (tmp_path / "dst").exists()
    with pytest.raises(ValueError, match="distinct names"):
        cache_pack.pack(tmp_path / "pk", [cache, tmp_path / "x" / "c"])
    with pytest.raises(FileNotFoundError, match="no cache folder"):
        cache_pack.pack(tmp_path / "pk", [tmp_path / "absent"])
    with pytest.raises(ValueError, match="more than 0 MiB"):
        cache_pack.pack(tmp_path / "pk", [cache], part_mib=0)
    with pytest.raises(ValueError, match="at least one"):
        cache_pack.pack(tmp_path / "pk", [])


def test_refuses_a_pack_whose_members_leave_the_folder(tmp_path):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("../outside.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    (tmp_path / "pk.00").write_bytes(lzma.compress(raw.getvalue()))
    with pytest.raises(tarfile.TarError):
        cache_pack.unpack(tmp_path / "pk", tmp_path / "dst")
    assert not (tmp_path / "outside.txt").exists()


def test_cli_reports_parts_and_folders_and_exits_with_the_reason(tmp_path, capsys):
    cache = _cache(tmp_path, "c", ["K1", "K2"])
    cache_pack.main(["pack", str(tmp_path / "pk"), str(cache)])
    assert "pk: 1 parts" in capsys.readouterr().out
    cache_pack.main(["unpack", str(tmp_path / "pk"), "--into", str(tmp_path / "dst")])
    assert "c: 2 cache entries" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="cache_pack unpack: no pack"):
        cache_pack.main(["unpack", str(tmp_path / "nothing")])
