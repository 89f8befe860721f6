#!/usr/bin/env bash
# Idempotent installer for the TorchRec peer baseline (bench/peers/torchrec_peer.py).
# Creates the venv if missing; installs only if `import torchrec` fails in it.
# Usage: bash /work/peer-install.sh            (venv at /work/peer-venv)
#        PEER_VENV=/some/dir bash /work/peer-install.sh
set -euo pipefail
VENV="${PEER_VENV:-/work/peer-venv}"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "+ $PY -m venv $VENV"
  "$PY" -m venv "$VENV"
fi
PIP="$VENV/bin/pip"

if (cd /tmp && "$VENV/bin/python" -c 'import torchrec' >/dev/null 2>&1); then
  echo "torchrec already importable in $VENV; nothing to do"
  exit 0
fi

run() { echo "+ $*"; "$@"; }

# 1) torch 2.14.1: CPU wheel index first (small); fall back to plain PyPI (CUDA build,
#    pulls ~5 GB of nvidia-* wheels, but runs fine on CPU).
if ! (cd /tmp && "$VENV/bin/python" -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.14.1")' >/dev/null 2>&1); then
  if ! run "$PIP" install --timeout 15 --retries 0 torch==2.14.1 --index-url https://download.pytorch.org/whl/cpu; then
    echo "CPU wheel index unreachable; falling back to PyPI"
    run "$PIP" install torch==2.14.1
  fi
fi
# 2) fbgemm CPU kernels + torchrec without deps (torchrec declares fbgemm-gpu, the CUDA build)
run "$PIP" install --no-deps fbgemm-gpu-cpu==1.9.0 torchrec==1.9.2
# 3) torchrec's remaining runtime deps
run "$PIP" install numpy tqdm pyre-extensions torchmetrics==1.0.3 tensordict

(cd /tmp && "$VENV/bin/python" -c 'import torch, fbgemm_gpu, torchrec; print("ok: torch", torch.__version__, "torchrec", torchrec.__version__)')
