import os
import platform

import pytest
import torch

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")


def pytest_benchmark_update_machine_info(config, machine_info):
    import triton

    machine_info["torch"] = torch.__version__
    machine_info["triton"] = triton.__version__
    machine_info["python"] = platform.python_version()
    if torch.cuda.is_available():
        machine_info["gpu"] = torch.cuda.get_device_name(0)
        machine_info["gpu_count"] = torch.cuda.device_count()
        machine_info["cuda"] = torch.version.cuda
        if torch.cuda.nccl.is_available([torch.zeros(1, device="cuda")]):
            machine_info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))


@pytest.fixture(scope="session")
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; none is present")
    return torch.device("cuda", 0)
