"""The deploy file pyinfra is loading, made known to Python's ``inspect`` as a module.

pyinfra 3.10 orders each operation by the line numbers of its call stack, read for every
operation a box is given (pyinfra/api/util.py ``get_operation_order_from_stack``:
``inspect.stack()``, then ``getframeinfo`` of each frame again), and ``getframeinfo`` asks
``inspect.getmodule`` for each frame's module. pyinfra runs deploy.py with ``exec``
(pyinfra_cli/util.py ``exec_file``): no module holds its file, so ``getmodule`` went through all
of ``sys.modules`` (about 800) for its frame three times an operation, 232 times in a no-change
run of two boxes. A module naming the file, in ``sys.modules``, is found by the first of those
walks and remembered by ``inspect`` (its ``modulesbyfile``): every later frame of the file is
found at once. Nothing of pyinfra is replaced or wrapped, and the operations' order is the same
(the line numbers are read from the frames, not from the module).
"""

from __future__ import annotations

import os
import sys
import types


def known_to_inspect(path: str) -> None:
    """Register a module holding the deploy file at ``path`` (its ``__file__``, as pyinfra passed
    it), under its absolute path: a name no import statement can ask for. Once per process."""
    absolute = os.path.abspath(path)  # as inspect.getabsfile makes a frame's file absolute
    if absolute not in sys.modules:
        module = types.ModuleType(absolute, "the deploy file pyinfra runs (stages/deploy_file.py)")
        module.__file__ = absolute
        sys.modules[absolute] = module
