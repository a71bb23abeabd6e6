"""Python started in the checkout: kvlab's folders must not shadow PyPI packages of their names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Run with the checkout as the working directory, so sys.path[0] is the checkout ('' for -c).
_CHECK = """
import sys, sysconfig
from pathlib import Path
import kvlab
entries = [str(Path(p or ".").resolve()) for p in sys.path]
root, site = sys.argv[1], str(Path(sysconfig.get_paths()["purelib"]).resolve())
assert root in entries, "the checkout left sys.path"
assert entries.index(root) > entries.index(site), f"checkout before site-packages: {entries}"
"""


def test_importing_kvlab_puts_the_checkout_after_site_packages() -> None:
    """transformers imports the PyPI `kernels` when installed; the checkout's kernels/ must lose."""
    result = subprocess.run([sys.executable, "-c", _CHECK, str(ROOT)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
