# Sourced by scripts/*: create .venv with Python >= 3.11 and install the project.
PYTHON_BIN=${PYTHON:-}
if [ -z "$PYTHON_BIN" ]; then
  for cand in python3.13 python3.12 python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import sys; sys.exit(sys.version_info < (3, 11))" 2>/dev/null; then
      PYTHON_BIN=$cand; break
    fi
  done
fi
if [ -z "$PYTHON_BIN" ]; then echo "error: Python 3.11+ is required" >&2; exit 1; fi
if [ ! -x .venv/bin/python ]; then "$PYTHON_BIN" -m venv .venv; fi
. .venv/bin/activate
stamp=.venv/.installed-$(cat pyproject.toml | cksum | cut -d' ' -f1)
if [ ! -f "$stamp" ]; then
  echo "installing blackboard into .venv ..." >&2
  python -m pip install -q --disable-pip-version-check --upgrade pip
  python -m pip install -q --disable-pip-version-check -e ".[embedded,local,dev]"
  rm -f .venv/.installed-*; touch "$stamp"
fi
