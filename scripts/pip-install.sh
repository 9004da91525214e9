#!/usr/bin/env bash
# `pip install ARGS...` into the Python that runs Ray here ($PYTHON, else python3), as
# scripts/setup.sh and scripts/demo.sh need it. A Debian system Python outside a virtual environment
# is "externally managed" (PEP 668: pip refuses to install into it unless told so); this adds
# --break-system-packages there only, so that the same command works on Debian's python3, in a
# virtual environment and with a Python of one's own (pyenv, conda).
set -euo pipefail
PY=${PYTHON:-python3}
flags=()
if $PY - <<'PYEOF'
import os, sys, sysconfig
in_venv = sys.prefix != sys.base_prefix
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
sys.exit(0 if not in_venv and os.path.exists(marker) else 1)
PYEOF
then
  flags+=(--break-system-packages)
fi
exec $PY -m pip install "${flags[@]}" "$@"
