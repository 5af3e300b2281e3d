#!/usr/bin/env bash
# Sets up specscribe from a fresh clone: system packages, a virtual environment with pinned
# dependencies, and the embedded models. Running it again only verifies.
# Environment: PYTHON (default python3.11), VENV (default .venv),
# TORCH_INDEX_URL (an extra index with CPU torch wheels, for machines without one configured).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
VENV=${VENV:-.venv}
say() { printf 'setup: %s\n' "$*"; }

# 1. System packages: ffmpeg decodes every audio container (and torchcodec links to it);
#    chromium is the real browser the web UI test drives; espeak-ng and flite speak the
#    synthetic training sentences of `specscribe distill`.
declare -A needs=([ffmpeg]=ffmpeg [chromium]=chromium [espeak-ng]=espeak-ng [flite]=flite)
missing=()
for command in "${!needs[@]}"; do
  command -v "$command" >/dev/null || missing+=("${needs[$command]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; else
    say "missing ${missing[*]} and this user cannot install them: install them, then run again"
    exit 1
  fi
  say "installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# 2. Virtual environment.
"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
  || { say "Python 3.11 is required ($PYTHON is not)"; exit 1; }
[ -x "$VENV/bin/python" ] || { say "creating $VENV"; "$PYTHON" -m venv "$VENV"; }

# 3. Dependencies, pinned by requirements.lock; skipped when nothing changed since last time.
stamp="$VENV/.specscribe-install"
want=$(cat pyproject.toml requirements.lock | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing dependencies into $VENV"
  extra=()
  [ -n "${TORCH_INDEX_URL:-}" ] && extra=(--extra-index-url "$TORCH_INDEX_URL")
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${extra[@]}" \
    -c requirements.lock -e ".[dev,bench]"
  echo "$want" >"$stamp"
else
  say "dependencies up to date"
fi

# 4. torchaudio 2.11.0 on PyPI is a CUDA build whose compiled extension fails to load with CPU
#    torch 2.13 (and makes `import torchaudio` raise). Without its .so files torchaudio falls
#    back to pure Python, which covers everything pyannote.audio uses.
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -f "$site"/torchaudio/lib/*.so
"$VENV/bin/python" -c 'import torchaudio, pyannote.audio' \
  || { say "torchaudio/pyannote.audio do not import"; exit 1; }

# 5. Embedded models: fetched, checked and converted once; verified on every later run.
"$VENV/bin/specscribe" models pull
say "done. Try: $VENV/bin/specscribe transcribe samples/"
