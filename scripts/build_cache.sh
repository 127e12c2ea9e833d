# Sourced by the device scripts, from the repository root, after CUDA_HOME and the wheels are set up:
# build_release JOBS LOG builds the extension in place (scripts/build.sh, log in LOG) unless .device_cache/
# (carried from an earlier call) holds a build of the same inputs, and hands a fresh build back under
# $OUT/device_cache/ for the next call to carry. The inputs' stamp covers csrc/, setup.py, scripts/build.sh,
# nvcc, Python, torch, nvidia-cutlass and WGRAD_DIAG_VARIANTS. A build takes ~90-130 s of device time
# on the H200's 16 cores; calls that only measure or test unchanged kernels skip it. Here, after a call that
# handed one back: mkdir -p .device_cache && cp FILES_AT/device_cache/* .device_cache/, then name
# .device_cache in the next call's carry.
build_stamp() {
  {
    find csrc -type f | LC_ALL=C sort | xargs cat
    cat setup.py scripts/build.sh
    "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" --version 2>/dev/null | tail -1
    python3 -c "import sys, torch, importlib.metadata as m; print(sys.version, torch.__version__, torch.version.cuda,
m.version('nvidia-cutlass'))"
    echo "diag=${WGRAD_DIAG_VARIANTS:-}"
  } | sha256sum | cut -c1-16
}
build_release() {  # JOBS LOG [CACHE_DIR (.device_cache)] [HAND_BACK_DIR ($OUT/device_cache; "-": none)]
  local stamp so cache=${3:-.device_cache} back=${4:-${OUT:-out}/device_cache}
  stamp=$(build_stamp)
  so=$(python3 -c "import sysconfig; print('_C' + sysconfig.get_config_var('EXT_SUFFIX'))")
  if [ -f "$cache/$so" ] && [ "$(cat "$cache/stamp" 2>/dev/null)" = "$stamp" ]; then
    cp "$cache/$so" python/wgrad/ && echo "build: reused $cache/$so (stamp $stamp)" | tee "$2"
    return
  fi
  MAX_JOBS=$1 ./scripts/build.sh > "$2" 2>&1 || return 1
  [ "$back" = - ] && return 0
  mkdir -p "$back" && cp "python/wgrad/$so" "$back/" && echo "$stamp" > "$back/stamp"
}
