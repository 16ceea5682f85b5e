"""The layout holds: what a static import-graph tool cannot see.

The layering itself (the model pure, the mirror and the serving engine never reaching the
emulator, validation loading no runner, no import cycles) is import-linter's: the contracts in
`pyproject.toml`, run here on the tree, and on a copy of it with one violation planted per
contract. What stays here reads the source with `ast`, each rule with a twin that plants a
violation in a snippet and watches the rule catch it, so a green run is never vacuous. Two checks
run code: two runners in one process, one with a planted bug and one without, and only the first
misbehaves (planted bugs are values of a configuration, never process state); and `ttmirror
validate` in a fresh interpreter loads no runner.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "ttmirror"
SCRIPTS = ("tests", "benchmarks")
"""Folders of code that no package imports; held to the private-name rule too."""
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


@dataclass(frozen=True)
class Import:
    module: str
    """The module imported from (absolute), e.g. ``ttmirror.emulator.api``."""
    names: tuple[str, ...]
    """The names taken from it (empty for ``import x.y``)."""
    line: int
    type_only: bool
    """Under ``if TYPE_CHECKING:``: no import at run time."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC if path.is_relative_to(SRC) else ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(source: str, module: str, is_package: bool = False) -> list[Import]:
    """Every import statement of a module, relative ones resolved against `module`."""
    tree = ast.parse(source)
    type_only_lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                for sub in ast.walk(inner):
                    if hasattr(sub, "lineno"):
                        type_only_lines.add(sub.lineno)
    package = module.split(".") if is_package else module.split(".")[:-1]
    out: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out.append(Import(alias.name, (), node.lineno, node.lineno in type_only_lines))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            names = tuple(alias.name for alias in node.names)
            out.append(Import(target, names, node.lineno, node.lineno in type_only_lines))
    return out


def sources() -> dict[str, tuple[Path, str]]:
    """Module name -> (path, source) for every Python file of the project."""
    out = {}
    for folder in (PACKAGE, *(ROOT / s for s in SCRIPTS)):
        for path in sorted(folder.rglob("*.py")):
            out[module_name(path)] = (path, path.read_text())
    return out


# --- one identity per module ---------------------------------------------------------------------


