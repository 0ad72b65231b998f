"""The package as a user installs it beside their own stack: its declared dependencies are ranges
(the exact versions `make` installs live in constraints.txt, inside those ranges), and the wheel
``pip wheel`` builds imports and runs ``cosparse --help`` from a fresh venv, away from the checkout.

Everything here works without network. The wheel is built with ``--no-build-isolation`` (the
setuptools of the interpreter running the tests) from a copy of the sources in a temporary folder,
so no ``build/`` or ``*.egg-info`` lands in the checkout, and installed with ``--no-index --no-deps``
into a venv made from the base interpreter (``sys._base_executable``) before it can see anything
else. Only then does a ``.pth`` file in its site-packages name the test interpreter's site-packages
folders, where torch, numpy, numba, pyzmq... are: a folder named in a ``.pth`` file is appended to
``sys.path`` after the venv's own site-packages (which holds the wheel), and the ``.pth`` files in it,
such as the hook of an editable install of the checkout, are not run. (``venv
--system-site-packages`` would not do: under the project venv that ``make`` builds, the base
interpreter has none of the dependencies.) The commands run with no ``PYTHONPATH``, from the
temporary folder, with numba's cache there too, and the test checks that the ``cosparse`` they
import is the one in the fresh venv.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120  # each command; the whole test takes about 15 s here


def _declared() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    return [Requirement(r) for r in reqs]


def _constraints() -> dict[str, str]:
    """``{name: version}`` of constraints.txt's ``name==version`` lines."""
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"constraints.txt: {line!r} is not an exact pin"
            pins[req.name.lower()] = spec.version
    return pins


def test_dependencies_are_ranges_and_constraints_pin_each_inside_its_range():
    pins = _constraints()
    for req in _declared():
        ops = {s.operator for s in req.specifier}
        assert ">=" in ops and not ops & {"==", "===", "~="}, f"pyproject.toml: {req} is not a >= range"
        assert req.name.lower() in pins, f"constraints.txt pins no version of {req.name}"
        assert req.specifier.contains(pins[req.name.lower()]), \
            f"constraints.txt: {req.name}=={pins[req.name.lower()]} is outside pyproject.toml's {req}"


def test_readme_says_which_versions_are_tested():
    readme = (REPO / "README.md").read_text()
    tested = " ".join(readme[readme.index("Tested with"):][:1200].split())
    pins = _constraints()
    for name in ("torch", "numpy", "numba", "llvmlite", "pyzmq", "pyarrow", "optuna"):
        assert f"{name} {pins[name]}" in tested, f"README's 'Tested with' lacks {name} {pins[name]}"


def _run(cmd: list[str | Path], cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _dependency_folders() -> list[str]:
    """The test interpreter's site-packages folders (and its user site, where it reads one)."""
    folders = [*site.getsitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    if site.ENABLE_USER_SITE:
        folders.append(site.getusersitepackages())
    seen: list[str] = []
    for f in folders:
        if os.path.isdir(f) and os.path.realpath(f) not in map(os.path.realpath, seen):
            seen.append(f)
    return seen


def test_wheel_installs_and_runs_from_a_fresh_venv():
    # not pytest's tmp_path, which keeps the last runs' folders: this one goes whatever the outcome
    with tempfile.TemporaryDirectory(prefix="cosparse-wheel-") as tmp:
        _build_install_and_run(Path(tmp))


def _build_install_and_run(tmp_path: Path) -> None:
    # no PYTHONPATH (the checkout: pip would take its cosparse.egg-info for an installed cosparse)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NUMBA_CACHE_DIR")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # numba's kernel cache (cosparse.numba_cache)
    src, dist, venv = tmp_path / "src", tmp_path / "dist", tmp_path / "venv"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "cosparse", src / "cosparse",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc"))
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
          "--no-index", "--wheel-dir", dist, src], cwd=tmp_path, env=env)
    (wheel,) = dist.glob("cosparse-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        metadata = next(zf.read(n).decode() for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines()
                if line.startswith("Requires-Dist:")]
    assert any(r.startswith("torch") for r in requires), metadata
    pinned = [r for r in requires if {s.operator for s in Requirement(r).specifier} & {"==", "==="}]
    assert not pinned, f"the wheel pins versions: {pinned}"

    base = getattr(sys, "_base_executable", sys.executable)
    _run([base, "-m", "venv", "--without-pip", venv], cwd=tmp_path, env=env)
    python = venv / "bin" / "python"
    # installed before the .pth below exists: pip sees an empty venv, no editable install of the checkout
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps",
          "--no-index", wheel], cwd=tmp_path, env=env)
    venv_site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp_path, env=env).strip()
    (Path(venv_site) / "test-dependencies.pth").write_text("\n".join(_dependency_folders()) + "\n")
    out = _run([python, "-c", "import cosparse, cosparse.cli, importlib.metadata as m, torch; "
                "print(cosparse.__file__); print(m.version('cosparse')); print(torch.__version__)"],
               cwd=tmp_path, env=env).splitlines()
    assert Path(out[0]).resolve().is_relative_to(venv.resolve()), f"imported {out[0]}, not the wheel's"
    assert not Path(out[0]).resolve().is_relative_to(REPO)
    assert out[1] == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    help_text = _run([venv / "bin" / "cosparse", "--help"], cwd=tmp_path, env=env)
    assert help_text.startswith("usage: cosparse") and "train" in help_text and "ps" in help_text
