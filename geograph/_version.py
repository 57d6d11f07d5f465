"""The version of geograph: the ``version`` of ``pyproject.toml``, read from the installed metadata."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DISTRIBUTION", "version"]

#: the name on the package index (``pip install geograph-rag``); the import name is ``geograph``
DISTRIBUTION = "geograph-rag"


def version() -> str:
    """The installed distribution's version; in a source tree that is not installed, ``pyproject.toml``'s
    (``"0+unknown"`` when neither is found)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed(DISTRIBUTION)
    except PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    try:
        import tomllib

        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, ValueError):
        return "0+unknown"
    return str(project["version"]) if project.get("name") == DISTRIBUTION and "version" in project else "0+unknown"