def test_only_ttmirror_is_importable_from_the_project() -> None:
    """The src/ layout: from the tree's root, as a user's shell has it, `import model` finds
    nothing and `ttmirror.model.state` is one module under one name."""
    probe = ("import importlib.util as u, sys, ttmirror.model.state; "
             "print([u.find_spec(n) is not None for n in ('model', 'impl', 'conformance')], "
             "sorted(m for m in sys.modules if m.endswith('model.state')))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[False, False, False] ['ttmirror.model.state']"
    # The twin: a folder at the root holding an __init__.py imports under its own name.
    assert (ROOT / "tests" / "__init__.py").is_file()
    probe = "import importlib.util as u; print(u.find_spec('tests') is not None)"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout.strip() == "True"


def test_tests_import_under_their_own_names() -> None:
    """Every test folder is a package below `tests`, so pytest never imports one as `impl`."""
    folders = [p for p in (ROOT / "tests").rglob("*") if p.is_dir() and p.name != "__pycache__"]
    assert len(folders) >= 8
    assert [str(f) for f in folders if not (f / "__init__.py").is_file()] == []
    assert __name__ == "tests.test_layout"
    assert {p.name for p in folders} >= {"model", "impl", "emulator", "serving", "conformance"}


# --- the layering: import-linter's contracts -----------------------------------------------------


def lint_imports(root: Path, path: Path | None = None) -> tuple[int, str]:
    """`lint-imports` with `root`'s contracts, on the package found first on the path."""
    env = {**os.environ, "COLUMNS": "400"}
    if path is not None:
        env["PYTHONPATH"] = str(path)
    done = subprocess.run([str(LINT_IMPORTS), "--no-cache", "--config",
                           str(root / "pyproject.toml")], cwd=root, capture_output=True,
                          text=True, timeout=300, env=env)
    return done.returncode, done.stdout + done.stderr


CONTRACTS = {
    # the start of a contract's name -> one violation of it: (file, line appended to it)
    "The model is pure": ("model/state.py", "import ttnn"),
    "The mirror knows nothing of": ("impl/ring.py",
                                    "from ..emulator.device import EmulatedMeshDevice"),
    "The serving engine reaches the mirror": ("serving/engine.py",
                                              "from ttmirror.model import state"),
    "The emulator plugs into": ("emulator/ops.py", "from ttmirror.conformance import bugs"),
    "Validating a recorded run": ("conformance/traces/validate.py",
                                  "from ttmirror.conformance.lockstep.harness import take"),
    "No import cycles": ("cli/serving.py", "from ttmirror.cli.core import main"),
}


def contract_verdicts(output: str) -> dict[str, str]:
    found = dict(re.findall(r"^(.+?) (KEPT|BROKEN)\b", output, re.M))
    return {prefix: verdict for name, verdict in found.items() for prefix in CONTRACTS
            if name.startswith(prefix)}


def test_the_import_contracts_hold() -> None:
    code, out = lint_imports(ROOT)
    assert code == 0, out
    assert contract_verdicts(out) == dict.fromkeys(CONTRACTS, "KEPT")
    assert re.search(r"Analyzed \d{3,} files, \d{4,} dependencies", out)  # it read the tree


def test_each_import_contract_catches_its_planted_violation(tmp_path: Path) -> None:
    shutil.copytree(PACKAGE, tmp_path / "src" / "ttmirror",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    for file, line in CONTRACTS.values():
        path = tmp_path / "src" / "ttmirror" / file
        path.write_text(path.read_text() + f"\n{line}\n")
    code, out = lint_imports(tmp_path, tmp_path / "src")
    assert code == 1, out
    assert contract_verdicts(out) == dict.fromkeys(CONTRACTS, "BROKEN")


# --- what the tool cannot see --------------------------------------------------------------------


def private_imports(source: str, module: str) -> list[str]:
    """``from other import _name`` and ``import other._mod``: a private name of another module."""
    found = []
    for imp in imports(source, module):
        if imp.module == "__future__":
            continue
        parts = imp.module.split(".")
        hidden = [p for p in parts if p.startswith("_") and not p.startswith("__")]
        hidden += [n for n in imp.names if n.startswith("_") and not n.startswith("__")]
        if hidden:
            found.append(f"{module}:{imp.line} imports {', '.join(hidden)} from {imp.module}")
    return found


def test_no_module_imports_a_private_name_of_another() -> None:
    modules = sources()
    found = [hit for name, (_, source) in modules.items() for hit in private_imports(source, name)]
    assert found == []


def test_the_private_name_rule_catches_a_planted_import() -> None:
    planted = "from .arguments import UsageError, _bounds\nimport ttmirror._secret\n"
    assert private_imports(planted, "ttmirror.cli.conformance") == [
        "ttmirror.cli.conformance:1 imports _bounds from ttmirror.cli.arguments",
        "ttmirror.cli.conformance:2 imports _secret from ttmirror._secret",
    ]
    assert private_imports("from __future__ import annotations\n", "x") == []


def test_only_the_entry_point_builds_an_emulated_device() -> None:
    builders = []
    for name, (_, source) in sources().items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(
                "EmulatedMeshDevice"
            ):
                builders.append(name)
    assert builders == ["ttmirror.emulator.entry"]


PATCH = re.compile(r"setattr\(\s*ttnn\b|^\s*ttnn(\.Tensor)?\.\w+\s*=[^=]", re.M)
"""Assigning an attribute of `ttnn` or `ttnn.Tensor`."""


def test_nothing_patches_ttnn() -> None:
    patchers = [name for name, (_, source) in sources().items()
                if name.split(".")[0] not in SCRIPTS and PATCH.search(source)]
    assert patchers == []
    # The twin: the old routing's patch is caught.
    assert PATCH.search("    setattr(ttnn, name, RoutedCall(route))\n")
    assert PATCH.search("    ttnn.Tensor.to = _routed_to(ttnn.Tensor.to)\n")


def ttnn_calls(source: str) -> list[str]:
    """`ttnn.<function>(...)` calls: functions of the module called by name (types such as
    `ttnn.Shape(...)` are values and are left out)."""
    return [f"{node.lineno}: ttnn.{node.func.attr}"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "ttnn"
            and node.func.attr[:1].islower()]


def api_calls(source: str) -> set[str]:
    """The attributes the mirror takes from its ttnn API object (`tt.x`, `self.tt.x`)."""
    return {node.attr for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and ast.unparse(node.value) in ("tt", "self.tt")}


def test_the_mirror_calls_ttnn_only_through_the_api_its_provider_hands_it() -> None:
    from ttmirror.impl import api

    found, used = [], set()
    for name, (_, source) in sources().items():
        if name.startswith("ttmirror.impl."):
            used |= api_calls(source)
            if name != "ttmirror.impl.devices":  # the chip's provider: ttnn itself
                found += [f"{name}:{call}" for call in ttnn_calls(source)]
    assert found == []
    assert used - set(api.FUNCTIONS) == set()  # the protocol names everything the mirror calls
    assert {"gather", "where", "record_event", "execute_trace"} <= used
    # The twins: a direct call is caught, a call outside the protocol is seen.
    assert ttnn_calls("x = ttnn.gather(a, 3, i)\ny = ttnn.Shape([1])\n") == ["1: ttnn.gather"]
    assert api_calls("self.tt.softmax(x)\n") - set(api.FUNCTIONS) == {"softmax"}


def _layout_rows() -> dict[str, tuple[str, str]]:
    """The architecture page's layout table: folder -> (import name, what it holds)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## Layout") :]
    rows = re.findall(r"^\| `([\w/]+)/` \|\s*([^|]*?)\s*\|\s*(.*?)\s*\|$", section, re.M)
    return {folder: (name.strip(" `"), what) for folder, name, what in rows}


def test_the_layout_table_matches_the_tree() -> None:
    rows = _layout_rows()
    top = {p.name for p in ROOT.iterdir()
           if p.is_dir() and not p.name.startswith((".", "_")) and not p.name.endswith(".egg-info")}
    packages = {f"src/ttmirror/{p.name}" for p in PACKAGE.iterdir()
                if p.is_dir() and p.name != "__pycache__" and not p.name.startswith(".")}
    assert set(rows) == (top - {"out", "build", "src"}) | packages | {"src/ttmirror"}
    for folder, (name, _) in rows.items():
        assert (ROOT / folder).is_dir(), folder
        if name:
            assert module_name(ROOT / folder / "__init__.py") == name


@pytest.mark.parametrize("folder", ["impl", "emulator", "serving", "cli", "report"])
def test_the_layout_table_names_every_module_of_the_core_packages(folder: str) -> None:
    what = _layout_rows()[f"src/ttmirror/{folder}"][1]
    modules = sorted(p.name for p in (PACKAGE / folder).glob("*.py")
               if p.name not in ("__init__.py", "__main__.py"))
    assert len(modules) >= 5
    assert [m for m in modules if f"`{m}`" not in what] == []


# --- planted bugs are values ---------------------------------------------------------------------


def globals_assigned(modules: dict[str, tuple[Path, str]], prefix: str) -> list[str]:
    """`global` statements in modules under `prefix`: where process-wide state is rebound."""
    return [f"{name}:{node.lineno} global {', '.join(node.names)}"
            for name, (_, source) in modules.items() if name.startswith(prefix)
            for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Global)]


def test_the_mirror_rebinds_no_process_global() -> None:
    modules = sources()
    assert globals_assigned(modules, "ttmirror.impl") == []
    # The twin: the old switch (`planted(bug)` rebinding a module's `_active`) is caught.
    planted = dict(modules)
    path, source = modules["ttmirror.impl.overrides"]
    switch = "\n_active = None\ndef planted(bug):\n    global _active\n    _active = bug\n"
    planted["ttmirror.impl.overrides"] = (path, source + switch)
    assert globals_assigned(planted, "ttmirror.impl") == [
        f"ttmirror.impl.overrides:{source.count(chr(10)) + 4} global _active"]


def _serve_side_by_side(bug: str) -> list[list[list[int]]]:
    """Two runners in one process, each on its own emulated device, driven step for step in
    turn (so a process-wide switch would reach both): the first with `bug` planted (its
    overrides in its configuration only), the second with nothing. Each request's delivered
    ids, per runner."""

    from ttmirror.conformance.lockstep.planted import overrides
    from ttmirror.emulator import open_device
    from ttmirror.impl.runner import RunnerConfig, make_runner
    from ttmirror.impl.tt_backend import TtBackend

    devices = [open_device(num_command_queues=2, emulated=True) for _ in range(2)]
    runners = [make_runner(TtBackend(d), RunnerConfig(depth=2, slots=2, rows=2, max_tokens=4,
                                                      overrides=o))
               for d, o in zip(devices, (overrides([bug]), ()), strict=True)]
    try:
        for r in runners:
            r.allocate()
            r.arrive(0, 3)
            r.arrive(1, 5)
        while any(r.queue or r.eligible() for r in runners):
            for r in runners:
                if r.can_schedule():
                    q = r.schedule()
                    r.combine(q)
                    r.launch(q)
                    r.readback_issue(q)
                if r.queue and (len(r.queue) == r.depth or not r.can_schedule()):
                    r.readback_complete(0)
                    slot = r.queue[0].slot
                    r.apply()
                    if r.releasable(slot):
                        r.release(slot)
        return [[list(r.requests[i].delivered) for i in (0, 1)] for r in runners]
    finally:
        for r in runners:
            r.close()
        for d in devices:
            d.api.close_mesh_device(d)


@pytest.mark.parametrize("bug", ["guard-off", "gather-off-by-one"])
def test_two_runners_in_one_process_only_the_planted_one_misbehaves(bug: str) -> None:
    """A runner's bug (guard-off: the runner's books) and a mirror's (the gather index: what
    the device computes) each reach only the runner whose configuration carries it."""
    from ttmirror.impl.probe import ProbeReference, ProbeSpec

    ref = ProbeReference(ProbeSpec())
    owed = [ref.sequence(3, 4), ref.sequence(5, 4)]
    planted, clean = _serve_side_by_side(bug)
    assert clean == owed
    assert planted != owed and all(len(t) == 4 for t in planted)  # it ran, and went wrong


def test_ttmirror_validate_loads_no_runner(tmp_path: Path) -> None:
    """The command itself, in a fresh interpreter, on a real recorded run."""
    import subprocess
    import sys

    from ttmirror.conformance.traces.itf import write_events
    from ttmirror.impl.events import Event
    from ttmirror.impl.rows import Row

    trace = tmp_path / "run.json"
    write_events([
        Event("allocate", (), (("depth", 2), ("slots", 2), ("guard", True),
                               ("preempt_policy", "keep"), ("prefill_chunks", 1))),
        Event("arrive", (0,), (("prompt", 3), ("max_tokens", 2), ("host_sync", False),
                               ("prefill_chunks", 1))),
        Event("schedule", (0,), (("slot", 0), ("rows", (Row(0, 0, None),)))),
    ], trace)
    probe = ("import sys, ttmirror.cli as c; code = c.main(['validate', sys.argv[1]]); "
             "print(sorted(m for m in sys.modules if m.startswith(('torch', 'ttnn', "
             "'ttmirror.impl.runner', 'ttmirror.emulator', "
             "'ttmirror.conformance.lockstep.harness')))); "
             "sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", probe, str(trace)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("valid: 3 events")
    assert done.stdout.splitlines()[-1] == "[]"


LONGEST_PUBLIC_METHOD = 40
"""Lines a public method of the runner may take: each phase reads as one decision, the rest
(planted branches, counts, events) in helpers beside it."""


def long_public_methods(source: str, cls: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for f in node.body:
                if (isinstance(f, ast.FunctionDef) and not f.name.startswith("_")
                        and (n := f.end_lineno - f.lineno + 1) > LONGEST_PUBLIC_METHOD):
                    out.append(f"{cls}.{f.name}: {n} lines")
    return out


def test_no_public_method_of_the_runner_is_longer_than_forty_lines() -> None:
    _, source = sources()["ttmirror.impl.runner"]
    assert "def schedule(" in source and long_public_methods(source, "Runner") == []
    body = "".join(f"        x{i} = {i}\n" for i in range(LONGEST_PUBLIC_METHOD))
    planted = f"class Runner:\n    def schedule(self):\n{body}    def _helper(self):\n{body}"
    assert long_public_methods(planted, "Runner") == [
        f"Runner.schedule: {LONGEST_PUBLIC_METHOD + 1} lines"]


LONGEST_FUNCTION = 80
"""Lines any function outside tests/ may take."""


def long_functions(source: str, name: str) -> list[str]:
    return [f"{name}:{node.lineno} {node.name}: {n} lines"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and (n := node.end_lineno - node.lineno + 1) > LONGEST_FUNCTION]  # type: ignore[operator]


def test_no_function_outside_the_tests_is_longer_than_eighty_lines() -> None:
    found, read = [], 0
    for folder in ("src", "benchmarks", "vllm_bridge", "docs"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            found += long_functions(path.read_text(), str(path.relative_to(ROOT)))
            read += 1
    assert read > 120 and found == []
    body = "".join(f"    x{i} = {i}\n" for i in range(LONGEST_FUNCTION))
    assert long_functions(f"def f():\n{body}def g():\n    pass\n", "m") == [
        f"m:1 f: {LONGEST_FUNCTION + 1} lines"]
