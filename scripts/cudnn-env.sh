# Sourced by the GPU scripts: picks the cuDNN to build and run against and exports CUDNN_ROOT
# and LD_LIBRARY_PATH. Preference: the library PyTorch itself loads (so a benchmark's cuDNN rows
# and PyTorch's run the same cuDNN build: the engine list differs between cuDNN releases), then
# the `nvidia.cudnn` wheel, then the CUDA toolkit's (CMake's default when CUDNN_ROOT is unset).
cudnn_lib_dir=$(python3 - 2>/dev/null <<'EOF'
import os
try:
    import torch
    torch.backends.cudnn.version()  # loads libcudnn
    for line in open("/proc/self/maps"):
        path = line.split()[-1]
        if os.path.basename(path).startswith("libcudnn.so"):
            print(os.path.dirname(os.path.realpath(path)))
            break
except Exception:
    pass
EOF
)
if [ -z "$cudnn_lib_dir" ]; then
  cudnn_lib_dir=$(python3 -c "import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__file__) + '/lib')" 2>/dev/null || true)
fi
CUDNN_ROOT=""
if [ -n "$cudnn_lib_dir" ] && [ -d "$cudnn_lib_dir" ]; then
  CUDNN_ROOT=$(dirname "$cudnn_lib_dir")
  export LD_LIBRARY_PATH="$cudnn_lib_dir:${LD_LIBRARY_PATH:-}"
fi
export CUDNN_ROOT
echo "cuDNN: ${CUDNN_ROOT:-toolkit default} ($(grep -hE '^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ' \
  "${CUDNN_ROOT:-/usr/local/cuda}/include/cudnn_version.h" 2>/dev/null | awk '{printf "%s.", $3}'))"
