# Sourced by scripts/gpu_check.sh, from the repository root: install_wheels DIR installs the wheels found in
# .whl/ (nvidia-cutlass, for a machine without internet) into DIR and puts DIR first on PYTHONPATH; nothing
# when there are none. Returns pip's status.
install_wheels() {
  compgen -G ".whl/*.whl" > /dev/null || return 0
  local log rc
  log=$(python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" .whl/*.whl 2>&1)
  rc=$?
  # (pip warns about every package already in DIR when it upgrades it: not worth a line each)
  printf '%s\n' "$log" | grep -v -e "^WARNING: Target" -e '^$' || true
  [ "$rc" -eq 0 ] || return "$rc"
  export PYTHONPATH="$1${PYTHONPATH:+:$PYTHONPATH}"
}
