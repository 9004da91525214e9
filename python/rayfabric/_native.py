"""rayfabric._fabric, the engine in this process: the compiled module next to this package (an
installed wheel), else the one meson built under bin_dir() (a source checkout)."""
import glob
import importlib.machinery
import importlib.util
import os
import sys

from rayfabric._paths import bin_dir

_MODULE = "rayfabric._fabric"


def fabric():
    """The rayfabric._fabric module; ImportError saying how to build it when there is none."""
    if _MODULE in sys.modules:
        return sys.modules[_MODULE]
    try:
        from rayfabric import _fabric  # inside an installed package
        return _fabric
    except ImportError:
        pass
    pattern = os.path.join(bin_dir(), "src", "python", "_fabric*" + importlib.machinery.EXTENSION_SUFFIXES[0])
    found = sorted(glob.glob(pattern))
    if not found:
        raise ImportError(f"rayfabric's engine module is not built: no {pattern}. Install pybind11 "
                          f"(apt-get install pybind11-dev) and rebuild (`meson setup --reconfigure build "
                          f"&& ninja -C build`), or point RAYFABRIC_BIN_DIR at a build that has it")
    spec = importlib.util.spec_from_file_location(_MODULE, found[0])
    module = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[_MODULE]
        raise
    return module
