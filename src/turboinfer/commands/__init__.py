"""One module per subcommand. Each defines:

- ``NAME: str`` and ``HELP: str``
- ``add_arguments(parser: argparse.ArgumentParser) -> None``
- ``run(args: argparse.Namespace) -> int``

Modules are discovered here, so adding a subcommand is adding a module. Commands stay
thin: parse, call one library function, print.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def discover() -> list[ModuleType]:
    modules = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "NAME") and hasattr(module, "run"):
            modules.append(module)
    return modules
