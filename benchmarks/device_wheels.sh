#!/usr/bin/env bash
# Fills benchmarks/wheels/ (git-ignored) with the wheels that benchmarks/device_check.sh needs on
# an accelerator machine that has no package registry. Run it here, where pip can reach one:
#
#   bash benchmarks/device_wheels.sh [--python-version 3.12] [--python-version 3.11 ...]
#
# --python-version is the device's Python (`python3 --version` there); it may be given several
# times, and defaults to this machine's. Binary wheels (libcst, pyyaml) are fetched for each
# version for manylinux x86-64. jax, jaxlib, flax, optax and orbax-checkpoint are NEVER fetched:
# the device has CUDA builds of them that must not be replaced. Each wheel is fetched with
# --no-deps, so nothing pulls jax in; the versions are the ones installed here (the tested ones)
# where this Python has them.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
versions=()
while (($#)); do
  case "$1" in
    --python-version) versions+=("$2"); shift 2 ;;
    --python-version=*) versions+=("${1#*=}"); shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "device_wheels.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if ((${#versions[@]} == 0)); then
  versions=("$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')")
fi

DEST=benchmarks/wheels
rm -rf "$DEST"
mkdir -p "$DEST"

# The runtime dependencies of pyproject.toml less the preinstalled CUDA stack, the `test` extra,
# and what those need (libcst needs pyyaml; pytest needs iniconfig, packaging, pluggy, pygments;
# pytest-xdist needs execnet). pyflakes checks migrated code where the device lacks it.
PACKAGES=(libcst pyyaml pathspec tqdm pytest pytest-xdist execnet iniconfig packaging pluggy pygments pyflakes)
NEVER='^(jax|jaxlib|flax|optax|orbax-checkpoint)$'

# Any other dependency pyproject.toml declares gets fetched too, so a new one is not forgotten.
mapfile -t declared < <("$PYTHON" - <<'EOF'
import re, tomllib
project = tomllib.load(open('pyproject.toml', 'rb'))['project']
for requirement in project['dependencies'] + project.get('optional-dependencies', {}).get('test', []):
  print(re.match(r'[A-Za-z0-9_.-]+', requirement).group(0).lower().replace('_', '-'))
EOF
)
for name in "${declared[@]}"; do
  [[ $name =~ $NEVER ]] && continue
  [[ " ${PACKAGES[*]} " == *" $name "* ]] || PACKAGES+=("$name")
done

# name==version when this Python has it installed (the version the tests ran with here).
pinned() {
  local version
  version=$("$PYTHON" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1" 2>/dev/null) || true
  if [[ -n $version ]]; then echo "$1==$version"; else echo "$1"; fi
}

PLATFORMS=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$tag")
done

for name in "${PACKAGES[@]}"; do
  [[ $name =~ $NEVER ]] && { echo "device_wheels.sh: refusing to fetch $name" >&2; exit 1; }
  spec=$(pinned "$name")
  for version in "${versions[@]}"; do
    echo "fetching $spec for Python $version"
    # A pure-python wheel (py3-none-any) matches any of these platforms; a pure one is fetched
    # once for all versions since the file name is the same.
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
      --implementation cp --python-version "$version" "${PLATFORMS[@]}" -d "$DEST" "$spec"
  done
done

had_build=0; [[ -e build ]] && had_build=1
# This package itself (codemods, nnx_bridge, the `linen2nnx` console script). device_check.sh
# imports it from the tree through PYTHONPATH; the wheel is there for anyone who wants the CLI.
"$PYTHON" -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$DEST" .
((had_build)) || rm -rf build

echo
ls -l "$DEST"
total=$(du -sk "$DEST" | cut -f1)
echo "total: $((total / 1024)).$(((total % 1024) * 10 / 1024)) MiB in $(ls "$DEST" | wc -l) wheels ($DEST)"
if ((total > 60 * 1024)); then
  echo "device_wheels.sh: $DEST is over 60 MiB; the device tool carries 64 MiB in all" >&2
  exit 1
fi
