#!/bin/sh
# Installs gpuferry (or its dependencies) into the image's virtualenv. The one install step of
# both image builds, so that they cannot drift: the local build (hack/images/gpuferry.py) runs it
# in a chroot, twice (the dependencies offline from downloaded wheels, then the gpuferry wheel
# with --no-deps), and the Containerfile runs it once (the wheel and its dependencies from PyPI).
#
# Usage: install-gpuferry.sh [--find-links DIR] [--no-deps] [--check] [--] PIP_INSTALL_ARG...
#   --find-links DIR  install offline, only from the wheels in DIR
#   --no-deps         install exactly what is named (the dependencies are already there)
#   --check           afterwards: pip check, every console script of gpuferry and every
#                     component module (python -m ...) is there, and `gpuferry --help` runs
# The virtualenv is $GPUFERRY_VENV (/opt/gpuferry), created with Debian's python3 if missing.
set -eu

venv=${GPUFERRY_VENV:-/opt/gpuferry}
# the components, each run as `python -m MODULE` (hack/images/gpuferry.py lists the same)
modules="vk peering.provider peering.consumer netfabric"

find_links=""
no_deps=""
check=""
while [ $# -gt 0 ]; do
  case $1 in
    --find-links) find_links=$2; shift 2 ;;
    --no-deps) no_deps=1; shift ;;
    --check) check=1; shift ;;
    --) shift; break ;;
    -*) echo "install-gpuferry: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done

# (the local build runs this with a clean environment; a Containerfile build may set PIP_INDEX_URL)
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi

if [ $# -gt 0 ]; then
  set -- ${no_deps:+--no-deps} "$@"
  if [ -n "$find_links" ]; then
    set -- --no-index --find-links "$find_links" "$@"
  fi
  "$venv/bin/pip" install --quiet "$@"
fi

if [ -n "$check" ]; then
  export PYTHONDONTWRITEBYTECODE=1  # looking leaves no files behind
  "$venv/bin/pip" check
  "$venv/bin/python" - "$venv" $modules <<'PY'
import importlib.metadata as md
import importlib.util
import os
import sys

venv, modules = sys.argv[1], sys.argv[2:]
dist = md.distribution("gpuferry")
scripts = [ep.name for ep in dist.entry_points if ep.group == "console_scripts"]
missing = [s for s in scripts if not os.access(os.path.join(venv, "bin", s), os.X_OK)]
missing += [f"python -m {m}" for m in modules if importlib.util.find_spec(m + ".__main__") is None]
if not scripts or missing:
    sys.exit(f"install-gpuferry: gpuferry {dist.version} lacks {missing or 'console scripts'}")
print(f"install-gpuferry: gpuferry {dist.version}: {' '.join(scripts)}; python -m {' '.join(modules)}")
PY
  "$venv/bin/gpuferry" --help >/dev/null
fi
