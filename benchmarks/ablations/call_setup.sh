# Sourced by this folder's device-call scripts: OUT made absolute, the repository root as the
# working directory (R), the collective library settings every process keeps, the Triton cache
# CACHE (a folder of the root, carried into the call) relocated to where it now lies, the GPU
# and the relocation logged to $OUT/0_log.txt ($log), and SECONDS started.
set -u
OUT=$(mkdir -p "${OUT:?set OUT}" && cd "$OUT" && pwd) || exit 2
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=$PWD
export TRITON_CACHE_DIR=$R/${CACHE:?set CACHE}
log=$OUT/0_log.txt
nvidia-smi --query-gpu=name,uuid,clocks.sm,clocks.mem --format=csv > "$log" 2>&1
python3 -m benchmarks.prebuild --relocate >> "$log" 2>&1
SECONDS=0
