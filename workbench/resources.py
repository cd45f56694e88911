"""The workbench's package data: kernel templates (``templates/<block>/*.py.j2`` with their YAML sidecars and the
shared ``_*.j2`` macros), the model cards (``models/*.yaml``, ``models/configs/``) and the Streamlit dashboard
(``dashboard/app.py`` and its pages). Found through ``importlib.resources``, so an installed workbench (``pip install
.``, not editable) reads the same files a checkout does."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from workbench.errors import WorkbenchError


def package_dir(*parts: str) -> Path:
    """The folder (or file) ``parts`` inside the installed workbench package, as a real path: Jinja's loader,
    Streamlit and the model-card reader open files by path, so a zipped install is refused with one line."""
    resource = files("workbench").joinpath(*parts)
    if not isinstance(resource, Path):
        raise WorkbenchError(f"workbench package data {'/'.join(parts)} is not on the file system ({resource!r}): "
                             "install the workbench unzipped (pip install .)")
    return resource


def templates_root() -> Path:
    return package_dir("templates")


def cards_dir() -> Path:
    return package_dir("models")


def dashboard_app() -> Path:
    return package_dir("dashboard", "app.py")
