# Sourced by scripts/dev and scripts/test: create the project's virtual environment
# once (./.venv) and keep the installed package in step with pyproject.toml.
set -euo pipefail
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
fi
stamp=.venv/.accord-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q -e ".[test]"
    touch "$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"
