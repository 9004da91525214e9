"""Every rayfabric setting is a row of one table, python/rayfabric/settings.json (beside this file,
in the source tree and in the installed package): name, environment variable, side, type, bounds or
choices, default, doc. The rows of side "python" are the Python package's own settings: TABLE,
read here in one place with one parser per type. A bad value is a ValueError that names the
variable, its value and what it allows.

The rows of side "agent" are the agent's and the engine's settings (RAYFABRIC_PROVIDER,
RAYFABRIC_CHUNK_SIZE, ...): the build compiles them into the C++ table (ConfigTable(),
src/common/config.cc, by scripts/gen_config_table.py), and `rayfabric-fabric-info --settings
[--json]` lists them; `rayfabric doctor --settings` lists both sides, as `ucx_info -c` does. Each
name and variable is in one row (tests/python/test_settings.py, which also checks that the built
C++ table is the JSON's). Standard library only."""
import json
import os
from collections import namedtuple

# choices: for "choice" and "bool", ((value, what it does), ...); a bool's are ("1", on), ("0", off).
Setting = namedtuple("Setting", "name env type default doc choices")
Setting.__new__.__defaults__ = ((),)

# The types a row of side "python" may have (the ones parse() reads); the agent's are the C++ ones
# (rayfabric::SettingType: "seconds" is not one); ALL_TYPES: the JSON's, both sides'.
TYPES = ("bool", "bytes", "seconds", "choice", "text")
ALL_TYPES = ("text", "list", "bool", "int", "bytes", "bytes_or_share", "choice", "seconds")
SIDES = ("agent", "python")
JSON_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "settings.json")


def _read_rows():
    with open(JSON_PATH, encoding="utf-8") as f:
        return tuple(json.load(f)["settings"])


# Every row of settings.json, both sides, in its order (dicts as the file has them), read once.
ROWS = _read_rows()
TABLE = tuple(Setting(r["name"], r["env"], r["type"], r["default"], r["doc"],
                      tuple(tuple(c) for c in r.get("choices", ())))
              for r in ROWS if r["side"] == "python")
BY_NAME = {s.name: s for s in TABLE}

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20, "G": 1 << 30,
          "GIB": 1 << 30}


def allows(setting):
    """What `setting` allows, in words (each choice with what it does; the default said)."""
    if setting.choices:
        each = [f"{value} ({'the default: ' if value == setting.default else ''}{meaning})"
                for value, meaning in setting.choices]
        return ", ".join(each[:-1]) + " or " + each[-1]
    return {"bytes": "a size (4096, 64K, 4M, 1G)", "seconds": "seconds, >= 0",
            "text": "text"}[setting.type] + f" (default {setting.default!r})"


def parse(setting, text):
    """`text` as a value of `setting`; ValueError (naming the variable) when it is not one."""
    value = str(text).strip()
    if setting.type == "text":
        return value
    low = value.lower()
    if setting.type == "bool" and (low in _TRUE or low in _FALSE):
        return low in _TRUE
    if setting.type == "choice" and low in [v for v, _ in setting.choices]:
        return low
    if setting.type == "seconds":
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if 0 <= seconds < float("inf"):
            return seconds
    if setting.type == "bytes":
        digits = value.rstrip("BbKkMmGgIi")
        unit = value[len(digits):].upper()
        if digits.isdigit() and unit in _UNITS:
            return int(digits) * _UNITS[unit]
    raise ValueError(f"{setting.env}={text!r}: use {allows(setting)}")


def get(name, env=None):
    """The value of setting `name`, from `env` (a mapping; default: this process's environment),
    else its default."""
    setting = BY_NAME[name]
    source = os.environ if env is None else env
    raw = source.get(setting.env)
    return parse(setting, setting.default if raw is None or (raw == "" and setting.type != "text")
                 else raw)

