"""The layout holds: one home per concern, no import cycles, no private names across modules.

Every rule reads the source with `ast` (nothing is imported), and each has a twin that plants a
violation in a snippet and watches the rule catch it, so a green run is never vacuous. One check
runs code: two runners in one process, one with a planted bug and one without, and only the first
misbehaves (planted bugs are values of a configuration, never process state).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]


def package_links() -> dict[str, str]:
    """Folder -> import name, read off the tree: `ttmirror/` holds a link to each top-level
    package folder (ttmirror/model -> ../model), so the links are the mapping."""
    out = {"ttmirror": "ttmirror"}
    for link in sorted((ROOT / "ttmirror").iterdir()):
        if link.is_symlink() and (link / "__init__.py").is_file():
            out[str(link.resolve().relative_to(ROOT))] = f"ttmirror.{link.name}"
    return out


PACKAGES = package_links()
SCRIPTS = ("tests", "benchmarks")
"""Folders of code that no package imports; held to the private-name rule too."""


@dataclass(frozen=True)
class Import:
    module: str
    """The module imported from (absolute), e.g. ``ttmirror.emulator.routing``."""
    names: tuple[str, ...]
    """The names taken from it (empty for ``import x.y``)."""
    line: int
    type_only: bool
    """Under ``if TYPE_CHECKING:``: no import at run time."""


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = list(rel.with_suffix("").parts)
    base = PACKAGES.get(parts[0], parts[0])
    rest = parts[1:]
    if rest and rest[-1] == "__init__":
        rest = rest[:-1]
    return ".".join([base, *rest])


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


def sources() -> dict[str, tuple[Path, str]]:
    """Module name -> (path, source) for every Python file of the project."""
    out = {}
    for folder in (*PACKAGES, *SCRIPTS):
        for path in sorted((ROOT / folder).rglob("*.py")):
            out[module_name(path)] = (path, path.read_text())
    return out


def import_graph(modules: dict[str, tuple[Path, str]]) -> nx.DiGraph:
    """Run-time imports between the project's package modules (type-only imports left out)."""
    graph = nx.DiGraph()
    for name, (path, source) in modules.items():
        if name.split(".")[0] != "ttmirror":
            continue
        graph.add_node(name)
        for imp in imports(source, name, is_package=path.name == "__init__.py"):
            if imp.type_only:
                continue
            targets = [f"{imp.module}.{n}" for n in imp.names if f"{imp.module}.{n}" in modules]
            if len(targets) < len(imp.names) or not imp.names:
                targets.append(imp.module)  # names defined in the module itself
            graph.add_edges_from((name, t) for t in targets if t in modules and t != name)
    return graph


def test_no_module_imports_a_private_name_of_another() -> None:
    modules = sources()
    found = [hit for name, (_, source) in modules.items() for hit in private_imports(source, name)]
    assert found == []


def test_the_private_name_rule_catches_a_planted_import() -> None:
    planted = "from .cli import UsageError, _bounds\nimport ttmirror._secret\n"
    assert private_imports(planted, "ttmirror.cli_conformance") == [
        "ttmirror.cli_conformance:1 imports _bounds from ttmirror.cli",
        "ttmirror.cli_conformance:2 imports _secret from ttmirror._secret",
    ]
    assert private_imports("from __future__ import annotations\n", "x") == []


def test_no_import_cycles() -> None:
    graph = import_graph(sources())
    assert graph.number_of_edges() > 100  # the graph really holds the project's imports
    assert list(nx.simple_cycles(graph)) == []


def test_the_cycle_rule_catches_a_planted_cycle() -> None:
    modules = sources()
    cli_path, cli_source = modules["ttmirror.cli"]
    planted = dict(modules)
    # What the CLI once did: a plugin importing from `cli`, which imports the plugin.
    path, source = modules["ttmirror.cli_serving"]
    planted["ttmirror.cli_serving"] = (path, source + "\nfrom .cli import main\n")
    cycles = list(nx.simple_cycles(import_graph(planted)))
    assert ["ttmirror.cli", "ttmirror.cli_serving"] in [sorted(c) for c in cycles]
    assert "from . import (" in cli_source and "    cli_serving,\n" in cli_source
    assert cli_path.exists()


