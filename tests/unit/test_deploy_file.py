"""stages/deploy_file.py: a file run with exec, once registered, is the module inspect finds for
its frames, from inspect's own cache (no walk through sys.modules)."""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path

from stages import deploy_file


def frame_of(path: Path) -> object:
    """A frame of the file at ``path`` run as pyinfra runs a deploy file (exec of its code)."""
    path.write_text("import sys\nframe = sys._getframe()\n")
    code = compile(path.read_text(), str(path), "exec")
    ran: dict = {"__file__": str(path)}
    exec(code, ran)
    return ran["frame"]


def test_a_registered_deploy_file_is_the_module_of_its_frames(tmp_path: Path) -> None:
    path = tmp_path / "deploy.py"
    frame = frame_of(path)
    assert inspect.getmodule(frame) is None  # as pyinfra's exec leaves it
    deploy_file.known_to_inspect(str(path))
    try:
        module = inspect.getmodule(frame)
        assert module is sys.modules[str(path)]
        assert module.__file__ == str(path)
        # Found from inspect's cache of files from now on (inspect.getmodule's first lookup).
        assert inspect.modulesbyfile[os.path.normcase(str(path))] == str(path)
    finally:
        del sys.modules[str(path)]


def test_registering_again_keeps_the_first_module(tmp_path: Path) -> None:
    path = str(tmp_path / "deploy.py")
    deploy_file.known_to_inspect(path)
    try:
        first = sys.modules[path]
        deploy_file.known_to_inspect(path)
        assert sys.modules[path] is first
    finally:
        del sys.modules[path]


def test_a_relative_name_is_registered_as_its_absolute_path(tmp_path: Path, monkeypatch) -> None:
    # pyinfra gives deploy.py by the name on its command line, relative to where it starts.
    monkeypatch.chdir(tmp_path)
    deploy_file.known_to_inspect("deploy.py")
    try:
        assert sys.modules[str(tmp_path / "deploy.py")].__file__ == str(tmp_path / "deploy.py")
    finally:
        del sys.modules[str(tmp_path / "deploy.py")]
