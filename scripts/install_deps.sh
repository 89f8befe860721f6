#!/usr/bin/env bash
# Install the system libraries torusrec builds and runs against (Debian/Ubuntu).
#
# Idempotent: checks first and touches apt only when something is missing.
# Prints exactly one summary line on success; on failure prints the apt log.
set -euo pipefail

# Debian packages the Rust dependencies need:
#   libopenmpi-dev openmpi-bin  -> mpi crate (mpicc probe) and mpirun
#   libhdf5-dev                 -> hdf5-metno
#   libopenblas-dev             -> ndarray-linalg (openblas-system)
#   libclang-dev                -> bindgen in the -sys crates
#   pkg-config                  -> library discovery
#   hdf5-tools                  -> h5dump, used by tests and for inspecting outputs
#   python3-numpy python3-h5py  -> scripts/score.py, which a test holds to `predict`
PACKAGES=(libopenmpi-dev openmpi-bin libhdf5-dev libopenblas-dev libclang-dev pkg-config hdf5-tools
          python3-numpy python3-h5py)

die() { echo "install_deps: ERROR: $*" >&2; exit 1; }

# The Rust toolchain comes from rustup, not apt; we only check for it.
if ! command -v cargo >/dev/null 2>&1 && [[ -f "${CARGO_HOME:-$HOME/.cargo}/env" ]]; then
    # shellcheck disable=SC1091
    . "${CARGO_HOME:-$HOME/.cargo}/env"
fi
command -v cargo >/dev/null 2>&1 \
    || die "cargo not found on PATH; install the Rust toolchain with rustup (https://rustup.rs) first"

# Collect what is missing.
missing_pkgs=()
for pkg in "${PACKAGES[@]}"; do
    # `dpkg -s` also succeeds for removed-but-not-purged packages, so check the status.
    if ! dpkg -s "$pkg" 2>/dev/null | grep -q '^Status: install ok installed'; then
        missing_pkgs+=("$pkg")
    fi
done

check_tools() {
    local problems=()
    command -v mpirun >/dev/null 2>&1 || problems+=("mpirun")
    command -v h5dump >/dev/null 2>&1 || problems+=("h5dump")
    if ! command -v pkg-config >/dev/null 2>&1; then
        problems+=("pkg-config")
    else
        pkg-config --exists hdf5 || problems+=("pkg-config:hdf5")
        pkg-config --exists ompi || problems+=("pkg-config:ompi")
    fi
    echo "${problems[*]:-}"
}
tool_problems="$(check_tools)"

if [[ ${#missing_pkgs[@]} -eq 0 && -z "$tool_problems" ]]; then
    echo "install_deps: nothing to do; all present (${PACKAGES[*]}; mpirun, h5dump, pkg-config hdf5 ompi; $(cargo --version))"
    exit 0
fi

# Something is missing: install. If only a tool check failed, (re)install the full list.
to_install=("${missing_pkgs[@]}")
[[ ${#to_install[@]} -eq 0 ]] && to_install=("${PACKAGES[@]}")

command -v apt-get >/dev/null 2>&1 \
    || die "missing ${to_install[*]} ${tool_problems} and apt-get is not available; install them by hand"
SUDO=()
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 \
        || die "missing ${to_install[*]}; not root and sudo not found, install them by hand"
    SUDO=(sudo)
fi

log="$(mktemp -t torusrec-install-deps.XXXXXX.log)"
trap 'rm -f "$log"' EXIT
if ! { "${SUDO[@]}" apt-get update \
        && "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=300 "${to_install[@]}"; \
     } </dev/null >"$log" 2>&1; then
    cat "$log" >&2
    die "apt-get failed installing: ${to_install[*]}"
fi

tool_problems="$(check_tools)"
[[ -z "$tool_problems" ]] \
    || die "installed ${to_install[*]} but still missing: ${tool_problems}"
echo "install_deps: installed ${to_install[*]} (apt-get update + install)"