def test_the_mirror_never_imports_the_serving_engine() -> None:
    graph = import_graph(sources())
    mirror = [n for n in graph if n.startswith("ttmirror.impl")]
    assert "ttmirror.impl.runner" in mirror and "ttmirror.impl.devices" in mirror
    for name in mirror:
        reached = nx.descendants(graph, name)
        assert not any(r.startswith("ttmirror.serving") for r in reached), name
        assert not any(r.startswith(("ttmirror.model", "ttmirror.conformance")) for r in reached)
    # The twin: the serving engine does import the mirror, so the graph can see the edge.
    engine = nx.descendants(graph, "ttmirror.serving.engine")
    assert any(r.startswith("ttmirror.impl") for r in engine)


CHIP_SIDE = ("ttmirror.impl", "ttmirror.serving")
"""What would run beside a chip: the mirror and the serving engine over it."""


def emulator_reached(modules: dict[str, tuple[Path, str]]) -> list[str]:
    """Every chip-side module that imports the emulator, or imports what does (type-only
    imports included: a reader of the chip path should not need the emulator either)."""
    graph = nx.DiGraph()
    for name, (path, source) in modules.items():
        for imp in imports(source, name, is_package=path.name == "__init__.py"):
            graph.add_edge(name, imp.module)
    found = []
    for name in modules:
        if name.startswith(CHIP_SIDE) and name in graph:
            hits = sorted(r for r in nx.descendants(graph, name)
                          if r.startswith("ttmirror.emulator"))
            if hits:
                found.append(f"{name} reaches {', '.join(hits)}")
    return found


def test_the_mirror_and_the_serving_engine_reach_nothing_of_the_emulator() -> None:
    modules = sources()
    assert {"ttmirror.impl.tt_backend", "ttmirror.serving.backend",
            "ttmirror.emulator.entry"} <= set(modules)
    assert emulator_reached(modules) == []
    # The emulator does plug in: its entry points name it, and it imports the mirror's seam.
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'emulated = "ttmirror.emulator.entry:device_process"' in pyproject
    assert 'emulated = "ttmirror.emulator.decoder:DeviceDecoder"' in pyproject


def test_the_emulator_rule_catches_a_planted_import() -> None:
    modules = sources()
    planted = dict(modules)
    path, source = modules["ttmirror.impl.ring"]  # the twin: the ring reaching for the emulator
    planted["ttmirror.impl.ring"] = (
        path, source + "\nfrom ..emulator.device import EmulatedMeshDevice\n")
    found = emulator_reached(planted)
    assert any(f.startswith("ttmirror.impl.ring reaches ttmirror.emulator") for f in found)
    # ...and whatever imports the ring reaches it too, the serving engine included.
    assert any(f.startswith("ttmirror.serving.") for f in found)


def test_the_model_is_pure_and_only_conformance_imports_model_and_mirror() -> None:
    importers: dict[str, set[str]] = {"ttmirror.model": set(), "ttmirror.impl": set()}
    for name, (_, source) in sources().items():
        touched = {imp.module for imp in imports(source, name)}
        if name.startswith("ttmirror.model"):
            assert not {t.split(".")[0] for t in touched} & {"torch", "ttnn", "numpy"}, name
        for target, found in importers.items():
            if any(t.startswith(target) for t in touched):
                found.add(".".join(name.split(".")[:2]))
    packages = {"ttmirror.model", "ttmirror.impl", "ttmirror.serving", "ttmirror.conformance"}
    both = importers["ttmirror.model"] & importers["ttmirror.impl"] & packages
    assert both == {"ttmirror.conformance"}
    assert importers["ttmirror.model"] & packages == {"ttmirror.model", "ttmirror.conformance"}


