"""pyproject lists its packages by hand: every folder of code must be in the list, or the installed
wheel (what .ci/run and users install) lacks it while the editable checkout works."""
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_code_package_is_listed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "servesim").rglob("__init__.py")
             if "__pycache__" not in p.parts}
    assert found - listed == set(), f"add to [tool.setuptools] packages: {sorted(found - listed)}"
