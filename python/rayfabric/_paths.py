"""Where rayfabric's files are: the C++ binaries (bin_dir) and the Ray release it was built
against (RAY_VERSION). Standard library only; imported by the package and its modules alike."""
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
# Inside the package (an installed wheel), else next to it (the source tree's python/).
_RAY_VERSION_FILE = next((p for p in (os.path.join(_HERE, "RAY_VERSION"), os.path.join(_HERE, "..", "RAY_VERSION"))
                          if os.path.exists(p)), None)
RAY_VERSION = open(_RAY_VERSION_FILE).read().strip() if _RAY_VERSION_FILE else "2.60.0"
# Where an installed wheel keeps the binaries (the build tree's layout: src/agent/rayfabricd, ...).
_PACKAGED_BIN_DIR = os.path.join(_HERE, "_bin")


def bin_dir():
    """Where the C++ binaries are: $RAYFABRIC_BIN_DIR (developers), else inside the installed
    package (the wheel), else the source tree's build/."""
    env = os.environ.get("RAYFABRIC_BIN_DIR")  # settings.py's bin_dir (read here: standard library only)
    if env:
        return env
    if os.path.isdir(_PACKAGED_BIN_DIR):
        return _PACKAGED_BIN_DIR
    return os.path.abspath(os.path.join(_HERE, "..", "..", "build"))
