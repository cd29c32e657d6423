#!/bin/sh
# Bazel's Python interpreter for fedmf: the project's environment (.venv), whose absolute path
# dev.py passes in FEDMF_PYTHON (--action_env / --test_env), so no path to this machine is
# written into the repository.
if [ -z "$FEDMF_PYTHON" ]; then
  echo "python3.sh: FEDMF_PYTHON is not set; run Bazel through 'python3 dev.py bazel'" >&2
  exit 2
fi
exec "$FEDMF_PYTHON" "$@"
