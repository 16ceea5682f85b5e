"""The package as a user gets it: built without warnings, installed without the source tree,
and followed by static tools.

- `make setup` installs the project editable; setuptools prints no warning doing so (a planted
  twin, a deprecated setting, makes it print one).
- A non-editable install (the wheel, into a fresh venv) runs `check`, `report` and `replay` on a
  trace it ships, with the source tree nowhere on its path: specs, manifest, regression traces
  and the review site's assets come from the package (`ttmirror/resources.py`).
- The wheel carries every file of the package the tree tracks (code and data alike).
- mypy, run on one file outside the tree, finds `ttmirror.model.state` (the editable install is
  a static path entry: `src/`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
LOCATION_NOTE = "WARNING: Location '"
"""This machine's pip configuration names index folders that are absent; pip says so, once per
package looked up. That is pip's line about the machine, not the project's."""


def copy_tree(to: Path) -> Path:
    """The checkout as a fresh clone has it (tracked files and untracked ones git does not
    ignore, links kept as links), so building never writes into the source tree."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source, target = ROOT / name, to / name
        if not source.is_symlink() and not source.exists():
            continue  # deleted in the working tree, not yet in the index
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
    return to


def pip(*args: str, cwd: Path) -> list[str]:
    """pip's output lines, less this machine's index notes; fails the test if pip fails."""
    done = subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, capture_output=True,
                          text=True)
    lines = [line for line in (done.stdout + done.stderr).splitlines()
             if not line.startswith(LOCATION_NOTE)]
    assert done.returncode == 0, "\n".join(lines[-30:])
    return lines


def warnings_in(lines: list[str]) -> list[str]:
    return [line for line in lines if "warning" in line.lower() or line.strip() == "!!"]


def editable_install_output(tree: Path, target: Path) -> list[str]:
    """What `make setup`'s `pip install -e .` prints, without the dependencies."""
    return pip("install", "-q", "--no-deps", "--no-build-isolation", "-e", ".", "--target",
               str(target), cwd=tree)


def test_setup_prints_no_packaging_warning(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path / "tree")
    assert warnings_in(editable_install_output(tree, tmp_path / "site")) == []
    # The src/ layout: the path entry is `src/`, never the tree's root (where `tests/` and the
    # Makefile live), so only `ttmirror.*` imports from it.
    assert (tmp_path / "site" / "__editable__.ttmirror-0.1.0.pth").read_text().strip() == str(
        (tree / "src").resolve())


def test_the_warning_check_sees_a_deprecated_setting(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path / "tree")
    pyproject = tree / "pyproject.toml"
    text = pyproject.read_text()
    assert 'license = "Apache-2.0"' in text
    # The twin: the license as a TOML table, which setuptools >= 77 warns is deprecated.
    pyproject.write_text(text.replace('license = "Apache-2.0"', 'license = {text = "Apache-2.0"}'))
    found = warnings_in(editable_install_output(tree, tmp_path / "site"))
    assert any("license" in line.lower() for line in found), found


def _site_packages(venv: Path) -> Path:
    return Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this tree, built from a copy of it."""
    tmp = tmp_path_factory.mktemp("wheel")
    tree = copy_tree(tmp / "tree")
    pip("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), ".",
        cwd=tree)
    shutil.rmtree(tree)
    return next((tmp / "dist").glob("ttmirror-*.whl"))


def test_the_wheel_carries_every_file_of_the_package(wheel: Path) -> None:
    tracked = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "src/ttmirror"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    want = {str(Path(f).relative_to("src")) for f in tracked if (ROOT / f).is_file()}
    with zipfile.ZipFile(wheel) as z:
        got = {n for n in z.namelist() if n.startswith("ttmirror/")}
    assert len(want) > 150 and "ttmirror/specs/regressions/guard-off.itf.json" in want
    assert want - got == set()  # every module and data file (specs, traces, assets) ships
    assert {n for n in got - want if not n.endswith(".pyc")} == set()


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """A fresh venv holding the wheel of this tree; its dependencies are the dev venv's (a
    .pth file names that venv's site-packages: a plain path entry, so the dev venv's editable
    install is not processed), so no torch is downloaded."""
    tmp = tmp_path_factory.mktemp("installed")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = _site_packages(venv)
    (site / "dev_dependencies.pth").write_text(
        str(Path(sysconfig.get_path("purelib"))) + "\n")
    pip("--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps", str(wheel),
        cwd=tmp)
    return venv  # nothing of the source tree is on its path to fall back on


def run_installed(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(venv / "bin" / "ttmirror"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_the_installed_package_is_the_wheel_not_the_tree(installed: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(installed / "bin" / "python"), "-c",
         "import json, sys, ttmirror.model.state as s, ttmirror.resources as r; "
         "print(json.dumps([s.__file__, str(r.SPEC), sys.path]))"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    module, spec, path = json.loads(done.stdout)
    site = str(_site_packages(installed))
    assert module.startswith(site) and spec.startswith(site)
    assert not any(Path(p).resolve() == ROOT for p in path if p)


def test_a_non_editable_install_runs_check_report_and_replay(installed: Path,
                                                            tmp_path: Path) -> None:
    check = run_installed(installed, "check", "--json", cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    ours = subprocess.run([str(VENV_BIN / "ttmirror"), "check", "--json"], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    got, want = json.loads(check.stdout), json.loads(ours.stdout)
    for key in ("states", "transitions", "invariants", "sometimes", "deadlocks"):
        assert got[key] == want[key], key

    report = run_installed(installed, "report", "-o", str(tmp_path / "site"), "--no-tlc",
                           "--fuzz-seconds", "1", "--requests", "1", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    index = (tmp_path / "site" / "index.html").read_text()
    assert "Device-mirrored sampled ids on Tenstorrent" in index  # the shipped spec, rendered
    assert "deliver-dropped" in index  # a shipped regression trace's step table
    assert {p.name for p in (tmp_path / "site").iterdir()} >= {"index.html", "review.js",
                                                                "review.css"}

    site = _site_packages(installed)
    trace = site / "ttmirror" / "specs" / "regressions" / "deliver-dropped.itf.json"
    conforms = run_installed(installed, "replay", str(trace), cwd=tmp_path)
    assert conforms.returncode == 0, conforms.stderr
    assert "conforms" in conforms.stdout
    planted = run_installed(installed, "replay", str(trace), "--bug", "deliver-dropped",
                            cwd=tmp_path)
    assert planted.returncode == 1, planted.stderr
    assert "reproduces the failure" in planted.stdout


def mypy_on(source: str, folder: Path) -> str:
    (folder / "uses_ttmirror.py").write_text(source)
    done = subprocess.run([str(VENV_BIN / "mypy"), "--no-incremental", "uses_ttmirror.py"],
                          cwd=folder, capture_output=True, text=True)
    return done.stdout + done.stderr


def test_mypy_on_one_file_finds_the_model(tmp_path: Path) -> None:
    out = mypy_on("from ttmirror.model.state import Bounds\nreveal_type(Bounds().depth)\n",
                  tmp_path)
    assert re.search(r'Revealed type is "(builtins\.)?int"', out), out
    assert "error" not in out, out
    # The twin: a module that does not exist is reported, so the check above can fail.
    out = mypy_on("import ttmirror.model.no_such_module\n", tmp_path)
    assert "Cannot find implementation or library stub" in out, out