def test_only_the_entry_point_builds_an_emulated_device() -> None:
    builders = []
    for name, (_, source) in sources().items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(
                "EmulatedMeshDevice"
            ):
                builders.append(name)
    assert builders == ["ttmirror.emulator.entry"]


def test_ttnn_is_patched_only_by_the_routing_module() -> None:
    patchers = []
    pattern = re.compile(r"setattr\(\s*(ttnn|owner)\b|^\s*ttnn(\.Tensor)?\.\w+\s*=[^=]", re.M)
    for name, (_, source) in sources().items():
        if name.split(".")[0] in SCRIPTS:
            continue  # tests may monkeypatch
        if pattern.search(source):
            patchers.append(name)
    assert patchers == ["ttmirror.emulator.routing"]


def _layout_rows() -> dict[str, tuple[str, str]]:
    """README's layout table: folder -> (import name, what it holds)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Layout") :]
    rows = re.findall(r"^\| `([\w/]+)/` \|\s*([^|]*?)\s*\|\s*(.*?)\s*\|$", section, re.M)
    return {folder: (name.strip(" `"), what) for folder, name, what in rows}


def test_readme_layout_table_matches_the_tree() -> None:
    rows = _layout_rows()
    folders = {
        p.name
        for p in ROOT.iterdir()
        if p.is_dir() and not p.name.startswith((".", "_")) and not p.name.endswith(".egg-info")
    } - {"out", "build"}
    assert {f for f in rows if "/" not in f} == folders
    for folder, (name, _) in rows.items():
        assert (ROOT / folder).is_dir(), folder
        if name:
            assert module_name(ROOT / folder / "__init__.py") == name


@pytest.mark.parametrize("folder", ["impl", "emulator", "serving"])
def test_readme_names_every_module_of_the_core_packages(folder: str) -> None:
    what = _layout_rows()[folder][1]
    modules = sorted(p.name for p in (ROOT / folder).glob("*.py") if p.name != "__init__.py")
    assert len(modules) >= 8
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
    import ttnn

    from ttmirror.conformance.planted import overrides
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
            ttnn.close_mesh_device(d)


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


# --- validating a recorded run needs the model and the events only -------------------------------

VALIDATION = ("ttmirror.conformance.validate", "ttmirror.conformance.itf")
NOT_FOR_VALIDATION = ("ttmirror.impl.runner", "ttmirror.impl.tt_backend", "ttmirror.emulator",
                      "ttmirror.conformance.lockstep", "ttmirror.serving", "torch", "ttnn")
"""What checking a recorded run must not load: the runner, any device, the lockstep."""


def validation_reaches(modules: dict[str, tuple[Path, str]]) -> list[str]:
    graph = nx.DiGraph()
    for name, (path, source) in modules.items():
        for imp in imports(source, name, is_package=path.name == "__init__.py"):
            if not imp.type_only:
                graph.add_edge(name, imp.module)
                graph.add_edges_from((name, f"{imp.module}.{n}") for n in imp.names)
    reached = set().union(*(nx.descendants(graph, v) | {v} for v in VALIDATION if v in graph))
    return sorted(r for r in reached if r.startswith(NOT_FOR_VALIDATION))


def test_validation_imports_only_the_model_and_the_recorded_events() -> None:
    modules = sources()
    assert validation_reaches(modules) == []
    # The twin: what validate once did, taking the model's step function from the lockstep.
    planted = dict(modules)
    path, source = modules["ttmirror.conformance.validate"]
    planted["ttmirror.conformance.validate"] = (path, source + "\nfrom .lockstep import take\n")
    assert "ttmirror.impl.runner" in validation_reaches(planted)


def test_ttmirror_validate_loads_no_runner(tmp_path: Path) -> None:
    """The command itself, in a fresh interpreter, on a real recorded run."""
    import subprocess
    import sys

    from ttmirror.conformance.itf import write_events
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
             "'ttmirror.impl.runner', 'ttmirror.emulator', 'ttmirror.conformance.lockstep')))); "
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
