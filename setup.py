"""Lists kvlab's subpackages: each top-level folder is the subpackage `kvlab.<folder>`."""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
FOLDERS = {
    "kvcore": "kvlab",
    "kvcli": "kvlab.cli",
    "policies": "kvlab.policies",
    "sim": "kvlab.sim",
    "engine": "kvlab.engine",
    "kvkernels": "kvlab.kernels",
    "traces": "kvlab.traces",
    "metrics": "kvlab.metrics",
    "specs": "kvlab.specs",
    "fidelity": "kvlab.fidelity",
    "server": "kvlab.server",
    "kvbench": "kvlab.bench",
    "sweep": "kvlab.sweep",
    "dashboard": "kvlab.dashboard",
    "integrations": "kvlab.integrations",
    "plots": "kvlab.plots",
}


def _packages() -> tuple[list[str], dict[str, str]]:
    """Every folder with an __init__.py under the mapped top-level folders, and its source dir."""
    packages, package_dir = [], {}
    for folder, name in FOLDERS.items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT / folder)
            pkg = ".".join([name, *rel.parts])
            packages.append(pkg)
            package_dir[pkg] = str(init.parent.relative_to(ROOT))
    return packages, package_dir


PACKAGES, PACKAGE_DIR = _packages()
setup(packages=PACKAGES, package_dir=PACKAGE_DIR)
